"""The engine side of a draft scheduler: the `BatchSeam` protocol (drafts joining a running batch)
and `OneAtATime`, the batch of one around a seam that drafts one request at a time."""

from __future__ import annotations

import collections
import itertools
from typing import Any, Hashable, Protocol, runtime_checkable

from alignatt.core.draft import Draft, DraftRequest, Seam


@runtime_checkable
class BatchSeam(Protocol):
    """A seam that takes drafts into a running batch."""

    name: str
    max_batch: int

    def submit(self, request: DraftRequest) -> Hashable: ...

    # Optional: `prepare(request) -> prepared` does a draft's host work that needs no engine state
    # (prompt building, tokenising); the scheduler calls it on the submitting thread and hands the
    # result to `submit(request, prepared)`, so the engine thread, the GPU's critical path, skips it.

    def abort(self, handle: Hashable) -> None: ...

    # A seam that takes submits at its next step (`ProcessBatchSeam`) returns from it the requests it
    # refused, each with its exception in place of a draft: such a request fails alone.
    def step(self) -> list[tuple[Hashable, Draft]]: ...

    def has_unfinished(self) -> bool: ...

    def close(self) -> None: ...


class OneAtATime:
    """A `BatchSeam` over a seam that drafts one request at a time (the HF seams): each step runs
    the oldest submitted draft to completion. A running draft cannot be aborted; its result is
    simply not delivered."""

    max_batch = 1

    def __init__(self, seam: Seam) -> None:
        self.seam = seam
        self.name = seam.name
        self._queue: collections.OrderedDict[int, DraftRequest] = collections.OrderedDict()
        self._ids = itertools.count()

    def submit(self, request: DraftRequest) -> int:
        handle = next(self._ids)
        self._queue[handle] = request
        return handle

    def abort(self, handle: Hashable) -> None:
        self._queue.pop(handle, None)  # type: ignore[arg-type]

    def has_unfinished(self) -> bool:
        return bool(self._queue)

    def step(self) -> list[tuple[Hashable, Draft]]:
        if not self._queue:
            return []
        handle, request = self._queue.popitem(last=False)
        return [(handle, self.seam.draft(request))]

    def close(self) -> None:
        self.seam.close()


def as_batch_seam(seam: Any) -> BatchSeam:
    """The seam itself when it batches (submit/step/abort), else a batch of one around it."""
    if all(callable(getattr(seam, m, None)) for m in ("submit", "step", "abort", "has_unfinished")):
        return seam
    return OneAtATime(seam)
