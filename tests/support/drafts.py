"""Synthetic drafts with known alignments, for testing logic that consumes a `Draft`."""

from __future__ import annotations

import numpy as np

from alignatt.core.draft import Draft, DraftRequest, Head, TokenCapture


def peaked_token(token_id: int, piece: str, n_heads: int, n_src: int, peak_at: int, base: float,
                 peak: float, other: float, generated: float) -> TokenCapture:
    """A token whose every head spreads `base` evenly over the source and adds `peak` at one position."""
    rows = np.full((n_heads, n_src), base / n_src, dtype=np.float32)
    rows[:, peak_at] += peak
    return TokenCapture(token_id=token_id, piece=piece, rows=rows,
                        other_prompt_mass=np.full(n_heads, other, dtype=np.float32),
                        generated_mass=np.full(n_heads, generated, dtype=np.float32))


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
    # the peak sits on the first token of word w
    tokens = [peaked_token(100 + i, piece, n_heads, n_src, w * tokens_per_word, 0.1, 0.5, 0.3, 0.1)
              for i, (piece, w) in enumerate(zip(pieces, aligned))]
    return Draft(
        request=request,
        heads=[Head(0, h) for h in range(n_heads)],
        prompt_token_count=10 + n_src,
        source_token_positions=list(range(10, 10 + n_src)),
        source_word_of_token=word_of_token,
        tokens=tokens,
        stop_reason=stop_reason,
    )
