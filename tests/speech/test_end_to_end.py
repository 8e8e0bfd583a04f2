"""The end-to-end run read off its frames: hand-made relay frames and WhisperLiveKit messages, with
the figures worked out by hand (audio clock = (relay time - feed start) x speed)."""

from __future__ import annotations

import pytest

from alignatt.speech.end_to_end import measure
from alignatt.speech.wlk_server import Frame

BEGAN = 2.0  # the feed began at relay time 2.0 s
SPEED = 0.5


def up(t, seq, utt, words, final=False, tail=(), connection=0):
    data = {"type": "update", "seq": seq, "utterance_id": utt, "words": [list(w) for w in words], "is_final": final}
    if tail:
        data["tail"] = {"words": [[w, None, None] for w in tail]}
    return Frame(t, "up", data, connection)


def down(t, seq, utt, committed, covered, final=False, buffer="", connection=0):
    return Frame(t, "down", {"type": "translation", "seq": seq, "utterance_id": utt, "final": final,
                             "committed_text": committed, "committed_delta": "", "buffer_text": buffer,
                             "covered_source_units": covered}, connection)


EVER_TRIED = [("Ever", 0.0, 400.0), ("tried.", 400.0, 900.0)]
EVER_FAILED = [("Ever", 1000.0, 1300.0), ("failed.", 1300.0, 1800.0)]


def frames():
    return [
        Frame(0.5, "up", {"type": "init", "protocol_version": 1}, 0),
        Frame(0.6, "down", {"type": "init_ok"}, 0),
        up(1.0, 0, 0, [], tail=["warm"]),  # before the feed: not measured
        down(1.1, 0, 0, "", 0),
        up(3.0, 1, 0, EVER_TRIED[:1], tail=["tried"]),
        down(3.2, 1, 0, "Immer", 1, buffer="versucht"),
        up(4.0, 2, 0, EVER_TRIED, final=True),
        down(4.5, 2, 0, "Immer versucht.", 2, final=True),
        up(5.0, 3, 1, EVER_FAILED, final=True),
        down(5.4, 3, 1, "Immer", 1, final=True),  # "failed." never covered
    ]


SHOWN = [{"t": 0.5, "lines": [{"text": "Ever"}]}, {"t": 1.0, "type": "status"},
         {"t": 2.0, "lines": [{"text": "Ever tried."}, {"text": " Ever failed.", "translation": "Immer"}]}]


def test_each_word_is_timed_from_its_audio_end_to_its_first_covering_reply_on_the_audio_clock():
    run = measure(frames(), SHOWN, BEGAN, SPEED)
    # covered at (reply time - 2.0) x 0.5: 0.6, 1.25, 1.7; never for the 4th word
    assert run.words == [("Ever", 0.4, 0.6), ("tried.", 0.9, 1.25), ("Ever", 1.3, 1.7), ("failed.", 1.8, None)]
    assert run.delays_s == [pytest.approx(0.2), pytest.approx(0.35), pytest.approx(0.4)]
    assert run.never_covered == 1


def test_round_trips_replies_and_what_was_shown_are_counted_from_the_feed_on():
    run = measure(frames(), SHOWN, BEGAN, SPEED)
    assert run.updates == 3 and len(run.replies) == 3 and run.finals == 2
    assert run.replies_with_committed_text == 3
    assert run.rtt_ms == [200.0, 500.0, 400.0]  # wall time at the relay, not scaled
    assert [e.committed_words for e in run.events] == [1, 2, 2] and run.events[0].tail_words == 1
    assert run.shown_translations == 1
    assert (run.source_retractions, run.transcript_retractions, run.translation_retractions) == (0, 0, 0)
    assert run.errors == []


def test_retractions_are_counted_on_the_source_the_transcript_and_the_translation():
    bad = frames()[:6] + [up(3.6, 2, 0, [("Never", 0.0, 400.0)]),  # the committed source word changed
                          down(3.8, 2, 0, "Nie", 1)]  # and the committed translation with it
    shown = [{"lines": [{"text": "Ever tried."}]}, {"lines": [{"text": "Ever"}]}]
    run = measure(bad, shown, BEGAN, SPEED)
    assert (run.source_retractions, run.transcript_retractions, run.translation_retractions) == (1, 1, 1)


def test_an_error_frame_is_an_event_and_counted_but_no_reply_with_text():
    err = frames()[:5] + [Frame(3.3, "down", {"type": "error", "code": "processing_failed", "message": "x",
                                               "seq": 1}, 0)]
    run = measure(err, [], BEGAN, SPEED)
    assert run.errors == ["processing_failed"] and len(run.events) == 1 and run.events[0].error == "processing_failed"
    assert run.replies == [] and run.replies_with_committed_text == 0
    assert run.words == [("Ever", 0.4, None)] and run.never_covered == 1


def test_a_reconnected_client_keeps_its_connections_apart():
    """Seq numbers restart nowhere, but a reply is matched to the update of its own connection."""
    two = [up(3.0, 1, 0, EVER_TRIED, final=True, connection=0), up(3.0, 1, 0, EVER_FAILED, final=True, connection=1),
           down(3.4, 1, 0, "Immer versucht.", 2, final=True, connection=1)]
    run = measure(two, [], BEGAN, SPEED)
    assert len(run.events) == 1 and run.events[0].connection == 1
    assert [w for w, _, _ in run.words][:2] == ["Ever", "failed."]  # the closed utterance first
    assert run.words[0][2] == pytest.approx(0.7)
