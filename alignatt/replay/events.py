"""What a replay run records: its `ReplayEvent`s (`record/events.py`), and the retractions in them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from alignatt.record.events import ReplayEvent


@dataclass
class RunRecord:
    client: str
    events: list[ReplayEvent]
    wall_s: float
    max_lag_s: float


def count_retractions(events: list[ReplayEvent]) -> int:
    """Replies whose committed_text does not extend the last one shown for the same utterance."""
    shown: dict[Any, str] = {}
    count = 0
    for e in events:
        text = e.committed_text
        if text is None:
            continue
        # A reconnected client starts a new server session seeded with the text it showed.
        key = (e.connection, e.utterance_id)
        if not text.startswith(shown.get(key, "")):
            count += 1
        shown[key] = text
    return count
