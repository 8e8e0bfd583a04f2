"""A recognised stream (`timeline`): the cursor sends the recogniser's own tail, closes utterances at
the committed sentence ends inside a step, and a timeline that goes back or does not commit the
whole text is refused."""

import pytest
from pydantic import ValidationError

from alignatt.replay.cursor import UpdateCursor
from alignatt.replay.stream import SmokeStream, asr_events


def _stream(timeline) -> SmokeStream:
    return SmokeStream(words_per_second=2.0, commit_lag_seconds=1.0, text="Hello there. How are you?",
                       timeline=timeline)


def test_the_recognisers_tail_is_sent_and_sentences_close_inside_a_step():
    stream = _stream([{"t": 1.0, "committed": 0, "tail": ["Hello", "the"]},
                      {"t": 2.0, "committed": 3, "tail": ["our", "shoe"]},  # "there." closes mid-step
                      {"t": 2.5, "committed": 3, "tail": ["are", "you?"]},  # the tail revised
                      {"t": 3.0, "committed": 5, "tail": []}])
    cursor, sent = UpdateCursor(stream.words), []
    for ev in asr_events(stream):
        step = cursor.step(ev)
        if step is None:
            continue
        sent.append((ev.t, step.utterance_id, step.words, step.tail, step.final))
        if step.final:
            cursor.close_utterance()
    assert sent == [
        (1.0, 0, [], ["Hello", "the"], False),
        (2.0, 0, ["Hello", "there."], [], True),
        (2.0, 1, ["How"], ["our", "shoe"], False),
        (2.5, 1, ["How"], ["are", "you?"], False),
        (3.0, 1, ["How", "are", "you?"], [], True),
    ]


@pytest.mark.parametrize("timeline", [
    [{"t": 2.0, "committed": 2}, {"t": 1.0, "committed": 5}],  # time goes back
    [{"t": 1.0, "committed": 3}, {"t": 2.0, "committed": 2}, {"t": 3.0, "committed": 5}],  # a commit undone
    [{"t": 1.0, "committed": 4}],  # the last word never committed
])
def test_a_timeline_that_goes_back_or_stops_short_is_refused(timeline):
    with pytest.raises(ValidationError, match="timeline"):
        _stream(timeline)
