"""What a replay run records: its `ReplayEvent`s (`record/events.py`), the retractions in them, and
the flicker of the text they showed (Normalized Erasure) with the held buffer's mean length."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from alignatt.record.events import ReplayEvent


@dataclass
class RunRecord:
    client: str
    events: list[ReplayEvent]
    wall_s: float
    max_lag_s: float
    # A replay told to stop once it fell `stop_lag_s` behind: the stream time it stopped at (None: it
    # ran to the end), and the source words it had committed then (the finals due are theirs).
    stopped_at_s: float | None = None
    committed_words: int | None = None


def count_retractions(events: list[ReplayEvent]) -> int:
    """Replies whose committed_text does not extend the last one shown for the same utterance."""
    shown: dict[Any, str] = {}
    count = 0
    for e in events:
        text = e.committed_text
        if text is None:
            continue
        # A reconnected client starts a new server session seeded with the text it showed.
        key = (e.connection, e.utterance_id)
        if not text.startswith(shown.get(key, "")):
            count += 1
        shown[key] = text
    return count


# Flicker of the shown text. What a client shows of an utterance after each update is its committed
# text followed by the held draft (`buffer_text`); a later update may show a text that no longer
# starts with it, though the committed text never retracts. Normalized Erasure (Arivazhagan et al.,
# "Re-translation versus Streaming for Simultaneous Translation", IWSLT 2020), as the Simulstream
# toolkit of the IWSLT 2026 simultaneous track computes it (`simulstream.metrics.stats`,
# https://github.com/hlt-mt/simulstream): the units deleted from the output over a stream, summed
# over its updates, divided by the units of the final output. Units are words (whitespace-split);
# characters for targets written without spaces (`by_chars`: zh, ja; `evaluate/units.py`).


def _units(text: str, by_chars: bool) -> list[str]:
    return [c for c in text if not c.isspace()] if by_chars else text.split()


def erased_units(before: str, after: str, by_chars: bool = False) -> int:
    """Units of the shown text `before` that the next shown text `after` takes away: those past
    their longest common prefix (spacing normalised), a unit cut inside counted whole (Simulstream
    counts the words of the deleted tokens, so a deleted word piece is a deleted word)."""
    sep = "" if by_chars else " "
    b, a = sep.join(_units(before, by_chars)), sep.join(_units(after, by_chars))
    common = 0
    while common < min(len(a), len(b)) and a[common] == b[common]:
        common += 1
    return len(_units(b[common:], by_chars))


def _shown_texts(events: list[ReplayEvent]) -> list[tuple[tuple, str]] | None:
    """(utterance key, shown text) per translation reply, in order; None if a partial reply did not
    record its buffer (the WhisperLiveKit client's events keep the server's committed text only)."""
    shown = []
    for e in events:
        if not e.is_reply or e.committed_text is None:
            continue  # a client event, or an error reply: nothing new on screen
        if not e.final and e.buffer_text is None:
            return None
        # keyed as count_retractions: a reconnected client's session starts anew
        shown.append(((e.connection, e.utterance_id), e.committed_text + ("" if e.final else e.buffer_text)))
    return shown


def normalized_erasure(events: list[ReplayEvent], by_chars: bool = False) -> float | None:
    """Units erased from the shown text (committed + buffer) between consecutive updates of each
    utterance, summed over the stream, over the units of the utterances' last shown texts (their
    finals). 0: the shown text only ever grew. None: buffers not recorded, or no output."""
    shown = _shown_texts(events)
    if shown is None:
        return None
    last: dict[tuple, str] = {}
    erased = 0
    for key, text in shown:
        if key in last:
            erased += erased_units(last[key], text, by_chars)
        last[key] = text
    final_units = sum(len(_units(t, by_chars)) for t in last.values())
    return round(erased / final_units, 4) if final_units else None


def shown_buffer_units_mean(events: list[ReplayEvent], by_chars: bool = False) -> float | None:
    """Mean units of held draft shown per partial reply (a final shows none). None: not recorded."""
    if _shown_texts(events) is None:
        return None
    sizes = [len(_units(e.buffer_text or "", by_chars)) for e in events
             if e.is_reply and e.committed_text is not None and not e.final]
    return round(sum(sizes) / len(sizes), 2) if sizes else None
