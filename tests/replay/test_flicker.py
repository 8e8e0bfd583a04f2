"""Flicker of the shown text (committed + buffer): Normalized Erasure, on hand-computed updates."""

from __future__ import annotations

import pytest

from alignatt.record.events import ReplayEvent
from alignatt.replay.events import erased_units, normalized_erasure, shown_buffer_units_mean


def _reply(uid, committed, buffer="", final=False, **kw):
    return ReplayEvent(utterance_id=uid, committed_text=committed, buffer_text="" if final else buffer,
                       final=final, **kw)


@pytest.mark.parametrize("before, after, by_chars, erased", [
    ("Das Haus ist", "Das Haus war gut", False, 1),  # "ist" replaced
    ("Das Haus", "Das Haus ist", False, 0),  # only grew
    ("Das Haus", "Das Hund", False, 1),  # a word cut inside counts whole
    ("Das Hausboot ist", "Das Haus", False, 2),  # "Hausboot" cut to "Haus", "ist" gone
    (" Das  Haus ", "Das Haus", False, 0),  # spacing is no erasure
    ("Das Haus ist groß", "", False, 4),
    ("我们今天去", "我们明天", True, 3),  # characters (zh): 今天去 -> 明天
    ("我们 今天", "我们今天好", True, 0),
])
def test_erased_units(before, after, by_chars, erased):
    assert erased_units(before, after, by_chars) == erased


def test_normalized_erasure_of_a_hand_made_stream():
    events = [
        _reply(0, "", " Das Haus ist", seq=1),
        _reply(0, "Das", " Haus war", seq=2),  # erases "ist": 1
        ReplayEvent(seq=3, error="busy", message="later"),  # an error reply shows nothing new
        _reply(0, "Das Haus", " war schön", seq=4),  # 0
        _reply(0, "Das Haus war gut.", final=True, seq=5),  # erases "schön": 1
        ReplayEvent(event="disconnect"),
        _reply(1, "", " Ja", seq=6),  # a new utterance erases nothing of the last one
        _reply(1, "Ja.", final=True, seq=7),  # "Ja" -> "Ja.": grew
    ]
    # 2 words erased over 4 + 1 final words
    assert normalized_erasure(events) == pytest.approx(0.4)
    # buffers on the partials: 3, 2, 2, 1 words
    assert shown_buffer_units_mean(events) == pytest.approx(2.0)


def test_a_stream_that_only_grows_has_no_erasure():
    events = [_reply(0, "", " Das"), _reply(0, "Das", " Haus"), _reply(0, "Das Haus", ""),
              _reply(0, "Das Haus ist", final=True)]
    assert normalized_erasure(events) == 0.0
    assert shown_buffer_units_mean(events) == 0.67  # 1, 1, 0 words, rounded


def test_erasure_counts_what_was_shown_not_only_the_committed_text():
    # committed text is append-only, so no retraction; the shown buffer flickers all the same
    events = [_reply(0, "", " A B C"), _reply(0, "", " D E"), _reply(0, "", " A B"), _reply(0, "A B", final=True)]
    assert normalized_erasure(events) == pytest.approx((3 + 2) / 2)


def test_without_recorded_buffers_nothing_is_claimed():
    events = [ReplayEvent(utterance_id=0, committed_text="", final=False), _reply(0, "Das", final=True)]
    assert normalized_erasure(events) is None
    assert shown_buffer_units_mean(events) is None
    assert normalized_erasure([]) is None
