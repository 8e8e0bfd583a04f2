"""An ASR-like transcript of a source stream: errors in the committed words, and a tail that revises
itself consistently as more audio arrives.

Every gold word i gets, once per stream (seeded by seed, stream id and i, so every preset, driver
and re-run sees the same recogniser), two forms:
- its *committed* form (`final[i]`, zero, one or two tokens), what the recogniser commits and never
  changes again. A word starts an error with probability `rate` (chosen so that the expected word
  error rate of the committed transcript is `committed_wer`); the error is, by the mix
  `p_substitute : p_delete : p_merge : p_split`:
  - substitute: a near-homophone or easily confused word (`HOMOPHONES`: their/there, to/two, than/
    then, an/and ...), else the test set's most similar source word (difflib's ratio >= 0.6), else
    one vowel changed; the word's punctuation is kept;
  - delete: a function word (`FUNCTION_WORDS`) is dropped; any other word is substituted instead;
  - merge: the word and the next are written as one ("data set" -> "dataset"; 2 word errors);
  - split: a word of 6+ characters is written as two ("consonance" -> "conson ance"; 2 errors).
  Outside the word error rate (a normalised WER ignores them): the first letter's case flips with
  `p_casing`, a sentence mark is dropped with `p_punct_drop`, and a period is added after a word
  with `p_punct_insert`. The client sees these marks, so they move where it closes utterances.
- its *early* forms (`early[i]`, `tail_stages` of them), what the tail shows before the recogniser
  settles on the word: each, with probability `p_tail_revise`, a confusion of the committed form
  (the first one may be nothing yet, with `p_tail_missing`), else the committed form itself. Stage
  k is shown until the word is `settle_s[i][k]` seconds old (sorted uniform draws in [0,
  commit_lag)), then the committed form, so a tail word goes through a fixed sequence of at most
  `tail_stages + 1` forms ending in what is committed, the same at every event: it is never redrawn
  (LocalAgreement: a word that two hypotheses agree on stops changing).

Levels. Issue 46 ran WhisperLiveKit's LocalAgreement over faster-whisper tiny.en on a phone-call
clip: committed WER 17.3 %, the tail revised in 38-75 % of the steps. The two levels in params.yaml
(5 % and 15 % committed WER) bracket a clean talk recording and that phone call; `p_tail_revise`
is set so that the tail revises in about 40-60 % of the steps at the eval's schedule
(`tests/evaluate/test_eval_asr_errors.py` measures both). The error types are those Goldwater,
Jurafsky and Manning describe (Speech Communication 52(3), 2010: "doubly confusable pairs" and
short, frequent words among the hardest); the mix (55 % substitutions, 25 % deletions, 10 %
merges, 10 % splits) is assumed, as no published distribution of types for a modern recogniser
on talks was found.
"""

from __future__ import annotations

import difflib
import random
import re
from dataclasses import dataclass
from functools import lru_cache

from alignatt.record.artifacts.options import AsrErrors  # the error model's knobs, recorded by an eval artifact
from alignatt.replay.stream import ends_sentence

HOMOPHONE_GROUPS = (
    ("their", "there", "they're"), ("to", "too", "two"), ("its", "it's"), ("your", "you're"),
    ("then", "than"), ("were", "where", "we're"), ("know", "no"), ("right", "write"),
    ("here", "hear"), ("whether", "weather"), ("by", "buy"), ("for", "four"), ("one", "won"),
    ("our", "are", "hour"), ("which", "witch"), ("would", "wood"), ("new", "knew"), ("see", "sea"),
    ("through", "threw"), ("whole", "hole"), ("accept", "except"), ("affect", "effect"),
    ("an", "and"), ("in", "and"), ("a", "the"), ("this", "these"), ("that", "the"), ("is", "as"),
    ("can", "can't"), ("of", "have"), ("on", "in"), ("we", "be"), ("data", "dater"), ("model", "models"),
    ("task", "tasks"), ("show", "shows"), ("use", "used"),
)
HOMOPHONES = {w: tuple(x for x in g if x != w) for g in HOMOPHONE_GROUPS for w in g}
FUNCTION_WORDS = frozenset(
    "a an the of to in on at by for with from and or but so as that this these those is are was were be been "
    "it its we our they their he she you i do does did have has had will would can could there here then than "
    "very just also not no if about into over up out".split())
