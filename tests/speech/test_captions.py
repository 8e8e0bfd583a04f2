"""Caption delay: each source word's audio end to the first reply whose committed translation covers
it, across utterances; a smoke on a bundled recognised stream reports it with the recogniser's figures."""

from alignatt.measure.smoke import SmokeOptions, run_smoke
from alignatt.record.events import ReplayEvent
from alignatt.speech.captions import caption_delays
from tests.support.server_client import FakeFactory


def _reply(stream_s, utterance, committed, covered, final=False, rtt_ms=100.0, lag_s=0.0):
    return ReplayEvent(client="native", stream_s=stream_s, lag_s=lag_s, rtt_ms=rtt_ms, utterance_id=utterance,
                       committed_words=committed, covered_source_units=covered, final=final)


def test_each_word_is_timed_to_the_first_reply_that_covers_it():
    ends = [0.5, 1.0, 1.5, 2.0, 2.5]  # "a b c." then "d e."
    events = [_reply(1.0, 0, 2, 1), _reply(2.0, 0, 3, 1), _reply(2.5, 0, 3, 3, final=True, lag_s=0.4),
              _reply(3.0, 1, 1, 0), _reply(3.5, 1, 2, 2, final=True),
              ReplayEvent(client="native", event="disconnect", stream_s=4.0)]  # no reply: skipped
    delays, uncovered = caption_delays(events, ends)
    # word 0 at 1.0 + 0.1; words 1, 2 at 2.5 + 0.4 + 0.1; words 3, 4 at 3.5 + 0.1
    assert delays == [0.6, 2.0, 1.5, 1.6, 1.1] and uncovered == 0
    assert caption_delays(events, ends, speed=2.0)[0][0] == 0.7  # wall seconds count double at 2x
    assert caption_delays(events[:3], ends)[1] == 2  # the second utterance never answered


def test_a_smoke_on_a_recognised_stream_reports_what_a_viewer_saw(tmp_path):
    a = run_smoke(SmokeOptions(model="gemma4-e4b-synthetic", seam="fake", speed=20.0, client="native",
                               stream="speech:beckett"), tmp_path / "smoke.json", seam_factory=FakeFactory())
    speech = a.config.speech
    assert speech["clip"]["package"] == "moonshine-voice==0.1.5" and "word_ends_s" not in speech
    assert speech["caption_words"] + speech["words_never_covered"] == a.config.stream_words == 12
    assert speech["caption_delay_s_p50"] is not None and speech["caption_delay_s_p95"] >= speech["caption_delay_s_p50"]
    assert a.retractions == 0 and a.finals >= 6  # six sentences, each closed at its mark


def test_the_page_says_what_a_speech_smoke_measured_and_that_quality_is_not_scored(tmp_path):
    from alignatt.report.page import speech_note

    a = run_smoke(SmokeOptions(model="gemma4-e4b-synthetic", seam="fake", speed=20.0, client="native",
                               stream="speech:phone_call"), tmp_path / "smoke.json", seam_factory=FakeFactory())
    [note] = speech_note(a)
    assert "committed WER 17.3 %" in note and "caption delay" in note and "quality is not scored" in note
    assert speech_note(run_smoke(SmokeOptions(model="gemma4-e4b-synthetic", seam="fake", speed=60.0,
                                              client="native"), None, seam_factory=FakeFactory())) == []
