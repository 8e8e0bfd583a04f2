"""Stop drafting once the policy's answer is known: the draft's first held token and a buffer.

AlignAtt's scan stops at the first drafted token that looks at the unstable tail or the border
(or leaks context), and that verdict depends on the token alone (`policy.scan_stop`). So once a
draft holds its first held token p, the committed text of this update is decided: more tokens
only lengthen the held text the client sees as its buffer. A `SettleRule` (on the request) keeps
p + 1 + `buffer_tokens` tokens; a seam that can read rows while it drafts (`vllm_capture`) stops
there and saves the rest of the decode steps, and `cut` gives every seam's draft the same length.

What a settled draft changes for the client is only the buffer: the emitted part of `decide` is
the same as on the whole draft (its word cut, hold-back and minimum look only at tokens up to
p). A later update that only moves the frontier may re-judge a settled draft past its end, where
the whole draft had more tokens to judge: `passes_end` tells the session to draft again then.
"""

from __future__ import annotations

import functools
from dataclasses import replace
from typing import Sequence

import numpy as np

from alignatt.core.draft import Draft, SettleRule, aligned_words, mass_split
from alignatt.core.policy import PolicyConfig, scan_stop, share_of_context

SETTLED = "settled"  # Draft.stop_reason of a draft cut once its answer was known


def rule_for(policy: PolicyConfig, buffer_tokens: int | None) -> SettleRule | None:
    """The request's rule for a policy (None: `buffer_tokens` None, draft to max_new_tokens)."""
    if buffer_tokens is None:
        return None
    return SettleRule(policy.border_words, policy.max_context_share, buffer_tokens)


def held_index(rows: np.ndarray, other_prompt: np.ndarray, generated: np.ndarray, context_mean: np.ndarray,
               source_word_of_token: Sequence[int], committed_words: int, rule: SettleRule) -> int | None:
    """The first held token of a draft given as arrays (rows [T, H, S], masses [T, H], the context
    block's head-mean mass [T]): what a seam scans while the draft runs, with no `Draft` built. The
    same numbers as `decide`'s scan (its alignment, `mass_split`, `Draft.block_mass`), so both stop
    at the same token."""
    if not len(rows):
        return None
    aligned = [int(w) for w in aligned_words(rows, source_word_of_token)]
    share = share_of_context(mass_split(rows, other_prompt, generated, source_word_of_token, committed_words),
                             context_mean)
    stop = scan_stop(aligned, share, committed_words, _scan_config(rule.border_words, rule.max_context_share))
    return None if stop is None else stop[0]


def held_indices(rows: np.ndarray, other_prompt: np.ndarray, generated: np.ndarray, context: np.ndarray,
                 n_tokens: Sequence[int], word_of_column: np.ndarray, committed_words: Sequence[int],
                 border_words: Sequence[int], max_context_share: Sequence[float]) -> list[int | None]:
    """`held_index` of a whole batch of drafts in one pass of array operations (a seam's check of
    every running request due in a step, on the engine's thread: no loop over requests).

    rows [R, T, H, S] are padded with zero columns past each draft's source and with tokens past its
    `n_tokens`; masses [R, T, H], `context` the per-head context-block mass (0: no block);
    `word_of_column` [R, S] each source column's word (-1: padding). The same alignment (head-mean
    argmax), context share and scan as `held_index`; the source mass is summed in another order, so
    a share may differ from `held_index`'s in its last float32 bit."""
    R, T = rows.shape[:2]
    if R == 0:
        return []
    n = np.asarray(n_tokens)[:, None]
    committed = np.asarray(committed_words)[:, None]
    column = rows.mean(axis=2).argmax(axis=-1)  # [R, T]: pad columns are 0, never above a real maximum
    aligned = np.take_along_axis(word_of_column, column, axis=1)
    # the share's source mass is all of the source, committed or not (`mass_split`'s first two columns)
    source, ctx = rows.sum(axis=-1).mean(axis=-1), context.mean(axis=-1)
    share = np.divide(ctx, source + ctx, out=np.zeros(ctx.shape), where=(source + ctx) > 0)
    trusted = committed - np.asarray(border_words)[:, None]  # a tail word is past the border too
    stop = (share > np.asarray(max_context_share)[:, None]) | (aligned >= trusted)
    stop &= (np.arange(T)[None] < n) & (word_of_column.max(axis=1) >= 0)[:, None]  # no source: no verdict
    first = stop.argmax(axis=1)
    return [int(f) if any_ else None for f, any_ in zip(first, stop.any(axis=1))]


@functools.lru_cache(maxsize=64)
def _scan_config(border_words: int, max_context_share: float) -> PolicyConfig:
    """The policy fields a scan reads, validated once per rule (not once per scan)."""
    return PolicyConfig(border_words=border_words, max_context_share=max_context_share)


def _scan(draft: Draft, committed_words: int, rule: SettleRule) -> int | None:
    # once per frontier and rule: an update's plan and apply both ask (`passes_end`, `cut`)
    return draft.memo(("held", committed_words, rule), lambda: held_index(
        *draft.stacked(), draft.block_mass("context"), draft.source_word_of_token, committed_words, rule))


def first_held(draft: Draft, rule: SettleRule | None = None) -> int | None:
    """The index of the draft's first held token at its request's frontier (None: every token so
    far passed, the draft is a final, or there is no rule). Later tokens cannot change it."""
    rule = rule or draft.request.settle
    if rule is None or draft.request.final or not draft.tokens:
        return None
    return _scan(draft, draft.request.committed_words, rule)


def settled_length(draft: Draft, rule: SettleRule | None = None) -> int | None:
    """How many of the draft's tokens the answer needs (first held token + buffer), once it holds
    them all; None while it does not (no held token yet, or the buffer is not drafted yet)."""
    rule = rule or draft.request.settle
    held = first_held(draft, rule)
    if held is None:
        return None
    need = held + 1 + rule.buffer_tokens
    return need if len(draft.tokens) >= need else None


def cut(draft: Draft) -> Draft:
    """The draft as its request's rule settles it: cut to `settled_length` with stop reason
    `settled`, or unchanged (no rule, not settled, or nothing past that length: a draft that ended
    there by itself keeps its own stop reason, as the engine's would). Idempotent."""
    n = settled_length(draft)
    if n is None or n == len(draft.tokens):
        return draft
    return replace(draft, tokens=draft.tokens[:n], stop_reason=SETTLED)


def passes_end(draft: Draft, committed_words: int) -> bool:
    """A settled draft whose scan at this frontier finds no held token: the whole draft would go on
    where this one ends, so re-judging it would release less than a new draft."""
    rule = draft.request.settle
    if draft.stop_reason != SETTLED or rule is None:
        return False
    return _scan(draft, committed_words, rule) is None
