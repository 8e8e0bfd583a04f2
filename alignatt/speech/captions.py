"""Caption delay: for each source word, the time from its end in the audio to the first reply whose
committed translation covers it.

A reply's `covered_source_units` says how many words of its utterance the committed translation
covers (the AlignAtt policy's alignment of the committed target tokens). Utterances are counted in
the order the replay sent them; a reply arrives `lag_s + rtt_ms` after its update was due (wall
seconds, scaled by the replay speed into stream seconds). Words never covered have no delay and
are counted apart.

When a word's translation was first *shown* is looser: the held draft shown past the committed
text has no per-word alignment. `word_times` takes the first reply, to an update that carried the
word (committed or in the tail), whose shown translation (committed + held) had more words than
any earlier reply of its utterance: when new translation appeared once the word was heard, not
proof that it translates that word.
"""

from __future__ import annotations

from alignatt.record.events import ReplayEvent


def _arrived(e: ReplayEvent, speed: float) -> float:
    return (e.stream_s or 0.0) + ((e.lag_s or 0.0) + (e.rtt_ms or 0.0) / 1000.0) * speed


def word_times(events: list[ReplayEvent], speed: float = 1.0) -> tuple[dict[int, float], dict[int, float]]:
    """Per source word of the stream (its index): when its translation was first shown, and when a
    committed translation first covered it (stream seconds)."""
    shown_at: dict[int, float] = {}
    committed_at: dict[int, float] = {}
    start = 0  # the open utterance's first word in the stream
    covered: dict[int, int] = {}
    longest: dict[int, int] = {}  # the most words of translation an utterance has shown
    for e in events:
        if not e.is_reply or e.error or e.utterance_id is None or e.stream_s is None:
            continue
        arrived = _arrived(e, speed)
        shown = len(f"{e.committed_text or ''} {e.buffer_text or ''}".split())
        if shown > longest.get(e.utterance_id, 0):
            longest[e.utterance_id] = shown
            for k in range((e.committed_words or 0) + (e.tail_words or 0)):
                shown_at.setdefault(start + k, arrived)
        done = covered.get(e.utterance_id, 0)
        for k in range(done, e.covered_source_units or 0):
            committed_at.setdefault(start + k, arrived)
            shown_at.setdefault(start + k, arrived)  # a committed translation is shown too
        covered[e.utterance_id] = max(done, e.covered_source_units or 0)
        if e.final:  # the next utterance starts after this one's words
            start += e.committed_words or 0
    return shown_at, committed_at


def caption_delays(events: list[ReplayEvent], word_ends_s: list[float], speed: float = 1.0) -> tuple[list[float], int]:
    """The delay (s) of every source word some committed translation covered, and how many were not."""
    _, first_covered = word_times(events, speed)
    delays = [round(t - word_ends_s[j], 3) for j, t in sorted(first_covered.items()) if j < len(word_ends_s)]
    return delays, len(word_ends_s) - len(delays)
