"""The one ASR cursor: where a replay stands after each ASR event, as the update a client sends.

An utterance holds the committed words since the last final; the tail is the words arrived but not
committed. The utterance closes (the update is final) at the commit of a word that ends a
sentence, as WhisperLiveKit's client closes on its punctuation marks, and at the commit of the
stream's last word, so a stream never ends on an open utterance. With `close_on_punctuation=False`
only the last word closes it: a test-set segment is one utterance, whatever marks it holds
inside ("3.5", "Dr."). The server may also close an utterance on its own (a forced final); a
driver that sees one calls `close_utterance`.

An update that would show exactly what the previous one showed (an arrival the tail model hides)
is not sent.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from alignatt.replay.client import update_frame
from alignatt.replay.stream import AsrEvent, ends_sentence

# What the client shows of the true tail: (the true tail, the event's index) -> (the words shown,
# how many source positions they cover). The default shows the tail as it is.
ShowTail = Callable[[list[str], int], tuple[list[str], int]]


def _as_is(tail: list[str], n: int) -> tuple[list[str], int]:
    return tail, len(tail)


@dataclass(frozen=True)
class CursorStep:
    """One update to send, and the stream's state when it is sent."""

    event: AsrEvent
    seq: int
    utterance_id: int
    words: list[str]  # the open utterance's committed words
    tail: list[str]  # the tail shown
    final: bool
    committed: int  # source words committed so far in the whole stream
    arrived: int  # source words arrived so far in the whole stream
    read: int  # committed plus the tail positions shown (SimulEval's delay unit)

    def frame(self, clock: bool = True) -> dict[str, Any]:
        """The protocol-v1 update frame; `clock` stamps it with the event's stream time."""
        clock_ms = round(self.event.t * 1000.0, 1) if clock else None
        return update_frame(self.seq, self.words, self.tail, self.final, self.utterance_id, clock_ms)


class UpdateCursor:
    def __init__(self, words: list[str], close_on_punctuation: bool = True, show: ShowTail = _as_is) -> None:
        self.words = words
        self.close_on_punctuation = close_on_punctuation
        self.show = show
        self.seq = self.uid = self.utt_start = self.committed = self.arrived = 0
        self.events_seen = 0
        self._sent: tuple[int, list[str], bool] | None = None

    def closes(self, index: int) -> bool:
        """Whether committing word `index` closes the open utterance."""
        return index == len(self.words) - 1 or (self.close_on_punctuation and ends_sentence(self.words[index]))

    def step(self, ev: AsrEvent) -> CursorStep | None:
        """The update this event calls for, or None when there is nothing new to show."""
        n = self.events_seen
        self.events_seen += 1
        final = False
        if ev.kind == "arrive":
            self.arrived = ev.index + 1
        else:
            self.committed = ev.index + 1
            final = self.closes(ev.index)
        if ev.tail is not None:  # a recognised stream: its own hypothesis past the committed words
            self.arrived = self.committed + len(ev.tail)
        open_words = self.words[self.utt_start:self.committed]
        true_tail = list(ev.tail) if ev.tail is not None else self.words[self.committed:self.arrived]
        tail, covered = self.show([] if final else true_tail, n)
        if not open_words and not tail:
            return None
        if (len(open_words), tail, final) == self._sent:
            return None
        self._sent = (len(open_words), tail, final)
        self.seq += 1
        return CursorStep(ev, self.seq, self.uid, open_words, tail, final, self.committed, self.arrived,
                          self.committed + covered)

    def close_utterance(self) -> None:
        """The open utterance became final: the next words start a new one."""
        self.uid += 1
        self.utt_start = self.committed
        self._sent = None
