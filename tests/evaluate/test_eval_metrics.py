"""`alignatt eval` scoring: hand-made emission timelines, checked against known values and OmniSTEval's own scorer."""

from __future__ import annotations

import pytest

pytest.importorskip("omnisteval")
pytest.importorskip("sacrebleu")

from omnisteval import Instance, evaluate_instances  # noqa: E402
from sacrebleu.metrics import BLEU, CHRF  # noqa: E402

from alignatt.evaluate import scoring  # noqa: E402
from alignatt.evaluate.emissions import Emission, computation_aware_ms, stream_output  # noqa: E402
from alignatt.evaluate.replay import Reply, ReplayStep, Schedule  # noqa: E402


def _step(ms, trigger, committed, arrived, text, buffer="", final=False, uid=0, rtt=100.0, path="draft"):
    return ReplayStep(ms, trigger, committed, arrived, final,
                      Reply(uid, final, text, buffer, path, 1 if path in ("draft", "final") else 0, rtt, rtt))


def _emissions(delays_words, times=None):
    times = times or [1000.0 * d for d in delays_words]
    return [Emission(f"w{i}", d, d + 1, t, t + 50.0) for i, (d, t) in enumerate(zip(delays_words, times))]


def test_emissions_from_a_hand_made_timeline():
    steps = [
        _step(0.0, "arrive", 0, 1, "", " Das"),
        _step(416.667, "arrive", 0, 2, "", " Das Haus"),
        _step(2000.0, "commit", 1, 2, "Das", " Haus", path="fast_path", rtt=1.0),
        _step(2416.667, "commit", 2, 2, "Das Haus ist", "", final=True, path="final"),
    ]
    out = stream_output(steps, "de")
    assert out.hypothesis == "Das Haus ist"
    assert [(e.text, e.committed_words, e.arrived_words, e.cu_ms) for e in out.emissions] == [
        ("Das", 1, 2, 2000.0), ("Haus", 2, 2, 2416.667), ("ist", 2, 2, 2416.667)]
    # one engine at a time: 0+100, max(416.7, 100)+100, max(2000, 516.7)+1, max(2416.7, 2001)+100
    assert computation_aware_ms(steps) == [100.0, 516.667, 2001.0, 2516.667]
    assert [e.ca_ms for e in out.emissions] == [2001.0, 2516.667, 2516.667]
    # shown buffers: [Das], [Das Haus], [Haus] -> all kept by the final text
    assert (out.buffer_units_shown, out.buffer_units_replaced, out.retractions) == (4, 0, 0)
    assert out.engine_calls == 3 and out.paths == {"draft": 2, "fast_path": 1, "final": 1}


def test_replaced_buffer_and_retractions_are_counted():
    steps = [
        _step(0.0, "arrive", 0, 1, "", " Der Hund"),  # "Der Hund" shown, final says "Das Haus"
        _step(2000.0, "commit", 1, 1, "Das", ""),
        _step(2400.0, "commit", 1, 1, "Dies", "", final=True),  # does not extend "Das": a retraction
    ]
    out = stream_output(steps, "de")
    assert out.retractions == 1
    assert (out.buffer_units_shown, out.buffer_units_replaced) == (2, 2)


def test_character_units_for_chinese():
    out = stream_output([_step(0.0, "commit", 1, 1, "你好", final=True)], "zh")
    assert [e.text for e in out.emissions] == ["你", "好"] and out.hypothesis == "你好"


@pytest.mark.parametrize(("delays", "src", "ref", "al", "laal"), [
    ([1, 2, 3], 3, "a b c", 1.0, 1.0),  # one target word per source word, no lag beyond the read
    ([2, 3, 3, 3], 3, "a b c d", 2.125, 2.125),  # gamma 4/3; stops at the first d >= |src|
    ([1, 2, 3, 3, 3, 3], 3, "a b c", 1.0, 1.5),  # over-generation: LAAL uses max(|hyp|, |ref|)
])
def test_word_lagging_equals_the_definition(delays, src, ref, al, laal):
    item = scoring.SentenceLatencyInput(ref, src, src * 1000.0, _emissions(delays))
    got, negative = scoring.sentence_latency([item], "de")
    assert got["al_words_committed"] == pytest.approx(al) and got["laal_words_committed"] == pytest.approx(laal)
    assert negative == []
    assert got["al_ms"] == pytest.approx(1000 * al) and got["laal_ms"] == pytest.approx(1000 * laal)
    assert got["ca_laal_ms"] == pytest.approx(1000 * laal + 50)  # every emission 50 ms later


