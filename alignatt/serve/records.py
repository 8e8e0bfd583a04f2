"""Server-side records kept in memory (recent steps, accepted inits), bounded in bytes.

A count bound does not bound memory: one entry can hold a 250 kB prefix. Each entry's size is
its JSON length; past the byte budget the oldest entries go first. Long texts are cut when
recorded (the length is kept beside them), so one entry never takes the whole budget.
"""

from __future__ import annotations

import collections
import json
from typing import Any, Iterator

# Longest text kept in one record field (the field's full length is recorded as `<name>_chars`).
MAX_RECORDED_CHARS = 2000


def cut_texts(entry: dict[str, Any], limit: int = MAX_RECORDED_CHARS) -> dict[str, Any]:
    """The entry with every string longer than `limit` cut, and its full length beside it."""
    out: dict[str, Any] = {}
    for key, value in entry.items():
        if isinstance(value, str) and len(value) > limit:
            out[key] = value[:limit]
            out[f"{key}_chars"] = len(value)
        else:
            out[key] = value
    return out


def entry_bytes(entry: dict[str, Any]) -> int:
    return len(json.dumps(entry, ensure_ascii=True, default=str))


class ByteBoundedLog:
    """Recent dict entries, oldest dropped first once their JSON size passes `max_bytes`."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self.dropped = 0
        self._entries: collections.deque[tuple[dict[str, Any], int]] = collections.deque()

    def append(self, entry: dict[str, Any]) -> None:
        entry = cut_texts(entry)
        size = entry_bytes(entry)
        self._entries.append((entry, size))
        self.bytes += size
        while self.bytes > self.max_bytes and self._entries:
            _, old = self._entries.popleft()
            self.bytes -= old
            self.dropped += 1

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return (e for e, _ in list(self._entries))

    def __len__(self) -> int:
        return len(self._entries)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return self._entries[i][0]
