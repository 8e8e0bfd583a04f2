"""Synthetic drafts with known alignments, for testing logic that consumes a `Draft`."""

from __future__ import annotations

import numpy as np

from alignatt.capture import Draft, DraftRequest, Head, TokenCapture


def make_draft(
    source_words: list[str],
    pieces: list[str],
    aligned: list[int],
    committed_words: int | None = None,
    stop_reason: str = "eos",
    tokens_per_word: int = 2,
    n_heads: int = 2,
) -> Draft:
    """A draft whose token i attends (on every head) mostly to source word `aligned[i]`."""
    request = DraftRequest(
        source_words=source_words,
        committed_words=len(source_words) if committed_words is None else committed_words,
    )
    word_of_token = [w for w in range(len(source_words)) for _ in range(tokens_per_word)]
    n_src = len(word_of_token)
    tokens = []
    for i, (piece, w) in enumerate(zip(pieces, aligned)):
        rows = np.full((n_heads, n_src), 0.1 / n_src, dtype=np.float32)
        rows[:, w * tokens_per_word] += 0.5  # the peak sits on the first token of word w
        tokens.append(
            TokenCapture(
                token_id=100 + i,
                piece=piece,
                rows=rows,
                other_prompt_mass=np.full(n_heads, 0.3, dtype=np.float32),
                generated_mass=np.full(n_heads, 0.1, dtype=np.float32),
            )
        )
    return Draft(
        request=request,
        heads=[Head(0, h) for h in range(n_heads)],
        prompt_token_count=10 + n_src,
        source_token_positions=list(range(10, 10 + n_src)),
        source_word_of_token=word_of_token,
        tokens=tokens,
        stop_reason=stop_reason,
    )