VOWELS = "aeiou"
_MARKS = re.compile(r"[.!?]+(?=[\"')\]”’]*$)")  # a sentence's final marks, before closing quotes
_CORE = re.compile(r"^([^\w']*)([\w'’-]+?)([^\w']*)$")


@dataclass(frozen=True)
class Transcript:
    """One stream's recognised forms: per gold word, the committed tokens, the tail's earlier forms
    (`early[i][k]` shown until the word is `settle_s[i][k]` seconds old, the times increasing), then
    the committed tokens."""

    final: tuple[tuple[str, ...], ...]
    early: tuple[tuple[tuple[str, ...], ...], ...]
    settle_s: tuple[tuple[float, ...], ...]

    def committed(self, start: int, end: int) -> list[str]:
        """The committed tokens of gold words [start, end)."""
        return [t for w in self.final[start:end] for t in w]

    def form(self, i: int, age_s: float) -> tuple[str, ...]:
        """What the tail shows of gold word i when it is `age_s` old."""
        for form, until in zip(self.early[i], self.settle_s[i]):
            if age_s < until:
                return form
        return self.final[i]

    def tail(self, start: int, end: int, ages_s: list[float], event: int = 0) -> tuple[list[str], int]:
        """The tail shown for gold words [start, end), each `ages_s` old: (tokens, gold positions
        covered: up to the last word shown in any form)."""
        shown, covered = [], 0
        for j, (i, age) in enumerate(zip(range(start, end), ages_s)):
            form = self.form(i, age)
            shown += form
            if form:
                covered = j + 1
        return shown, covered

    def ends_sentence(self, end: int) -> bool:
        """Whether the committed transcript up to gold word `end` (exclusive) ends on a sentence mark,
        as the client reads it."""
        tokens = self.committed(max(0, end - 3), end)
        return bool(tokens) and ends_sentence(tokens[-1]) and bool(self.final[end - 1])


def _split_core(word: str) -> tuple[str, str, str]:
    m = _CORE.match(word)
    return (m.group(1), m.group(2), m.group(3)) if m else ("", word, "")


def _match_case(new: str, like: str) -> str:
    return new[:1].upper() + new[1:] if like[:1].isupper() else new


