"""How the page names and picks eval rows: whole talks / no oracle segmentation / ASR-like errors in
the IWSLT bands for the headline, and older artifacts labelled as what they are."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("omnisteval")

from alignatt.evaluate.outputs import (BELOW_ZERO, below_zero_talk_rows, headline_talk_rows, iwslt_band,  # noqa: E402
                                      tail_label, tail_key, talk_rows_with_asr)
from alignatt.evaluate.run import EvalOptions, run_eval  # noqa: E402
from alignatt.record.artifacts import EvalArtifact, load_artifact  # noqa: E402
from tests.fakes.mt_fakes import FakeSeam  # noqa: E402

# rows of the H200 en-de eval of 69972d8 (2026-12-04), before whole talks and the ASR-like transcript
BEFORE_WHOLE_TALKS = Path(__file__).resolve().parents[1] / "golden" / "eval_before_whole_talks.json"


@pytest.fixture(scope="module")
def artifact():
    options = EvalOptions(limit=1, max_source_words=8, presets=["low_latency", "high_latency"], tails=["asr"],
                          longform_talks=1, longform_max_pairs=3, longform_tails=["asr"],
                          longform_oracle_tails=["gold"], offline_baseline=False, bootstrap=10)
    return run_eval(options, None, seam_factory=lambda route, heads: FakeSeam(), progress=lambda m: None)


def test_bands():
    assert [iwslt_band(x) for x in (None, -1.0, 0.0, 1999.0, 2000.0, 3500.0, 4001.0)] == [
        None, BELOW_ZERO, "low", "low", "low", "high", "above 4 s"]


def test_rows_say_what_they_replayed(artifact):
    talks = [r for r in artifact.rows if r.form == "longform"]
    assert {tail_key(r) for r in talks} == {"asr@0.05", "asr@0.15", "gold.oracle"}
    labels = {tail_label(r) for r in talks}
    assert any("whole talks, closed by the client" in x and "committed WER 15 %" in x for x in labels)
    assert any("oracle segmentation" in x for x in labels)
    assert all("IWSLT band" in x for x in labels)


def test_the_headline_is_whole_talks_with_asr_errors_in_the_iwslt_bands(artifact):
    picked = headline_talk_rows(artifact)
    assert picked, "the fake's talk rows fit a band"
    for band, r in picked:
        assert r.form == "longform" and r.tail == "asr" and r.segmentation == "punctuation"
        assert r.committed_wer == 0.15
        assert r.latency["ca_stream_laal"] <= {"low": 2000, "high": 4000}[band]


def test_a_talk_row_below_zero_is_in_no_band_and_the_headline_names_it(artifact):
    """mwerSegmenter can put a weak translation's words in the wrong segments: a negative StreamLAAL
    is not a low latency, and the headline must not call it one."""
    best = max(talk_rows_with_asr(artifact), key=lambda r: r.bleu)
    rows = [r.model_copy(update={"latency": {**r.latency, "ca_stream_laal": -1130.0, "stream_laal": -1370.0}})
            if r is best else r for r in artifact.rows]
    negative = artifact.model_copy(update={"rows": rows})
    assert [r.preset for r in below_zero_talk_rows(negative)] == [best.preset]
    assert all(r.latency["ca_stream_laal"] >= 0 for _, r in headline_talk_rows(negative))
    assert "none: below 0 (CU)" in tail_label(next(r for r in rows if r.latency.get("stream_laal") == -1370.0))


def test_an_eval_from_before_whole_talks_loads_and_is_labelled():
    a = load_artifact(BEFORE_WHOLE_TALKS)
    assert isinstance(a, EvalArtifact) and headline_talk_rows(a) == []
    old = [r for r in a.rows if r.form == "longform"]
    assert old and all("old format: 5-pair chunks" in tail_label(r) for r in old)
    assert any(tail_label(r).startswith("noisy (old tail noise") for r in a.rows if r.tail == "noisy")


def test_an_eval_without_the_gold_tail_runs():
    options = EvalOptions(limit=1, max_source_words=8, presets=["balanced"], tails=["none"], offline_baseline=False,
                          bootstrap=10)
    a = run_eval(options, None, seam_factory=lambda route, heads: FakeSeam(), progress=lambda m: None)
    assert [r.tail for r in a.rows] == ["none"]