def test_sentence_latency_equals_omnistevals_own_evaluation():
    items = [
        scoring.SentenceLatencyInput("a b c d", 4, 4000.0, _emissions([1, 1, 3, 4], [900, 1200, 3100, 4200])),
        scoring.SentenceLatencyInput("x y", 3, 3000.0, _emissions([2, 3, 3], [2500, 3300, 3300])),
    ]
    ours, _ = scoring.sentence_latency(items, "de")
    instances = [Instance(reference=it.reference, source_length=it.source_ms,
                          emission_cu=[e.cu_ms for e in it.emissions], emission_ca=[e.ca_ms for e in it.emissions])
                 for it in items]
    theirs, _, _ = evaluate_instances(instances, compute_quality=False, is_longform=False)
    for ours_key, their_key in (("al_ms", "al"), ("laal_ms", "laal"), ("yaal_ms", "yaal"),
                                ("ca_al_ms", "ca_al"), ("ca_laal_ms", "ca_laal"), ("ca_yaal_ms", "ca_yaal")):
        assert ours[ours_key] == pytest.approx(theirs[their_key], abs=1e-3), ours_key


def test_quality_is_sacrebleus_corpus_score():
    hyps, refs = ["Das Haus ist klein .", "Ich sehe ihn"], ["Das Haus ist klein .", "Ich sehe sie"]
    got = scoring.quality(hyps, refs, "de")
    assert got["bleu"] == pytest.approx(BLEU().corpus_score(hyps, [refs]).score, abs=1e-4)
    assert got["chrf"] == pytest.approx(CHRF().corpus_score(hyps, [refs]).score, abs=1e-4)


def test_longform_resegments_and_scores_long_yaal():
    # Two reference segments, 1 s of source each; words emitted at 0.5, 0.9, 1.5 and 2.5 s.
    talk = scoring.TalkInput(["eins zwei", "drei vier"], [(0.0, 1000.0), (1000.0, 1000.0)],
                             [Emission(w, 0, 0, t, t + 10.0) for w, t in
                              (("eins", 500.0), ("zwei", 900.0), ("drei", 1500.0), ("vier", 2500.0))])
    scores, segments, negative = scoring.longform([talk], "de")
    assert negative == []
    assert segments == ["eins zwei", "drei vier"]
    # segment 1: (500 + (900 - 500)) / 2 = 450; segment 2, relative to its offset: delays 500,
    # 1500; 1500 is past the recording's end (1000 ms after the offset), so 500 alone -> mean 475
    assert scores["long_yaal"] == pytest.approx(475.0)
    assert scores["ca_long_yaal"] == pytest.approx(485.0)
    assert scores["chrf"] == pytest.approx(100.0)  # 2-word segments have no 4-grams for BLEU


def test_comet_without_a_checkpoint_is_skipped_with_the_reason():
    got = scoring.comet(None, ["a"], ["b"], ["c"])
    assert got["status"] == "skipped" and "--comet-model" in got["reason"]


def test_schedule_source_duration():
    assert Schedule(2.0, 1.0).source_ms(5) == 2500.0


def test_stream_laal_resegments_with_mwer_and_scores_laal_per_segment():
    pytest.importorskip("mweralign")
    talk = scoring.TalkInput(["eins zwei", "drei vier"], [(0.0, 1000.0), (1000.0, 1000.0)],
                             [Emission(w, 0, 0, t, t + 10.0) for w, t in
                              (("eins", 500.0), ("zwei", 900.0), ("drei", 1500.0), ("vier", 2500.0))])
    assert scoring.mwer_segments(talk.references, ["eins", "zwei", "drei", "vier"]) == [2, 2]
    got = scoring.stream_laal([talk], "de")
    # LAAL per segment, gamma = 2 / 1000 ms: segment 1 (500 + 400) / 2 = 450; segment 2 (delays
    # 500, 1500 from its start) stops at 1500 >= 1000: (500 + 1000) / 2 = 750; mean 600
    assert got["stream_laal"] == pytest.approx(600.0)
    assert got["ca_stream_laal"] == pytest.approx(610.0)
