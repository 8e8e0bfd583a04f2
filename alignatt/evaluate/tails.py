"""What the replayed ASR shows: the gold words, an ASR-like transcript, a seeded noisy tail, or nothing.

The replay's schedule (`alignatt.evaluate.replay.Schedule`) decides which source words have
arrived and which are committed; a tail model decides how the committed words and the
arrived-but-uncommitted ones are shown to the translator (`TailModel.view`). Only `asr` puts
errors in the committed words; the other kinds commit the gold words.

- `asr`: an ASR-like transcript (`alignatt.evaluate.asr_errors`): committed words with errors at a
  set word error rate (one row per rate of `EvalOptions.asr_wers`), and a tail that revises each
  word at most once, towards what is committed.

- `gold`: the tail is the gold source (perfect lookahead: at 2.4 words/s and a 2 s commit lag,
  about 4.8 words of the answer).
- `none` (no lookahead): the tail is never shown; the translator reads committed words only.
- `noisy`: every ASR event redraws the whole tail, as a re-decoding ASR rewrites its partial
  hypothesis on each chunk (WhisperLiveKit's LocalAgreement does). Each tail word, independently,
  is (`TailNoise`): dropped with probability `p_drop`, replaced by a confusion with probability
  `p_wrong`, split in two with probability `p_split`, else shown as it is (one uniform draw per
  word; the three outcomes exclude each other, so each parameter is that outcome's probability).
  The confusion is another word of the test set's source vocabulary (its distinct
  whitespace-separated source tokens, sorted), drawn uniformly. A split cuts the word at a
  uniformly drawn interior character ("consonance" -> "conso nance"); a one-character word
  cannot be split and is shown as it is.

Deterministic: the draw for one tail is seeded by (seed, stream id, event number), so every preset
and every driver sees the same noisy ASR on the same stream, and a re-run gives the same tails.

Words *read* (SimulEval's delay unit): the committed words plus the source positions the shown
tail covers, i.e. up to the last tail word shown in any form (a dropped last word is not read).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Mapping

from alignatt.evaluate.asr_errors import AsrErrors, AsrTranscriber
from alignatt.record.artifacts.options import TAIL_KINDS, TailKind, TailNoise  # recorded by an eval artifact
from alignatt.replay.stream import ends_sentence

TAIL_DESCRIPTIONS = {
    "gold": "tail = the gold source words (perfect lookahead)",
    "asr": "an ASR-like transcript: committed words with errors at the row's committed WER, a tail that "
           "revises itself consistently (see config.tail_descriptions[...].asr_errors)",
    "noisy": "tail = a seeded noisy ASR hypothesis (see config.tail_noise)",
    "none": "no lookahead: the tail is never shown, only committed words",
}


# The eval's flat knobs of its nested `tail_noise` (EvalOptions.tail_noise): `alignatt eval
# --tail-p-wrong 0.1`, a params.yaml eval section's `tail_p_wrong: 0.1`. Flat name -> TailNoise field.
TAIL_NOISE_KNOBS = {"tail_noise_seed": "seed", "tail_p_wrong": "p_wrong", "tail_p_drop": "p_drop",
                    "tail_p_split": "p_split"}


def fold_tail_noise(values: Mapping[str, Any]) -> dict[str, Any]:
    """Flat eval knobs with the tail-noise ones (`tail_p_wrong`, ...) folded into `tail_noise`,
    over the fields a `tail_noise` value there gives."""
    flat = {k: v for k, v in values.items() if k.replace("-", "_") not in TAIL_NOISE_KNOBS}
    noise = {TAIL_NOISE_KNOBS[k.replace("-", "_")]: v for k, v in values.items()
             if k.replace("-", "_") in TAIL_NOISE_KNOBS}
    if noise:
        given = flat.get("tail_noise")
        flat["tail_noise"] = {**(given.model_dump() if isinstance(given, TailNoise) else dict(given or {})), **noise}
    return flat


@dataclass(frozen=True)
class ShownTail:
    words: list[str]  # what the translator is shown as the tail
    covered: int  # tail positions read: up to the last one shown in any form


def vocabulary(sources: list[str]) -> list[str]:
    """The confusion set: the distinct source tokens of the test set, sorted (stable across runs)."""
    return sorted({w for s in sources for w in s.split()})


class TailModel:
    """Turns the gold tail of one ASR event into the tail the translator is shown."""

    def __init__(self, kind: TailKind = "gold", noise: TailNoise | None = None,
                 vocab: list[str] | None = None, asr: AsrErrors | None = None,
                 commit_lag_seconds: float = 2.0) -> None:
        if kind not in TAIL_KINDS:
            raise ValueError(f"unknown tail {kind!r}: use one of {', '.join(TAIL_KINDS)}")
        self.kind = kind
        self.noise = noise or TailNoise()
        self.vocab = list(vocab or [])
        self.asr = asr or AsrErrors()
        self.transcriber = AsrTranscriber(self.asr, self.vocab, commit_lag_seconds) if kind == "asr" else None
        if kind == "noisy" and self.noise.p_wrong > 0 and len(self.vocab) < 2:
            raise ValueError("a noisy tail with p_wrong > 0 needs a vocabulary of at least 2 words")

    @property
    def committed_wer(self) -> float | None:
        return self.asr.committed_wer if self.kind == "asr" else None

    def view(self, words: list[str], stream_id: str) -> "StreamView":
        """What the client sees of one stream's words: committed tokens, tail, sentence ends."""
        if self.kind == "asr":
            return self.transcriber.transcript(words, stream_id)
        return _GoldView(words, self, stream_id)

    def show(self, tail: list[str], stream_id: str, event: int) -> ShownTail:
        if self.kind == "gold":
            return ShownTail(list(tail), len(tail))
        if self.kind == "none" or not tail:
            return ShownTail([], 0)
        n = self.noise
        rng = random.Random(f"{n.seed}:{stream_id}:{event}")  # str seeds hash with sha512: stable
        shown: list[str] = []
        covered = 0
        for j, word in enumerate(tail):
            u = rng.random()
            if u < n.p_drop:
                continue
            if u < n.p_drop + n.p_wrong:
                shown.append(self._confusion(word, rng))
            elif u < n.p_drop + n.p_wrong + n.p_split and len(word) > 1:
                cut = rng.randint(1, len(word) - 1)
                shown += [word[:cut], word[cut:]]
            else:
                shown.append(word)
            covered = j + 1
        return ShownTail(shown, covered)

    def _confusion(self, word: str, rng: random.Random) -> str:
        while True:  # the vocabulary has >= 2 distinct words, so this ends
            other = self.vocab[rng.randrange(len(self.vocab))]
            if other != word:
                return other

    def describe(self) -> dict[str, object]:
        out: dict[str, object] = {"tail": self.kind, "description": TAIL_DESCRIPTIONS[self.kind]}
        if self.kind == "asr":
            out["asr_errors"] = self.asr.model_dump()
            out["vocabulary_size"] = len(self.vocab)
        if self.kind == "noisy":
            out["tail_noise"] = self.noise.model_dump()
            out["vocabulary_size"] = len(self.vocab)
        return out


class StreamView:
    """What the client sees of a stream (an `asr_errors.Transcript` is one): the committed tokens of gold
    words [start, end), the tail shown for [start, end) at given ages (and the event's number), and
    whether the committed text up to a gold word ends a sentence as the client reads it."""

    def committed(self, start: int, end: int) -> list[str]: ...

    def tail(self, start: int, end: int, ages_s: list[float], event: int = 0) -> tuple[list[str], int]: ...

    def ends_sentence(self, end: int) -> bool: ...


class _GoldView(StreamView):
    """gold / noisy / none: the gold words committed, the tail model's tail."""

    def __init__(self, words: list[str], model: TailModel, stream_id: str) -> None:
        self.words, self.model, self.stream_id = words, model, stream_id

    def committed(self, start: int, end: int) -> list[str]:
        return self.words[start:end]

    def tail(self, start: int, end: int, ages_s: list[float], event: int = 0) -> tuple[list[str], int]:
        shown = self.model.show(self.words[start:end], self.stream_id, event)
        return shown.words, shown.covered

    def ends_sentence(self, end: int) -> bool:
        return end > 0 and ends_sentence(self.words[end - 1])
