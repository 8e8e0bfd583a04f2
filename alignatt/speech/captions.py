"""Caption delay: for each source word, the time from its end in the audio to the first reply whose
committed translation covers it.

A reply's `covered_source_units` says how many words of its utterance the committed translation
covers (the AlignAtt policy's alignment of the committed target tokens). Utterances are counted in
the order the replay sent them; a reply arrives `lag_s + rtt_ms` after its update was due (wall
seconds, scaled by the replay speed into stream seconds). Words never covered have no delay and
are counted apart.
"""

from __future__ import annotations

from alignatt.record.events import ReplayEvent


def caption_delays(events: list[ReplayEvent], word_ends_s: list[float], speed: float = 1.0) -> tuple[list[float], int]:
    """The delay (s) of every source word some committed translation covered, and how many were not."""
    first_covered: dict[int, float] = {}
    start = 0  # the open utterance's first word in the stream
    covered: dict[int, int] = {}
    for e in events:
        if not e.is_reply or e.error or e.utterance_id is None or e.stream_s is None:
            continue
        arrived = e.stream_s + ((e.lag_s or 0.0) + (e.rtt_ms or 0.0) / 1000.0) * speed
        done = covered.get(e.utterance_id, 0)
        for k in range(done, e.covered_source_units or 0):
            first_covered.setdefault(start + k, arrived)
        covered[e.utterance_id] = max(done, e.covered_source_units or 0)
        if e.final:  # the next utterance starts after this one's words
            start += e.committed_words or 0
    delays = [round(t - word_ends_s[j], 3) for j, t in sorted(first_covered.items()) if j < len(word_ends_s)]
    return delays, len(word_ends_s) - len(delays)
