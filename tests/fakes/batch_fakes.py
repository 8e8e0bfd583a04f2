"""A stand-in batch seam for scheduler tests: FakeSeam's drafts, delivered through submit/step/abort.

Every step advances each request in the engine by one token; a request finishes after
`steps_for(request)` steps (default: its draft's token count, at least one). `gate` (a semaphore),
when given, is acquired once per step, so a test decides exactly when the engine moves.
"""

from __future__ import annotations

import itertools
import threading
import time

from alignatt.core.draft import DraftRequest
from tests.fakes.mt_fakes import FakeSeam


class StandInBatchSeam:
    name = "fake_batch"

    def __init__(self, max_batch: int = 8, steps_for=None, step_s: float = 0.0, gate: threading.Semaphore | None = None,
                 fail_step_when=None) -> None:
        self.max_batch = max_batch
        self.inner = FakeSeam()
        self.steps_for = steps_for or (lambda r: 2)
        self.step_s = step_s
        self.gate = gate
        self.fail_step_when = fail_step_when  # callable(step index) -> bool
        self._ids = itertools.count()
        self.running: dict[int, list] = {}  # handle -> [request, steps left]
        self.submitted: list[tuple[int, DraftRequest]] = []
        self.aborted: list[int] = []
        self.batches: list[list[int]] = []  # handles in the engine at each step
        self.threads: set[str] = set()
        self.closed_on: str | None = None
        self.steps = 0

    def submit(self, request: DraftRequest) -> int:
        self.threads.add(threading.current_thread().name)
        handle = next(self._ids)
        self.running[handle] = [request, max(int(self.steps_for(request)), 1)]
        self.submitted.append((handle, request))
        return handle

    def abort(self, handle: int) -> None:
        if self.running.pop(handle, None) is not None:
            self.aborted.append(handle)

    def has_unfinished(self) -> bool:
        return bool(self.running)

    def step(self):
        self.threads.add(threading.current_thread().name)
        if self.gate is not None:
            self.gate.acquire()
        if self.step_s:
            time.sleep(self.step_s)
        index = self.steps
        self.steps += 1
        self.batches.append(sorted(self.running))
        if self.fail_step_when is not None and self.fail_step_when(index):
            raise RuntimeError("stand-in engine step failed")
        done = []
        for handle, entry in list(self.running.items()):
            entry[1] -= 1
            if entry[1] <= 0:
                del self.running[handle]
                done.append((handle, self.inner.draft(entry[0])))
        return done

    def close(self) -> None:
        self.closed_on = threading.current_thread().name


class PreparingBatchSeam(StandInBatchSeam):
    """A stand-in with vllm_capture's `prepare`: the prompt (here the request's words, upper-cased)
    is built by `prepare` and must reach `submit`; where each ran is recorded."""

    def __init__(self, fail_prepare_when=None, **kwargs) -> None:
        super().__init__(**kwargs)
        self.prepared_on: list[str] = []
        self.submitted_prompts: list[object] = []
        self.fail_prepare_when = fail_prepare_when

    def prepare(self, request: DraftRequest):
        self.prepared_on.append(threading.current_thread().name)
        if self.fail_prepare_when is not None and self.fail_prepare_when(request):
            raise ValueError("prompt too long for the engine")
        return tuple(w.upper() for w in request.source_words)

    def submit(self, request: DraftRequest, prompt=None) -> int:
        self.submitted_prompts.append(prompt)
        return super().submit(request)
