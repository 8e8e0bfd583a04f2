"""AlignAtt: emit a drafted token only while its attention stays on settled source.

Each drafted token is aligned to the source word its heads attend to most (head-averaged
attention, argmax over source tokens). Scanning the draft left to right, the first token aligned
to the unstable tail, or to one of the last `border_words` committed words (too fresh: the next
ASR word may still change how they translate), stops emission; everything from there on is held.
The emitted part is then cut back to whole target words, shortened by `hold_back_words`, and
dropped entirely if it is shorter than `min_emit_words`.

Attention on the prompt's context block and history turns is neither source nor target: it never
aligns a token (alignment is the argmax over source tokens only). A token that draws more than
`max_context_share` of its content attention (source + context) from the context block is held
like one aligned to the unstable tail (`context_leak`): it is translating the glossary, not what
was said. Finals are not held for it (the context is there to be used once the source is done).

Target words are whitespace words, except in CJK scripts (Chinese, Japanese), which do not put
spaces between words: there every CJK character is a unit of its own, and a Latin run is one
unit. "Whole words", `hold_back_words`, `min_emit_words` and the emitted count use these units.

The decision is a pure function of (draft, frontier), so a commit that only moves the frontier can
be re-judged on the cached draft with no engine call.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from alignatt.core.draft import MASS_KEYS, Draft


class PolicyConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    border_words: int = Field(1, ge=0, description="last N committed words treated as frontier")
    hold_back_words: int = Field(0, ge=0, description="whole target words held back after a stop")
    min_emit_words: int = Field(0, ge=0, description="emit nothing unless at least N new words")
    max_context_share: float = Field(
        0.5, gt=0.0, le=1.0,
        description="hold a token whose context mass / (source + context mass) exceeds this (1: never)",
    )


# Named presets; the WhisperLiveKit client's latency presets map onto these.
POLICY_PRESETS: dict[str, PolicyConfig] = {
    "low_latency": PolicyConfig(border_words=0, hold_back_words=0, min_emit_words=0),
    "balanced": PolicyConfig(border_words=1, hold_back_words=0, min_emit_words=0),
    "high_latency": PolicyConfig(border_words=2, hold_back_words=1, min_emit_words=1),
}
PRESET_NAMES = tuple(POLICY_PRESETS)  # from the lowest latency to the highest
DEFAULT_PRESET = "balanced"


# Reasons, in the order a token is checked. Stop reasons carry the `alignatt:` prefix on the wire.
EMIT = "emit"
FINAL = "final"
UNSTABLE_TAIL = "unstable_tail"
CONTEXT_LEAK = "context_leak"
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


# Target languages written without spaces between words.
CJK_LANGS = frozenset({"zh", "ja", "yue", "wuu"})


def is_cjk_char(c: str) -> bool:
    """A CJK ideograph, kana or Hangul syllable (not CJK punctuation: it ends the unit before it)."""
    o = ord(c)
    return (0x4E00 <= o <= 0x9FFF or 0x3400 <= o <= 0x4DBF or 0x20000 <= o <= 0x2FA1F
            or 0xF900 <= o <= 0xFAFF or 0x3040 <= o <= 0x30FF or 0xAC00 <= o <= 0xD7AF)


def word_starts(pieces: list[str], target_lang: str = "") -> list[int]:
    """Indices of tokens that begin a new target word (unit).

    The draft always starts on a word boundary (the accepted prefix ends after whole words), and
    any later piece beginning with whitespace opens a new word; punctuation and sub-word pieces
    without a leading space belong to the word before them. For CJK targets a piece that begins
    with a CJK character opens a unit too, and so does a Latin/digit piece right after one.
    """
    cjk = target_lang.split("-")[0].lower() in CJK_LANGS
    starts = []
    for i, p in enumerate(pieces):
        if i == 0 or p[:1].isspace():
            starts.append(i)
        elif cjk and p and (is_cjk_char(p[0]) or (p[0].isalnum() and pieces[i - 1][-1:] and is_cjk_char(pieces[i - 1][-1]))):
            starts.append(i)
    return starts


def target_units(text: str, target_lang: str = "") -> int:
    """How many target units (words; CJK characters and Latin runs for CJK targets) a text holds."""
    if target_lang.split("-")[0].lower() not in CJK_LANGS:
        return len(text.split())
    units, in_run = 0, False
    for c in text:
        if is_cjk_char(c):
            units, in_run = units + 1, False
        elif c.isalnum():
            units, in_run = units + (not in_run), True
        else:
            in_run = in_run and not c.isspace()
    return units


def scan_stop(aligned: list[int], context_share: np.ndarray, committed_words: int,
              config: PolicyConfig) -> tuple[int, str] | None:
    """The attention scan: the first token aligned to the unstable tail or the border, or leaking
    context, and why (None: every token passed). A token's verdict depends on that token alone,
    so the scan of a draft's first k tokens is the scan of the whole draft wherever it stops
    within them (what lets a seam stop drafting once the answer is known: `core/settle.py`)."""
    trusted = committed_words - config.border_words  # words [0, trusted) are safe to follow
    for i, w in enumerate(aligned):
        if context_share[i] > config.max_context_share:
            return i, CONTEXT_LEAK
        if w >= committed_words:
            return i, UNSTABLE_TAIL
        if w >= trusted:
            return i, SOURCE_FRONTIER
    return None


def share_of_context(masses: np.ndarray, context: np.ndarray) -> np.ndarray:
    """[T] context mass / (source + context mass) from a [T, 4] `mass_split` and the context
    block's [T] head-mean mass: what `max_context_share` is tested on."""
    source_mass = masses[:, 0] + masses[:, 1] if len(masses) else np.zeros(0)
    return np.divide(context, source_mass + context, out=np.zeros(len(context)),
                     where=(source_mass + context) > 0)


