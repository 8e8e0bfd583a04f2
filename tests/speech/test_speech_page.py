"""The page's "Real speech" section: a smoke on a recognised stream becomes a row (committed and
live-tail WER, tail revisions, caption delay, flicker) beside the eval's seeded error levels, with
the timeline figure; when a word's translation was shown and committed is timed per word."""

from alignatt.measure.smoke import SmokeOptions, run_smoke
from alignatt.record.events import ReplayEvent
from alignatt.report.inputs import collect_inputs
from alignatt.report.speech import NO_REFERENCES, speech_section, speech_timeline
from alignatt.speech.captions import word_times
from tests.support.server_client import FakeFactory


def _reply(stream_s, utterance, committed, covered, shown, tail=0, final=False):
    return ReplayEvent(client="native", stream_s=stream_s, lag_s=0.0, rtt_ms=100.0, utterance_id=utterance,
                       committed_words=committed, tail_words=tail, covered_source_units=covered, final=final,
                       committed_text=" ".join(["x"] * covered), buffer_text=" ".join(["y"] * (shown - covered)))


def test_a_word_is_shown_when_new_translation_appears_after_it_was_heard_and_committed_when_covered():
    events = [_reply(1.0, 0, 0, 0, 0, tail=2),  # nothing shown yet
              _reply(2.0, 0, 1, 0, 2, tail=2),  # words 0..2 heard, a draft of 2 words shown
              _reply(3.0, 0, 3, 3, 3, final=True),  # all three committed and covered
              _reply(4.0, 1, 1, 0, 0, tail=1),
              _reply(5.0, 1, 2, 2, 2, final=True)]
    shown, committed = word_times(events)
    assert shown == {0: 2.1, 1: 2.1, 2: 2.1, 3: 5.1, 4: 5.1}
    assert committed == {0: 3.1, 1: 3.1, 2: 3.1, 3: 5.1, 4: 5.1}
    assert all(shown[j] <= committed[j] for j in committed)


def test_a_speech_smoke_makes_a_row_and_a_timeline(tmp_path):
    out = tmp_path / "outputs" / "cpu" / "speech_smoke.json"
    run_smoke(SmokeOptions(model="gemma4-e4b-synthetic", seam="fake", speed=20.0, client="native",
                           stream="speech:phone_call"), out, seam_factory=FakeFactory())
    run_smoke(SmokeOptions(model="gemma4-e4b-synthetic", seam="fake", speed=60.0, client="native"),
              tmp_path / "outputs" / "cpu" / "server_smoke.json", seam_factory=FakeFactory())
    inputs = collect_inputs(tmp_path, {"profile": "cpu"})
    section = speech_section(inputs)
    [row] = section["rows"]  # the scripted smoke makes none
    assert row["stream"] == "speech:phone_call" and row["wer"] == "17.3 %" and row["clip"] == "pyannote-audio==4.0.7"
    assert row["wer_tail"].endswith(" %") and row["wer_tail"] != row["wer"]  # the live tail's, beside it
    assert row["delay_p50"].endswith(" s") and row["erasure"] != "—" and row["tail_revised"].endswith("%")
    assert section["no_references"] == NO_REFERENCES and "without references" in NO_REFERENCES
    # random weights align nothing: the row says whose delays these are
    assert row["model"] == "gemma4-e4b-synthetic (synthetic weights: its alignment is random, so are its delays)"
    # the recogniser's measured WER heads the table of the eval's seeded levels, once per stream
    run_smoke(SmokeOptions(model="gemma4-e4b-synthetic", seam="fake", speed=20.0, client="native",
                           stream="speech:phone_call"), tmp_path / "outputs" / "h200" / "speech_smoke.json",
              seam_factory=FakeFactory())
    [measured] = speech_section(collect_inputs(tmp_path, {"profile": "cpu"}))["seeded"]
    assert measured["committed"] == "17.3 % (measured)" and measured["source"] == "outputs/cpu/speech_smoke.json"
    assert "speech:phone_call" in measured["tail"] and measured["errors"].startswith(f"tail WER {row['wer_tail']}")
    [figure] = speech_timeline(inputs)
    assert figure.kind == "speech" and figure.name == "speech_timeline_cpu_speech_smoke"
    for label in ("word ends in the audio", "recogniser commits it", "translation first shown",
                  "translation committed"):
        assert label in figure.svg


def test_the_evals_seeded_levels_stand_beside_the_measured_ones():
    from types import SimpleNamespace

    from alignatt.report.speech import seeded_levels

    from alignatt.record.artifacts.evaluation import TailDescription

    tails = {"gold": {"tail": "gold"},
             "noisy": {"tail": "noisy", "tail_noise": {"p_wrong": 0.2, "p_drop": 0.05, "p_split": 0.05}},
             "asr@0.15": {"tail": "asr", "asr_errors": {"committed_wer": 0.15, "p_tail_revise": 0.6, "tail_stages": 3}}}
    config = SimpleNamespace(tail_descriptions={kind: TailDescription.model_validate({**t, "description": kind})
                                                for kind, t in tails.items()})  # as an EvalRecord holds them
    inputs = SimpleNamespace(of_kind=lambda kind: [("outputs/cpu/eval.json", SimpleNamespace(config=config))],
                             smokes=[])
    asr, noisy = seeded_levels(inputs)  # gold seeds nothing
    assert (noisy["tail"], noisy["committed"]) == ("noisy", "0.0 % (gold)") and "replaced 20.0 %" in noisy["errors"]
    assert (asr["tail"], asr["committed"]) == ("asr@0.15", "15.0 % (set)") and "60.0 %" in asr["errors"]
