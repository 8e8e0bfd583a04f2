"""From a finished vLLM request to its `Draft`: where its tokens end, its engine timings, and the draft
built from its tokens and fetched rows (`VllmCaptureSeam` finishes a step's requests through these)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np

from alignatt.capture.vllm.fetch import DraftState, FetchItem, PendingFetch
from alignatt.core.draft import Draft, Timings, TokenCapture
from alignatt.core.settle import SETTLED


@dataclass
class FinishedStep:
    """The requests that finished in one step, from their queued fetch to their drafts."""

    states: list[DraftState]
    trimmed: list[tuple[list[int], str]] = field(default_factory=list)  # (tokens, stop reason)
    timings: list[Timings] = field(default_factory=list)
    fetched_index: list[int] = field(default_factory=list)  # which states have rows
    prefetched: dict[int, Any] = field(default_factory=dict)  # state index -> (rows, timings) from its check
    items: list[FetchItem] = field(default_factory=list)  # the fetched states' items, for the seam's one fetch
    fetch: Optional[PendingFetch] = None  # shared with the step's settle checks: its rows `offset` onwards
    offset: int = 0
    reference: Optional[list] = None  # (rows, timings) per fetched state, reconstruct="reference"
    dropped: set[str] = field(default_factory=set)  # aborted after they finished


def trimmed(st: DraftState, stop_ids: set[int], newline_ids: set[int], fixed_length: bool) -> tuple[list[int], str]:
    """A finished request's tokens up to its first stop token (a newline too, where its prompt stops
    at one), and why it stopped (a fixed-length benchmark draft keeps them all)."""
    tokens = list(st.tokens)
    if not fixed_length:
        for i, tok in enumerate(tokens):
            if tok in stop_ids or (st.prompt.stop_at_newline and tok in newline_ids):
                return tokens[:i], "eos"
    return tokens, SETTLED if st.finish_reason == SETTLED else "max_new_tokens"


def engine_timings(st: DraftState) -> Timings:
    """prefill: submission to the first drafted token; decode: the rest (in-forward capture
    included); end to end, as the engine serves it (a batch's time is shared)."""
    first = st.first_token_at if st.first_token_at is not None else st.finished_at
    return Timings(prefill_ms=(first - st.submitted_at) * 1e3, decode_ms=(st.finished_at - first) * 1e3)


def draft_of(st: DraftState, tokens: list[int], stop_reason: str, got: Any, timings: Timings, acceptance: Any,
             tokenizer: Any, heads: list, seam: str) -> Draft:
    """A request's `Draft` from its tokens and fetched rows (`got` None: no capture, empty rows)."""
    from alignatt.capture.hf.base import _pieces

    pieces = _pieces(tokenizer, tokens)
    if got is not None:
        captures = [TokenCapture(tok, pieces[j], np.ascontiguousarray(got.rows[j]), got.other_prompt[j],
                                 got.generated[j],
                                 context_mass=None if got.context is None else got.context[j],
                                 history_mass=None if got.history is None else got.history[j])
                    for j, tok in enumerate(tokens)]
    else:
        n_src = len(st.prompt.source_token_positions)
        empty, z = np.zeros((0, n_src), dtype=np.float32), np.zeros(0, dtype=np.float32)
        captures = [TokenCapture(t, pieces[j], empty, z, z) for j, t in enumerate(tokens)]
    return Draft(
        request=st.request,
        heads=heads,
        prompt_token_count=len(st.prompt.input_ids),
        source_token_positions=list(st.prompt.source_token_positions),
        source_word_of_token=list(st.prompt.source_word_of_token),
        tokens=captures,
        stop_reason=stop_reason,
        timings=timings,
        seam=seam,
        acceptance=acceptance,
    )
