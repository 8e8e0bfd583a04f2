"""`vllm_capture`'s side of `core/settle.py`: running drafts leave the engine once their rows hold the
policy's answer.

Every `settle_every` tokens (the first time at buffer + 1, the shortest draft that can hold the
answer) a settling request's rows so far are read while it runs. The seam queues these checks in
the same batched fetch as the step's finished requests (one pack of indices and one launch of the
kernels per step, `VllmCaptureSeam._queue_fetch`), with their block ids left in place; they are read
after the next step. The scan runs on the fetched batch in one pass (`settle.held_indices`, the
session's own scan on arrays), so no `Draft` is built and no request is scanned alone on the engine
thread; only a settled draft's rows are unpacked. Once a check finds the first held token p, the
request needs p + 1 + buffer tokens; when it has them it leaves the engine (the step's settled
drafts in one abort), and the seam finishes it with the rows its last check read where they cover
it (the very rows the scan stopped on), else through the normal finish fetch.

The time of each part is summed in `phases` (the seam's `step_phases_s`): waiting for the last
step's checks, scanning them, and stopping the settled drafts (and picking the checks now due).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np

from alignatt.capture.vllm.batched import MASSES
from alignatt.capture.vllm.fetch import BatchFetcher, DraftState, FetchedRows, FetchTimings, PendingFetch
from alignatt.core.draft import DraftRequest
from alignatt.core.settle import SETTLED, held_indices


# The parts of `Settler.step`, timed: waiting for the last step's checks to reach the host, scanning
# them, and stopping the settled drafts (and picking the checks now due).
SETTLE_PHASES = ("check_wait", "check_scan", "stop")


@dataclass
class SettleCheck:
    """Settling drafts' rows so far, fetched in one step (their token counts then), read in the next:
    the first rows of a fetch the step's finished requests may share."""

    states: list[DraftState]
    n_tokens: list[int]
    fetch: PendingFetch


class Settler:
    """The checks of one engine's settling requests, between its steps."""

    def __init__(self, fetcher: Optional[BatchFetcher], settle_every: int,
                 phases: Optional[dict[str, float]] = None) -> None:
        self.fetcher, self.settle_every = fetcher, settle_every
        self.checks: list[SettleCheck] = []  # queued in the last step
        self.phases = phases if phases is not None else {}
        for name in SETTLE_PHASES:
            self.phases.setdefault(name, 0.0)

    def first_check(self, request: DraftRequest, fixed_length: bool) -> Optional[int]:
        """When a request's rows are first read for its answer (None: no rule, no capture to read,
        or a fixed-length benchmark draft)."""
        if request.settle is None or self.fetcher is None or fixed_length:
            return None
        return request.settle.buffer_tokens + 1

    def step(self, running: dict[str, DraftState], now: float,
             leave_engine: Callable[[list[DraftState]], None]) -> tuple[list[DraftState], list[DraftState]]:
        """Read last step's checks, take the drafts that hold their answer out of `running` (all in
        one `leave_engine`, cut to their length), and pick the checks now due. Returns the stopped
        drafts, to be finished like any other, and the running drafts due a check: the caller puts
        them first in this step's fetch and hands both to `queued`."""
        started = time.perf_counter()
        checks, self.checks = self.checks, []
        waited = 0.0
        for check in checks:
            wait_started = time.perf_counter()
            check.fetch.wait()
            waited += time.perf_counter() - wait_started
            self._read(check, running)
        read = time.perf_counter()
        self.phases["check_wait"] += waited
        self.phases["check_scan"] += read - started - waited  # the wait is check_wait's, not the scan's
        stopped = [st for st in running.values()
                   if st.settle_length is not None and len(st.tokens) >= st.settle_length]
        if stopped:
            leave_engine(stopped)
        for st in stopped:
            del st.tokens[st.settle_length:]
            st.finished_at, st.finish_reason = now, SETTLED
            del running[st.handle]
        due = [st for st in running.values()
               if st.check_at is not None and st.settle_length is None and len(st.tokens) >= st.check_at]
        self.phases["stop"] += time.perf_counter() - read
        return stopped, due

    def queued(self, due: list[DraftState], fetch: PendingFetch) -> None:
        """The drafts `step` found due are the first rows of `fetch`: read them after the next step."""
        if not due:
            return
        n_tokens = [it.n_tokens for it in fetch.items[:len(due)]]
        self.checks.append(SettleCheck(due, n_tokens, fetch))
        for st, n in zip(due, n_tokens):
            st.check_at = n + self.settle_every

    @staticmethod
    def _read(check: SettleCheck, running: dict[str, DraftState]) -> None:
        """Scan a check's rows, all its requests in one pass (`settle.held_indices` on the fetched
        batch), and give each request still running its settled length once it has an answer."""
        live = [i for i, st in enumerate(check.states) if running.get(st.handle) is st]  # not finished since
        if not live:
            return
        packed = check.fetch.wait()
        packed = packed[:len(live)] if len(live) == len(check.states) else packed[live]
        states = [check.states[i] for i in live]
        S = packed.shape[-1] - len(MASSES)
        words = np.full((len(states), S), -1, np.int64)
        for r, st in enumerate(states):
            source_words = st.prompt_arrays()[3]
            words[r, : len(source_words)] = source_words
        at = {name: S + k for k, name in enumerate(MASSES)}
        held = held_indices(packed[..., :S], packed[..., at["other_prompt"]], packed[..., at["generated"]],
                            packed[..., at["context"]], [check.n_tokens[i] for i in live], words,
                            [st.request.committed_words for st in states],
                            [st.request.settle.border_words for st in states],
                            [st.request.settle.max_context_share for st in states])
        for i, st, h in zip(live, states, held):
            st.checked = (check.fetch, i)
            if h is not None:
                st.settle_length = h + 1 + st.request.settle.buffer_tokens

    @staticmethod
    def prefetched(st: DraftState, n_tokens: int) -> Optional[tuple[FetchedRows, FetchTimings]]:
        """A stopped draft's (rows, timings) from its last check, when they cover its n tokens (None: fetch)."""
        if st.finish_reason != SETTLED or st.checked is None:
            return None
        fetch, i = st.checked
        if fetch.items[i].n_tokens < n_tokens:
            return None
        return fetch.row(i).first(n_tokens), fetch.timings()