@lru_cache(maxsize=1)
def _lower_vocab(vocab: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(sorted({_split_core(w)[1].lower() for w in vocab if _split_core(w)[1].isalpha()}))


class AsrTranscriber:
    """Makes the seeded `Transcript` of a stream's gold words."""

    def __init__(self, errors: AsrErrors, vocab: list[str], commit_lag_seconds: float) -> None:
        self.errors = errors
        self.vocab = _lower_vocab(tuple(vocab))
        self.commit_lag_seconds = commit_lag_seconds
        self._cache: dict[tuple[str, int], Transcript] = {}
        self._similar: dict[str, list[str]] = {}
        self._buckets: dict[tuple[str, int], list[str]] = {}
        for w in self.vocab:
            self._buckets.setdefault((w[:1], len(w)), []).append(w)

    def transcript(self, words: list[str], stream_id: str) -> Transcript:
        key = (stream_id, len(words))
        if key not in self._cache:
            self._cache[key] = self._make(words, stream_id)
        return self._cache[key]

    def confusion(self, word: str, rng: random.Random) -> str:
        lead, core, trail = _split_core(word)
        low = core.lower()
        if low in HOMOPHONES:
            other = rng.choice(HOMOPHONES[low])
        else:
            if low not in self._similar:
                # only words of the same first letter and about the same length can pass 0.6
                pool = [w for k in (len(low) - 1, len(low), len(low) + 1)
                        for w in self._buckets.get((low[:1], k), ()) if w != low]
                self._similar[low] = difflib.get_close_matches(low, pool, n=4, cutoff=0.6)
            near = self._similar[low]
            if near:
                other = rng.choice(near)
            else:
                spots = [k for k, c in enumerate(low) if c in VOWELS]
                if not spots:
                    return word + "s"
                k = rng.choice(spots)
                other = low[:k] + rng.choice([v for v in VOWELS if v != low[k]]) + low[k + 1:]
        return lead + _match_case(other, core) + trail

    def _make(self, words: list[str], stream_id: str) -> Transcript:
        e = self.errors
        total = e.p_substitute + e.p_delete + e.p_merge + e.p_split
        n = len(words)
        final: list[list[str]] = [[w] for w in words]
        rngs = [random.Random(f"{e.seed}:{stream_id}:{i}") for i in range(n)]  # str seeds: sha512, stable
        cores = [_split_core(w) for w in words]
        mergeable = sum(not t and c.isalpha() for _, c, t in cores[:-1]) / max(1, n)
        splittable = sum(len(c) >= 6 and c.isalpha() for _, c, _ in cores) / max(1, n)
        rate = e.rate(mergeable, splittable)
        i = 0
        while i < n:
            rng, word = rngs[i], words[i]
            if rng.random() < rate:
                u = rng.random() * total
                lead, core, trail = _split_core(word)
                if u < e.p_delete and core.lower() in FUNCTION_WORDS and not trail:
                    final[i] = []
                elif (e.p_delete <= u < e.p_delete + e.p_merge and i + 1 < n and not trail
                      and core.isalpha()):
                    nlead, ncore, ntrail = _split_core(words[i + 1])
                    # committed with the second word: a recogniser writes "dataset" once it heard "set"
                    final[i], final[i + 1] = [], [lead + core + ncore.lower() + ntrail]
                    i += 2
                    continue
                elif u >= total - e.p_split and len(core) >= 6 and core.isalpha():
                    cut = rng.randint(3, len(core) - 3)
                    final[i] = [lead + core[:cut], core[cut:] + trail]
                else:
                    final[i] = [self.confusion(word, rng)]
            i += 1
        for i in range(n):  # marks and casing, outside the word error rate
            if not final[i]:
                continue
            rng = random.Random(f"{e.seed}:{stream_id}:{i}:marks")
            last = final[i][-1]
            if ends_sentence(last) and rng.random() < e.p_punct_drop:
                final[i][-1] = _MARKS.sub("", last)
            elif not ends_sentence(last) and last[-1:].isalnum() and rng.random() < e.p_punct_insert:
                final[i][-1] = last + "."
            if rng.random() < e.p_casing:
                first = final[i][0]
                final[i][0] = first[:1].swapcase() + first[1:]
        early, settle = [], []
        for i in range(n):
            rng = random.Random(f"{e.seed}:{stream_id}:{i}:tail")
            settle.append(tuple(sorted(rng.uniform(0.0, self.commit_lag_seconds) for _ in range(e.tail_stages))))
            forms = []
            for k in range(e.tail_stages):
                if not final[i] or rng.random() >= e.p_tail_revise:
                    forms.append(tuple(final[i]))
                elif k == 0 and rng.random() < e.p_tail_missing:
                    forms.append(())  # not recognised yet
                else:
                    forms.append(tuple(self.confusion(t, rng) for t in final[i]))
            early.append(tuple(forms))
        return Transcript(tuple(tuple(f) for f in final), tuple(early), tuple(settle))


def word_error_rate(reference: list[str], hypothesis: list[str]) -> float:
    """Normalised WER (lower case, marks stripped), as a recogniser's WER is reported: word-level
    edit distance over the reference length."""
    norm = lambda ws: [c for c in (_split_core(w)[1].lower() for w in ws) if c]  # noqa: E731
    ref, hyp = norm(reference), norm(hypothesis)
    row = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, 1):
        prev, row[0] = row[0], i
        for j, h in enumerate(hyp, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (r != h))
    return row[-1] / max(1, len(ref))
