"""`vllm_capture`'s side of `core/settle.py`: running drafts leave the engine once their rows hold the
policy's answer.

Every `settle_every` tokens (the first time at buffer + 1, the shortest draft that can hold the
answer) a settling request's rows so far are fetched by the batched fetch with its block ids left in
place, queued before the next engine step and read after it, like a finish. The scan runs on the
fetched arrays (`settle.held_index`, the session's own scan), so no `Draft` is built on the engine
thread. Once a check finds the first held token p, the request needs p + 1 + buffer tokens; when it
has them it leaves the engine, and the seam finishes it with the rows its last check read where
they cover it (the very rows the scan stopped on), else through the normal finish fetch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

from alignatt.capture.vllm.fetch import BatchFetcher, DraftState, FetchItem, PendingFetch
from alignatt.core.draft import DraftRequest, head_means
from alignatt.core.settle import SETTLED, held_index


@dataclass
class SettleCheck:
    """Settling drafts' rows so far, fetched in one step (their token counts then), read in the next."""

    states: list[DraftState]
    n_tokens: list[int]
    fetch: PendingFetch


class Settler:
    """The checks of one engine's settling requests, between its steps."""

    def __init__(self, fetcher: Optional[BatchFetcher], settle_every: int,
                 item_of: Callable[[DraftState, int], FetchItem]) -> None:
        self.fetcher, self.settle_every, self.item_of = fetcher, settle_every, item_of
        self.checks: list[SettleCheck] = []  # queued in the last step

    def first_check(self, request: DraftRequest, fixed_length: bool) -> Optional[int]:
        """When a request's rows are first read for its answer (None: no rule, no capture to read,
        or a fixed-length benchmark draft)."""
        if request.settle is None or self.fetcher is None or fixed_length:
            return None
        return request.settle.buffer_tokens + 1

    def step(self, running: dict[str, DraftState], now: float,
             leave_engine: Callable[[DraftState], None]) -> list[DraftState]:
        """Read last step's checks, take the drafts that hold their answer out of `running` (through
        `leave_engine`, cut to their length), and queue the checks that are due. Returns the
        stopped drafts, to be finished like any other."""
        checks, self.checks = self.checks, []
        for check in checks:
            rows, timings = check.fetch.result()
            for st, n, got in zip(check.states, check.n_tokens, rows):
                if running.get(st.handle) is not st:
                    continue  # finished, superseded or aborted since
                st.checked = (got, timings)
                context = head_means(got.context[:n] if got.context is not None else [None] * n)
                held = held_index(got.rows[:n], got.other_prompt[:n], got.generated[:n], context,
                                  st.prompt.source_word_of_token, st.request.committed_words, st.request.settle)
                if held is not None:
                    st.settle_length = held + 1 + st.request.settle.buffer_tokens
        stopped = []
        for st in list(running.values()):
            if st.settle_length is None or len(st.tokens) < st.settle_length:
                continue
            leave_engine(st)
            del st.tokens[st.settle_length:]
            st.finished_at, st.finish_reason = now, SETTLED
            stopped.append(running.pop(st.handle))
        due = [st for st in running.values()
               if st.check_at is not None and st.settle_length is None and len(st.tokens) >= st.check_at]
        if due:
            n_tokens = [len(st.tokens) for st in due]
            fetch = self.fetcher.enqueue([self.item_of(st, n) for st, n in zip(due, n_tokens)], running=True)
            self.checks.append(SettleCheck(due, n_tokens, fetch))
            for st, n in zip(due, n_tokens):
                st.check_at = n + self.settle_every
        return stopped

    @staticmethod
    def prefetched(st: DraftState, n_tokens: int) -> Any:
        """A stopped draft's (rows, timings) from its last check, when they cover its n tokens (None: fetch)."""
        if st.finish_reason == SETTLED and st.checked is not None and len(st.checked[0].rows) >= n_tokens:
            return st.checked[0].first(n_tokens), st.checked[1]
        return None
