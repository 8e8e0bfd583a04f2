"""What every capture seam returns, and the one softmax that rebuilds an attention row.

A *seam* drafts a greedy continuation of a translation prompt and, for every drafted token,
captures the attention of a few alignment heads over the source token positions. The three seams
(`hf_eager`, `hf_qk_fast`, `vllm_capture`) return the same `Draft`, so the policy, the server and
the benchmark never care which one ran.

Rows cover *all* source tokens (committed and unstable tail alike): which of them are accessible
is decided later from the frontier, so a commit that only moves the frontier can be re-judged on
the cached rows without running the model again (the server's fast path).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Hashable, Protocol, Sequence

import numpy as np

# The mass split reported per token and head, in this order.
MASS_KEYS = ("accessible", "inaccessible", "other_prompt", "generated")


@dataclass(frozen=True)
class Head:
    layer: int
    head: int


@dataclass(frozen=True)
class DraftProposal:
    """Tokens a seam may verify instead of decoding them one by one (greedy speculative decoding).

    They are the session's previous draft beyond what it accepted, and they continue
    `target_prefix` (the accepted target text then, which must be the request's prefix now). A
    proposal is only ever a guess: a seam keeps proposed token i only where the model's own
    greedy argmax at that position, on *this* request's prompt, is token i, so the draft's tokens
    are the from-scratch draft's whatever the proposal holds.
    """

    token_ids: tuple[int, ...]
    target_prefix: str

    def __post_init__(self) -> None:
        if not self.token_ids:
            raise ValueError("an empty proposal: give no proposal instead")


@dataclass(frozen=True)
class SettleRule:
    """Stop drafting once the policy's answer is known (`alignatt.core.settle`).

    The attention scan's settings (`PolicyConfig.border_words`, `max_context_share`) at the
    request's frontier, and how many tokens past the first held one to draft for the client's
    buffer. A seam may stop as soon as its draft holds them; whoever applies the draft cuts it
    to the same length, so every seam shows the same text."""

    border_words: int
    max_context_share: float
    buffer_tokens: int

    def __post_init__(self) -> None:
        if self.buffer_tokens < 0:
            raise ValueError("buffer_tokens must be >= 0")


@dataclass
class DraftRequest:
    """One draft: the whole known source (committed words first, then the unstable tail)."""

    source_words: list[str]
    committed_words: int  # words [0, committed_words) are committed; the rest is the unstable tail
    target_prefix: str = ""  # accepted target text, continued as the assistant turn
    max_new_tokens: int = 20
    source_lang: str = "en"
    target_lang: str = "de"
    # Outside the source region of the prompt: a glossary/background block and earlier turns
    # ([source, target] pairs, oldest first). Attention on them is neither source nor target.
    context_text: str = ""
    history: list[tuple[str, str]] = field(default_factory=list)
    proposal: DraftProposal | None = None  # the previous draft's tokens to verify (None: from scratch)
    # An utterance's closing draft: a scheduler runs it in order and never supersedes it. Seams ignore it.
    final: bool = False
    settle: SettleRule | None = None  # stop once the policy's answer is known (None: max_new_tokens)

    def __post_init__(self) -> None:
        if not self.source_words or not any(w.strip() for w in self.source_words):
            raise ValueError("empty source: give at least one source word")
        if not 0 <= self.committed_words <= len(self.source_words):
            raise ValueError(
                f"committed_words={self.committed_words} outside 0..{len(self.source_words)}"
            )
        if self.max_new_tokens < 1:
            raise ValueError("max_new_tokens must be >= 1")
        if self.settle is not None and self.final:
            raise ValueError("a final is never settled early: it runs to its end")
        if self.proposal is not None and self.proposal.target_prefix != self.target_prefix:
            raise ValueError("the proposal continues another target prefix than this request's")

    def proposed_tokens(self) -> list[int]:
        """The proposal a seam verifies: at most `max_new_tokens - 1` tokens, since the verifying
        forward also yields the model's own token after the last one it keeps."""
        if self.proposal is None:
            return []
        return list(self.proposal.token_ids[: self.max_new_tokens - 1])


@dataclass
class Timings:
    """Milliseconds, one definition for every seam (see `per_token_ms`)."""

    prefill_ms: float = 0.0  # prompt forward up to the first drafted token's logits
    decode_ms: float = 0.0  # every later forward step (includes in-forward capture hooks)
    capture_ms: float = 0.0  # copying captured q/k (or weights) out of the engine, after a step
    reconstruct_ms: float = 0.0  # rebuilding rows + mass split from the captured tensors

    @property
    def total_ms(self) -> float:
        return self.prefill_ms + self.decode_ms + self.capture_ms + self.reconstruct_ms

    def per_token_ms(self, generated_tokens: int) -> float:
        """End-to-end wall time of the draft (prefill included) divided by drafted tokens."""
        return self.total_ms / max(generated_tokens, 1)


@dataclass
class Acceptance:
    """How a draft was obtained: what a verifying forward kept and what was decoded after it.

    A from-scratch draft proposes nothing: its first forward is the prefill. `decoded` counts the
    tokens that cost one sequential forward step each (every token after the first forward's).
    """

    proposed: int = 0  # proposal tokens scored by the first forward
    accepted: int = 0  # of them, the agreeing prefix kept
    decoded: int = 0  # drafted tokens produced by one-token steps after the first forward
    forward_steps: int = 0  # forward passes the draft ran (first forward included)
    verify_ms: float = 0.0  # the first forward (prefill + verification of the proposal)
    extend_ms: float = 0.0  # every step after it

    def as_dict(self) -> dict[str, float | int]:
        return {"proposed": self.proposed, "accepted": self.accepted, "decoded": self.decoded,
                "forward_steps": self.forward_steps, "verify_ms": round(self.verify_ms, 3),
                "extend_ms": round(self.extend_ms, 3)}


ACCEPTANCE_COUNTS = ("proposed", "accepted", "decoded", "forward_steps", "verify_ms", "extend_ms")


def add_acceptance(totals: dict[str, float], a: Acceptance, n_tokens: int) -> None:
    """Add one finished draft to running totals (a seam's `acceptance_totals()`)."""
    totals["drafts"] = totals.get("drafts", 0) + 1
    totals["tokens"] = totals.get("tokens", 0) + n_tokens
    for k in ACCEPTANCE_COUNTS:
        totals[k] = totals.get(k, 0) + getattr(a, k)


def acceptance_level(before: dict[str, float], after: dict[str, float]) -> dict[str, float | int | None]:
    """Per-draft figures between two snapshots of a seam's totals (a load level's verification)."""
    d = {k: after.get(k, 0) - before.get(k, 0) for k in ("drafts", "tokens", *ACCEPTANCE_COUNTS)}
    n = d["drafts"]

    def per(key: str, by: float) -> float | None:
        return round(d[key] / by, 3) if by else None

    return {"drafts": int(n), "proposed": int(d["proposed"]), "accepted": int(d["accepted"]),
            "acceptance_rate": per("accepted", d["proposed"]), "tokens_per_draft": per("tokens", n),
            "decoded_tokens_per_update": per("decoded", n), "forward_steps_per_draft": per("forward_steps", n),
            "verify_ms_mean": per("verify_ms", n), "extend_ms_mean": per("extend_ms", n)}


def accept_proposal(scored: Sequence[int], proposal: Sequence[int], max_new_tokens: int,
                    is_stop) -> tuple[list[int], bool]:
    """Greedy acceptance: the tokens a from-scratch draft would draft from the verifying forward.

    `scored[i]` is the model's argmax at the position that decides drafted token i (the prompt's
    last position for i = 0, the proposal's token i-1 after it), for i in 0..len(proposal).
    Returns (drafted tokens, stopped): proposal tokens are kept while they equal the argmax; the
    argmax at the first disagreement (or after the whole proposal) is the model's own next token.
    `stopped` says the argmax hit a stop token (the draft ends by itself, "eos").
    """
    drafted: list[int] = []
    for i, token in enumerate(scored[: len(proposal) + 1]):
        if is_stop(token):
            return drafted, True
        drafted.append(int(token))
        if len(drafted) >= max_new_tokens or i >= len(proposal) or token != proposal[i]:
            break
    return drafted, False


def agreeing_prefix(drafted: Sequence[int], proposal: Sequence[int]) -> int:
    """How many leading drafted tokens equal the proposal's (the accepted count)."""
    n = 0
    for a, b in zip(drafted, proposal):
        if a != b:
            break
        n += 1
    return n


_DERIVED = "_derived_values"  # a Draft's cache of what its tokens give (never pickled)


@dataclass
class TokenCapture:
    """One drafted token and what the selected heads looked at when it was produced."""

    token_id: int
    piece: str  # the token's text as decoded within the draft (leading space kept)
    rows: np.ndarray  # float32 [n_heads, n_source_tokens]: attention over source token positions
    other_prompt_mass: np.ndarray  # float32 [n_heads]: mass on non-source prompt tokens
    generated_mass: np.ndarray  # float32 [n_heads]: mass on target prefix + drafted tokens
    # Parts of other_prompt_mass: the context block and the history turns (None: no such block).
    context_mass: np.ndarray | None = None  # float32 [n_heads]
    history_mass: np.ndarray | None = None  # float32 [n_heads]

    def mass(self, source_word_of_token: Sequence[int], committed_words: int) -> dict[str, float]:
        """Head-averaged mass split for a frontier of `committed_words` source words."""
        split = mass_split(self.rows[None], self.other_prompt_mass[None], self.generated_mass[None],
                           source_word_of_token, committed_words)[0]
        return {k: float(v) for k, v in zip(MASS_KEYS, split)}


@dataclass
class Draft:
    request: DraftRequest
    heads: list[Head]
    prompt_token_count: int
    source_token_positions: list[int]  # absolute prompt positions of the source tokens, ascending
    source_word_of_token: list[int]  # for each source token, the index of its source word
    tokens: list[TokenCapture]
    stop_reason: str  # "eos" | "max_new_tokens" | "settled" (cut once the policy's answer was known)
    timings: Timings = field(default_factory=Timings)
    seam: str = ""
    acceptance: Acceptance = field(default_factory=Acceptance)

    @property
    def text(self) -> str:
        return "".join(t.piece for t in self.tokens)

    # Pickled (an engine process sends its drafts to the server) with each per-token array stacked
    # over the draft: one array per kind, instead of five small arrays per token (each pickled on its
    # own), about half the time to send and a quarter to receive.
    def __getstate__(self) -> dict:
        state = {k: v for k, v in self.__dict__.items() if k != _DERIVED}
        tokens = state.pop("tokens")
        state["tokens_stacked"] = _stack_tokens(tokens) if tokens else None
        if state["tokens_stacked"] is None:
            state["tokens"] = tokens
        return state

    def __setstate__(self, state: dict) -> None:
        stacked = state.pop("tokens_stacked", None)
        self.__dict__.update(state)
        if stacked is not None:
            self.tokens = _unstack_tokens(*stacked)
            arrays = tuple(stacked[2][:3])
            if all(a is not None for a in arrays):
                self._derived()["stacked"] = arrays  # the arrays the tokens are views of

    def aligned_word(self, i: int) -> int:
        """Source word that drafted token i attends to most (head-averaged argmax)."""
        return int(self.aligned_words()[i])

    def _derived(self) -> dict:
        """What this draft's tokens give (stacked arrays, block masses, scans), computed once: the
        server's event loop judges one draft several times per update. Keyed to the tokens list
        (a draft's tokens are replaced, never edited: `dataclasses.replace` starts a new draft)."""
        derived = self.__dict__.get(_DERIVED)
        if derived is None or derived["tokens"] is not self.tokens:
            derived = {"tokens": self.tokens}
            self.__dict__[_DERIVED] = derived
        return derived

    def stacked(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """rows [T, H, S], other-prompt mass [T, H], generated mass [T, H]."""
        if not self.tokens:
            n_src = len(self.source_word_of_token)
            return np.zeros((0, 0, n_src)), np.zeros((0, 0)), np.zeros((0, 0))
        derived = self._derived()
        if "stacked" not in derived:
            derived["stacked"] = (np.stack([t.rows for t in self.tokens]),
                                  np.stack([t.other_prompt_mass for t in self.tokens]),
                                  np.stack([t.generated_mass for t in self.tokens]))
        return derived["stacked"]

    def aligned_words(self) -> np.ndarray:
        """For every drafted token, the source word its heads attend to most (head-averaged)."""
        return aligned_words(self.stacked()[0], self.source_word_of_token)

    def mass_split(self, committed_words: int) -> np.ndarray:
        """[T, 4] head-averaged mass per token, in `MASS_KEYS` order, for this frontier."""
        return mass_split(*self.stacked(), self.source_word_of_token, committed_words)

    def block_mass(self, block: str) -> np.ndarray:
        """[T] head-averaged mass on the `context` or `history` block (0 where there is none)."""
        derived = self._derived()
        key = f"{block}_mass"
        if key not in derived:
            derived[key] = head_means([getattr(t, key) for t in self.tokens])
        return derived[key]

    def memo(self, key: Hashable, compute: Callable[[], Any]) -> Any:
        """`compute()` once per key for this draft's tokens (a judgement that depends on them alone)."""
        derived = self._derived()
        if key not in derived:
            derived[key] = compute()
        return derived[key]


_TOKEN_ARRAYS = ("rows", "other_prompt_mass", "generated_mass", "context_mass", "history_mass")


def _stack_tokens(tokens: Sequence[TokenCapture]) -> tuple | None:
    """(ids, pieces, one array per `_TOKEN_ARRAYS` kind, or None where no token has it); None when
    the tokens' arrays differ in shape or some have a kind the others lack (pickled one by one)."""
    arrays = []
    for name in _TOKEN_ARRAYS:
        values = [getattr(t, name) for t in tokens]
        if all(v is None for v in values):
            arrays.append(None)
            continue
        if any(v is None for v in values) or len({(np.shape(v), np.asarray(v).dtype) for v in values}) > 1:
            return None
        arrays.append(np.stack(values))
    return [t.token_id for t in tokens], [t.piece for t in tokens], arrays


def _unstack_tokens(ids: list[int], pieces: list[str], arrays: list[np.ndarray | None]) -> list[TokenCapture]:
    return [TokenCapture(tok, piece, *(None if a is None else a[j] for a in arrays))
            for j, (tok, piece) in enumerate(zip(ids, pieces))]


def aligned_words(rows: np.ndarray, source_word_of_token: Sequence[int]) -> np.ndarray:
    """[T] the source word each token's heads attend to most (head-averaged argmax of rows [T, H, S])."""
    if not len(rows):
        return np.zeros(0, dtype=int)
    return np.asarray(source_word_of_token)[rows.mean(axis=1).argmax(axis=-1)]


def head_means(masses: Sequence[np.ndarray | None]) -> np.ndarray:
    """[T] each token's head mean of a per-head mass [H] (0 where a token has none)."""
    return np.asarray([float(np.mean(m)) if m is not None and len(m) else 0.0 for m in masses], dtype=float)


def mass_split(
    rows: np.ndarray,
    other_prompt: np.ndarray,
    generated: np.ndarray,
    source_word_of_token: Sequence[int],
    committed_words: int,
) -> np.ndarray:
    """Head-averaged mass split [T, 4] (`MASS_KEYS` order) of rows [T, H, S] for a frontier."""
    if not len(rows):
        return np.zeros((0, len(MASS_KEYS)))
    settled = np.asarray(source_word_of_token) < committed_words
    accessible = rows[:, :, settled].sum(axis=-1)
    inaccessible = rows[:, :, ~settled].sum(axis=-1)
    return np.stack([accessible, inaccessible, other_prompt, generated], axis=-1).mean(axis=1)


class Seam(Protocol):
    """A capture seam. Loading happens in the constructor; `draft` runs one greedy draft.

    `close` releases what the constructor took (engine, hooks, GPU memory); it is idempotent, and
    whoever built a seam closes it.
    """

    name: str

    def draft(self, request: DraftRequest) -> Draft: ...

    def close(self) -> None: ...
