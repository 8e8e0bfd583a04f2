"""From replay steps to what the user saw: each target unit's emission, retractions, replaced drafts.

A target unit (a word; a character for zh/ja targets) is emitted by the first step whose committed
text contains it. It gets that step's ASR state (source words committed, arrived, and read: committed plus the
tail positions the translator was shown, SimulEval's delay unit) and three times:
- computation-unaware (CU): the stream time of the ASR event that triggered the update;
- computation-aware, real-time queue (`ca_ms`, the page's "CA"): when its reply was ready on a
  real-time clock where the engine serves the stream's updates one at a time (an update starts at
  max(its event time, the end of the previous one) and takes the round trip the driver measured):
  what a user of a live server sees; compute hides in the gaps between ASR events;
- computation-aware as SimulEval computes it (`sim_ca_ms`): the stream time plus all the compute
  since the stream began (SimulEval's `elapsed`: source read + wall time since the instance
  started, its source fed as fast as the agent reads it), so no compute hides.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from alignatt.evaluate.replay import ReplayStep
from alignatt.evaluate.units import CHAR_LANGS
from alignatt.record.events import ReplayEvent
from alignatt.replay.events import count_retractions


def units(text: str, target_lang: str) -> list[str]:
    if target_lang in CHAR_LANGS:
        return [c for c in text if not c.isspace()]
    return text.split()


def join_units(texts: list[str], target_lang: str) -> str:
    sep = "" if target_lang in CHAR_LANGS else " "
    return sep.join(t.strip() for t in texts if t.strip())


@dataclass
class Emission:
    text: str
    committed_words: int
    arrived_words: int
    cu_ms: float
    ca_ms: float
    read_words: int = -1  # committed + tail shown when it was written (-1: not recorded, = arrived)
    sim_ca_ms: float = -1.0  # SimulEval's computation-aware time (-1: not recorded, = ca_ms)

    def __post_init__(self) -> None:
        if self.read_words < 0:
            self.read_words = self.arrived_words
        if self.sim_ca_ms < 0:
            self.sim_ca_ms = self.ca_ms


@dataclass
class StreamOutput:
    """One replayed stream: its hypothesis, per-unit emissions and display statistics."""

    hypothesis: str
    utterances: list[str]  # each closed utterance's final committed text, in order
    emissions: list[Emission]
    retractions: int
    buffer_units_shown: int
    buffer_units_replaced: int
    updates: int
    engine_calls: int
    paths: dict[str, int] = field(default_factory=dict)
    wall_ms: float = 0.0  # sum of the driver's round trips


def computation_aware_ms(steps: list[ReplayStep]) -> list[float]:
    ready, clock = [], 0.0
    for s in steps:
        clock = max(s.stream_ms, clock) + s.reply.round_trip_ms
        ready.append(round(clock, 3))
    return ready


def simuleval_ca_ms(steps: list[ReplayStep]) -> list[float]:
    """SimulEval's computation-aware time of each step: its stream time plus every round trip since
    the stream began, this one included."""
    out, spent = [], 0.0
    for s in steps:
        spent += s.reply.round_trip_ms
        out.append(round(s.stream_ms + spent, 3))
    return out


def stream_output(steps: list[ReplayStep], target_lang: str) -> StreamOutput:
    ca = computation_aware_ms(steps)
    sim = simuleval_ca_ms(steps)
    final_text: dict[int, str] = {}
    for s in steps:  # the last text of each utterance is what stays on screen
        final_text[s.reply.utterance_id] = s.reply.committed_text
    emissions: list[Emission] = []
    shown_units: dict[int, int] = {}
    shown = replaced = 0
    for s, ready, sim_ready in zip(steps, ca, sim):
        uid, text = s.reply.utterance_id, s.reply.committed_text
        have = units(text, target_lang)
        for u in have[shown_units.get(uid, 0):]:
            emissions.append(Emission(u, s.committed_words, s.arrived_words, s.stream_ms, ready, s.read_words,
                                      sim_ready))
        shown_units[uid] = max(shown_units.get(uid, 0), len(have))
        buffer = units(s.reply.buffer_text, target_lang)
        if buffer and not s.reply.final:
            later = units(final_text[uid], target_lang)[len(have):]
            kept = 0
            while kept < min(len(buffer), len(later)) and buffer[kept] == later[kept]:
                kept += 1
            shown += len(buffer)
            replaced += len(buffer) - kept
    paths: dict[str, int] = {}
    for s in steps:
        paths[s.reply.path] = paths.get(s.reply.path, 0) + 1
    utterances = [final_text[k] for k in sorted(final_text)]
    events = [ReplayEvent(utterance_id=s.reply.utterance_id, committed_text=s.reply.committed_text) for s in steps]
    return StreamOutput(
        hypothesis=join_units(utterances, target_lang),
        utterances=utterances,
        emissions=emissions,
        retractions=count_retractions(events),
        buffer_units_shown=shown,
        buffer_units_replaced=replaced,
        updates=len(steps),
        engine_calls=sum(s.reply.engine_calls for s in steps),
        paths=dict(sorted(paths.items())),
        wall_ms=round(sum(s.reply.round_trip_ms for s in steps), 3),
    )
