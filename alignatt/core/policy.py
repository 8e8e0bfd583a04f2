"""AlignAtt: emit a drafted token only while its attention stays on settled source.

Each drafted token is aligned to the source word its heads attend to most (head-averaged
attention, argmax over source tokens). Scanning the draft left to right, the first token aligned
to the unstable tail, or to one of the last `border_words` committed words (too fresh: the next
ASR word may still change how they translate), stops emission; everything from there on is held.
The emitted part is then cut back to whole target words, shortened by `hold_back_words`, and
dropped entirely if it is shorter than `min_emit_words`.

The decision is a pure function of (draft, frontier), so a commit that only moves the frontier can
be re-judged on the cached draft with no engine call.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from alignatt.core.draft import MASS_KEYS, Draft


class PolicyConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    border_words: int = Field(1, ge=0, description="last N committed words treated as frontier")
    hold_back_words: int = Field(0, ge=0, description="whole target words held back after a stop")
    min_emit_words: int = Field(0, ge=0, description="emit nothing unless at least N new words")


# Named presets; the WhisperLiveKit client's latency presets map onto these.
POLICY_PRESETS: dict[str, PolicyConfig] = {
    "low_latency": PolicyConfig(border_words=0, hold_back_words=0, min_emit_words=0),
    "balanced": PolicyConfig(border_words=1, hold_back_words=0, min_emit_words=0),
    "high_latency": PolicyConfig(border_words=2, hold_back_words=1, min_emit_words=1),
}


# Reasons, in the order a token is checked. Stop reasons carry the `alignatt:` prefix on the wire.
EMIT = "emit"
FINAL = "final"
UNSTABLE_TAIL = "unstable_tail"
SOURCE_FRONTIER = "source_frontier"
AFTER_STOP = "after_stop"
PARTIAL_WORD = "partial_word"
HOLD_BACK = "hold_back"
MIN_EMIT = "min_emit"


@dataclass
class Decision:
    index: int
    token_id: int
    piece: str
    aligned_word: int
    aligned_text: str
    mass: dict[str, float]
    emit: bool
    reason: str


@dataclass
class PolicyResult:
    decisions: list[Decision]
    emit_count: int  # the emitted part is always a prefix of the draft: tokens [0, emit_count)
    emitted_text: str
    held_text: str
    stop_reason: str
    committed_words: int
    words_emitted: int = 0

    def as_dict(self) -> dict:
        return {
            "emit_count": self.emit_count,
            "emitted_text": self.emitted_text,
            "held_text": self.held_text,
            "stop_reason": self.stop_reason,
            "committed_words": self.committed_words,
            "decisions": [d.__dict__ for d in self.decisions],
        }


def word_starts(pieces: list[str]) -> list[int]:
    """Indices of tokens that begin a new target word.

    The draft always starts on a word boundary (the accepted prefix ends after whole words), and
    any later piece beginning with whitespace opens a new word; punctuation and sub-word pieces
    without a leading space belong to the word before them.
    """
    return [i for i, p in enumerate(pieces) if i == 0 or p[:1].isspace()]


def decide(
    draft: Draft, committed_words: int, config: PolicyConfig | None = None, final: bool = False
) -> PolicyResult:
    config = config or PolicyConfig()
    n_words = len(draft.request.source_words)
    if not 0 <= committed_words <= n_words:
        raise ValueError(f"committed_words={committed_words} outside 0..{n_words}")
    pieces = [t.piece for t in draft.tokens]
    n = len(pieces)
    aligned = [int(w) for w in draft.aligned_words()]
    masses = draft.mass_split(committed_words)

    # 1. Attention scan: first token looking at the tail or the border stops emission.
    reasons = [EMIT] * n
    passed = n
    if final:
        reasons = [FINAL] * n
    else:
        trusted = committed_words - config.border_words  # words [0, trusted) are safe to follow
        for i, w in enumerate(aligned):
            if w >= committed_words:
                reasons[i] = UNSTABLE_TAIL
            elif w >= trusted:
                reasons[i] = SOURCE_FRONTIER
            else:
                continue
            passed = i
            reasons[i + 1 :] = [AFTER_STOP] * (n - i - 1)
            break

    cut = passed
    if not final:
        # 2. Whole words only: cut at the last word start not after the stop. A draft that ended
        #    on EOS has a complete last word; one cut by max_new_tokens may not.
        boundaries = word_starts(pieces) + ([n] if draft.stop_reason == "eos" else [])
        cut = max(b for b in boundaries + [0] if b <= passed)
        for i in range(cut, passed):
            reasons[i] = PARTIAL_WORD
        # 3. Hold back whole words, then the minimum emission size.
        starts = [s for s in word_starts(pieces) if s < cut]
        if config.hold_back_words:
            kept = max(len(starts) - config.hold_back_words, 0)
            new_cut = starts[kept] if kept < len(starts) else cut
            for i in range(new_cut, cut):
                reasons[i] = HOLD_BACK
            cut = new_cut
        words = len([s for s in word_starts(pieces) if s < cut])
        if words < config.min_emit_words:
            for i in range(0, cut):
                reasons[i] = MIN_EMIT
            cut = 0

    decisions = []
    for i, tok in enumerate(draft.tokens):
        w = aligned[i]
        decisions.append(
            Decision(
                index=i,
                token_id=tok.token_id,
                piece=tok.piece,
                aligned_word=w,
                aligned_text=draft.request.source_words[w],
                mass={k: float(v) for k, v in zip(MASS_KEYS, masses[i])},
                emit=i < cut,
                reason=reasons[i],
            )
        )
    if cut < n:
        stop = "alignatt:" + reasons[cut]
    else:
        stop = draft.stop_reason
    return PolicyResult(
        decisions=decisions,
        emit_count=cut,
        emitted_text="".join(pieces[:cut]),
        held_text="".join(pieces[cut:]),
        stop_reason=stop,
        committed_words=committed_words,
        words_emitted=len([s for s in word_starts(pieces) if s < cut]),
    )