def context_share(draft: Draft, committed_words: int) -> np.ndarray:
    """[T] each token's context share (`share_of_context`) at this frontier."""
    return share_of_context(draft.mass_split(committed_words), draft.block_mass("context"))


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
    context, history = draft.block_mass("context"), draft.block_mass("history")
    share = context_share(draft, committed_words)
    lang = draft.request.target_lang

    # 1. Attention scan: first token looking at the tail or the border stops emission.
    reasons = [EMIT] * n
    passed = n
    if final:
        reasons = [FINAL] * n
    else:
        stop = scan_stop(aligned, share, committed_words, config)
        if stop is not None:
            passed, why = stop
            reasons[passed] = why
            reasons[passed + 1 :] = [AFTER_STOP] * (n - passed - 1)

    cut = passed
    if not final:
        # 2. Whole words only: cut at the last word start not after the stop. A draft that ended
        #    on EOS has a complete last word; one cut by max_new_tokens may not.
        boundaries = word_starts(pieces, lang) + ([n] if draft.stop_reason == "eos" else [])
        cut = max(b for b in boundaries + [0] if b <= passed)
        for i in range(cut, passed):
            reasons[i] = PARTIAL_WORD
        # 3. Hold back whole words, then the minimum emission size.
        starts = [s for s in word_starts(pieces, lang) if s < cut]
        if config.hold_back_words:
            kept = max(len(starts) - config.hold_back_words, 0)
            new_cut = starts[kept] if kept < len(starts) else cut
            for i in range(new_cut, cut):
                reasons[i] = HOLD_BACK
            cut = new_cut
        words = len([s for s in word_starts(pieces, lang) if s < cut])
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
                mass={**{k: float(v) for k, v in zip(MASS_KEYS, masses[i])},
                      "context": float(context[i]), "history": float(history[i]),
                      "context_share": float(share[i])},
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
        words_emitted=target_units("".join(pieces[:cut]), lang) if lang.split("-")[0].lower() in CJK_LANGS
        else len([s for s in word_starts(pieces, lang) if s < cut]),
    )
