"""Bootstrap intervals and paired tests from sacrebleu: present, sane, N beside them."""

from __future__ import annotations

import pytest

pytest.importorskip("sacrebleu")

from sacrebleu.metrics import BLEU  # noqa: E402

from alignatt.evaluate import uncertainty  # noqa: E402

REFS = [f"der Hund {i} läuft schnell über die grüne Wiese nach Hause" for i in range(40)]
GOOD = list(REFS)
GOOD[::7] = [f"der Hund {i} rennt über die Wiese" for i in range(0, 40, 7)]
BAD = [f"eine Katze {i} schläft" for i in range(40)]


def test_the_interval_is_sacrebleus_bootstrap_with_n():
    got = uncertainty.intervals(GOOD, REFS, "de", resamples=200)
    own = BLEU().corpus_score(GOOD, [REFS], n_bootstrap=200)
    b = got["bleu"]
    assert b["score"] == pytest.approx(own.score, abs=1e-4) and b["mean"] == pytest.approx(own._mean, abs=1e-3)
    assert b["half_width"] == pytest.approx(own._ci, abs=1e-3)
    assert b["low"] <= b["score"] <= b["high"] <= 100 and b["n"] == 40 and b["resamples"] == 200
    # why a row can beat offline: BLEU's brevity penalty, recorded as sacrebleu gives it
    assert (b["bp"], b["sys_len"], b["ref_len"]) == (pytest.approx(own.bp, abs=1e-4), own.sys_len, own.ref_len)
    assert "bp" not in got["chrf"]
    assert got["chrf"]["low"] <= got["chrf"]["score"] <= got["chrf"]["high"]
    assert got == uncertainty.intervals(GOOD, REFS, "de", resamples=200)  # seeded: the same again


def test_small_n_says_how_few_resamples_there_are():
    two = uncertainty.intervals(GOOD[:2], REFS[:2], "de")
    assert two["bleu"]["n"] == 2 and two["bleu"]["distinct_resamples"] == 3  # {aa, ab, bb}
    one = uncertainty.intervals(GOOD[:1], REFS[:1], "de")
    assert one["bleu"]["half_width"] == 0 and one["bleu"]["resamples"] == 1


def test_an_interval_survives_a_resample_with_no_match():
    """A resample holding only the sentence with no character in common scores chrF 0.0 (a Python
    float) beside float32 scores; sacrebleu 2.6's own mean refused the mix (the H200, 2026-12-02)."""
    got = uncertainty.intervals(["der Hund läuft", "qqqq"], ["der Hund läuft", "die Katze schläft"], "de", 200)
    chrf = got["chrf"]
    assert chrf["low"] <= chrf["mean"] <= chrf["high"] and chrf["low"] < chrf["score"]
    assert isinstance(chrf["mean"], float)


@pytest.mark.parametrize("method", ["bs", "ar"])
def test_paired_tests_tell_a_different_system_from_an_identical_one(method):
    got = uncertainty.paired_tests(GOOD, {"same": list(GOOD), "bad": BAD}, REFS, "de", method, samples=300)
    # identical to the baseline: no difference to test, p = 1 (sacrebleu alone would give 1/(samples+1))
    assert got["same"]["bleu_p"] == 1.0 and got["same"]["no_difference"] == ["bleu", "chrf"]
    assert not got["same"]["significant"]
    assert got["bad"]["bleu_p"] < 0.05 and got["bad"]["significant"] and got["bad"]["n"] == 40
    assert got["bad"]["samples"] == 300 and got["bad"]["method"] == method


def test_a_paired_test_needs_the_same_sentences():
    with pytest.raises(ValueError, match="same sentences"):
        uncertainty.paired_tests(GOOD, {"short": GOOD[:3]}, REFS, "de")


def test_two_sentences_cannot_be_significant():
    got = uncertainty.paired_tests(GOOD[:2], {"bad": BAD[:2]}, REFS[:2], "de", "bs")
    # sacrebleu gives p = 1/1001 here, but 2 sentences have only 3 distinct resamples
    assert got["bad"]["bleu_p"] < 0.05 and not got["bad"]["resolvable"] and not got["bad"]["significant"]


def test_holm_on_a_hand_computed_example():
    # sorted 0.005, 0.01, 0.03, 0.04 times 4, 3, 2, 1 = 0.02, 0.03, 0.06, 0.04 -> non-decreasing: 0.04 -> 0.06
    assert uncertainty.holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert uncertainty.holm([0.5, 0.6]) == [1.0, 1.0]  # capped at 1
    assert uncertainty.holm([]) == []
    # the en-it H200 artifact (issue 39): its high_latency BLEU p 0.018 is 0.09 after Holm, its chrF 0.002 is 0.012
    got = uncertainty.holm([0.0929, 0.2717, 0.1608, 0.1329, 0.018, 0.002])
    assert got == pytest.approx([0.3716, 0.3987, 0.3987, 0.3987, 0.09, 0.012])


def test_significant_needs_both_metrics_after_holm():
    one = uncertainty.holm_verdicts([{"bleu_p": 0.001, "chrf_p": 0.3}])
    assert one == [{"bleu_p_holm": 0.002, "chrf_p_holm": 0.3, "family": 2, "significant": False}]
    both = uncertainty.holm_verdicts([{"bleu_p": 0.001, "chrf_p": 0.01}, {"bleu_p": 0.5, "chrf_p": 0.9}])
    assert [v["significant"] for v in both] == [True, False] and both[0]["chrf_p_holm"] == pytest.approx(0.03)
    # each below 0.05 alone, not after the family's correction (4 tests)
    assert not uncertainty.holm_verdicts([{"bleu_p": 0.02, "chrf_p": 0.02}, {"bleu_p": 0.9, "chrf_p": 0.9}])[0]["significant"]
    assert not uncertainty.holm_verdicts([{"bleu_p": 0.001, "chrf_p": 0.001, "resolvable": False}])[0]["significant"]


def test_a_paired_test_is_significant_only_when_both_metrics_are():
    # before the family's correction (`holm_verdicts`), `significant` is both metrics' p below the level
    got = uncertainty.paired_tests(GOOD, {"bad": BAD, "close": GOOD[:-1] + [REFS[-1]]}, REFS, "de", "bs", samples=200)
    for result in got.values():
        assert result["significant"] == (result["resolvable"] and result["bleu_p"] < 0.05 and result["chrf_p"] < 0.05)
