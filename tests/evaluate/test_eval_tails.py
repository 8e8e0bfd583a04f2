"""The replay's tail models: the seeded noisy ASR tail is deterministic and its parameters do what they say."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from alignatt.evaluate.tails import TailModel, TailNoise, vocabulary

# Upper case: a confusion can never be mistaken for a piece of a split (lower-case) tail word.
VOCAB = vocabulary(["THE CAT SAT ON THE MAT", "A DOG RAN FAR AWAY TODAY"])
TAIL = ["consonance", "relationship", "between", "words", "and", "music"]


def _draws(model: TailModel, n: int = 4000):
    return [model.show(TAIL, f"stream{i % 50}", i) for i in range(n)]


def test_the_noisy_tail_is_seeded_and_deterministic():
    a = TailModel("noisy", TailNoise(seed=7), VOCAB)
    b = TailModel("noisy", TailNoise(seed=7), VOCAB)
    other = TailModel("noisy", TailNoise(seed=8), VOCAB)
    first = [a.show(TAIL, "en-de:213", e) for e in range(20)]
    assert first == [b.show(TAIL, "en-de:213", e) for e in range(20)]  # same seed, stream, event: same tail
    assert first != [other.show(TAIL, "en-de:213", e) for e in range(20)]
    assert first != [a.show(TAIL, "en-de:243", e) for e in range(20)]  # another stream draws otherwise
    assert len({tuple(s.words) for s in first}) > 1  # each ASR event redraws the tail


def _outcomes(noise: TailNoise):
    """Per tail word: dropped, wrong, split or kept, told apart by what was shown (the words of
    TAIL are not in VOCAB, and a split's two pieces join back to the word)."""
    counts = {"drop": 0, "wrong": 0, "split": 0, "kept": 0}
    for shown in _draws(TailModel("noisy", noise, VOCAB)):
        words, i = shown.words, 0
        for word in TAIL:
            if i < len(words) and words[i] == word:
                counts["kept"] += 1
                i += 1
            elif i + 1 < len(words) and words[i] + words[i + 1] == word:
                counts["split"] += 1
                i += 2
            elif i < len(words) and words[i] in VOCAB:
                counts["wrong"] += 1
                i += 1
            else:
                counts["drop"] += 1
        assert i == len(words)
    total = sum(counts.values())
    return {k: v / total for k, v in counts.items()}


@pytest.mark.parametrize(("p_wrong", "p_drop", "p_split"), [(0.2, 0.05, 0.05), (0.5, 0.2, 0.1), (0.0, 0.0, 0.3)])
def test_each_probability_is_that_outcome_s_share(p_wrong, p_drop, p_split):
    got = _outcomes(TailNoise(p_wrong=p_wrong, p_drop=p_drop, p_split=p_split))
    # 24000 tail words: a share is within 0.015 of its probability (> 4 standard errors)
    assert got["wrong"] == pytest.approx(p_wrong, abs=0.015)
    assert got["drop"] == pytest.approx(p_drop, abs=0.015)
    assert got["split"] == pytest.approx(p_split, abs=0.015)


def test_wrong_words_come_from_the_vocabulary_and_differ_from_the_truth():
    model = TailModel("noisy", TailNoise(p_wrong=1.0, p_drop=0.0, p_split=0.0), ["the", "cat"])
    shown = model.show(["the", "cat", "the"], "s", 0)
    assert shown.words == ["cat", "the", "cat"] and shown.covered == 3


def test_no_noise_is_the_gold_tail_and_none_shows_nothing():
    quiet = TailModel("noisy", TailNoise(p_wrong=0.0, p_drop=0.0, p_split=0.0), VOCAB)
    assert all(s.words == TAIL and s.covered == len(TAIL) for s in _draws(quiet, 50))
    assert TailModel("gold").show(TAIL, "s", 0).words == TAIL
    none = TailModel("none").show(TAIL, "s", 0)
    assert none.words == [] and none.covered == 0


def test_covered_stops_at_the_last_word_shown():
    # p_drop = 0.5: whatever is dropped, `covered` is one past the last tail position shown
    model = TailModel("noisy", TailNoise(p_wrong=0.0, p_drop=0.5, p_split=0.0), VOCAB)
    for shown in _draws(model, 200):
        kept = [j for j, w in enumerate(TAIL) if w in shown.words]
        assert shown.covered == (kept[-1] + 1 if kept else 0)


def test_bad_noise_parameters_fail_clearly():
    with pytest.raises(ValidationError, match="at most 1"):
        TailNoise(p_wrong=0.6, p_drop=0.3, p_split=0.2)
    with pytest.raises(ValidationError):
        TailNoise(p_wrong=-0.1)
    with pytest.raises(ValueError, match="vocabulary"):
        TailModel("noisy", TailNoise(), ["only"])
    with pytest.raises(ValueError, match="unknown tail"):
        TailModel("perfect")  # type: ignore[arg-type]
