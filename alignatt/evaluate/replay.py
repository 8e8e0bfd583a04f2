"""ASR-like replay of a source stream through the server's `Session`, in-process or over WebSocket.

Word i is spoken during [i, i + 1) / words_per_second; it reaches the tail at the end of its speech
(`Schedule.visible_at`) and is committed commit_lag_seconds later. Every ASR event becomes one
update carrying the open utterance's state (committed words + tail), in lockstep: the next update
is sent after the reply. An utterance closes (`is_final`) at the commit of the stream's last word,
or, in the long form, by a rule a real client can follow: at a committed word whose text, as the
recogniser wrote it, ends a sentence (WhisperLiveKit's client closes on its punctuation marks), and
where the session forces a final on its own. The reference's segment ends close an utterance only
in the labelled oracle comparison (`oracle_ends`).

What the client sees is the tail model's view (`alignatt.evaluate.tails`: the gold words, an
ASR-like transcript with errors in committed words too, a seeded noisy tail, or no tail); an update
that would show exactly what the previous one did (an arrival with no tail shown) is not sent. Each step records the source words *read*: committed
plus the tail positions shown (SimulEval's delay unit).

Every driver answers the same `Reply`, so one loop (`replay`) drives any of them:
- `InProcessDriver`: a `Session` built exactly as the server builds one for a preset;
- `WebSocketDriver`: protocol v1 frames to a running `alignatt serve` (e.g. a `ServerThread`);
- `WlkDriver` (`alignatt.evaluate.wlk_driver`): WhisperLiveKit's own client to a `ServerThread`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol

from alignatt.core.draft import Seam
from alignatt.core.errors import AlignattError
from alignatt.evaluate.tails import TailModel
from alignatt.replay.client import ProtocolClient
from alignatt.replay.stream import AsrEvent
from alignatt.serve.config import ServerLimits, resolve_preset
from alignatt.serve.session import Session, SessionConfig


class Schedule:
    """ASR pacing: words per second, the lag from a word's arrival in the tail to its commit, and
    whether a word reaches the tail at the end of its speech (`end`: a recogniser cannot know a word
    before it is spoken) or at its onset (`onset`: the schedule of the committed H200 artifacts)."""

    def __init__(self, words_per_second: float = 2.4, commit_lag_seconds: float = 2.0,
                 visible_at: str = "end") -> None:
        if words_per_second <= 0 or commit_lag_seconds < 0:
            raise AlignattError("words per second must be > 0 and the commit lag >= 0")
        if visible_at not in ("end", "onset"):
            raise AlignattError(f"tail words become visible at their end or onset, not {visible_at!r}")
        self.words_per_second = words_per_second
        self.commit_lag_seconds = commit_lag_seconds
        self.visible_at = visible_at

    def visible_s(self, index: int) -> float:
        """When word `index` (spoken during [index, index + 1) / words_per_second) reaches the tail."""
        return (index + (1 if self.visible_at == "end" else 0)) / self.words_per_second

    def events(self, words: list[str]) -> list[AsrEvent]:
        events = []
        for i in range(len(words)):
            arrive = self.visible_s(i)
            events += [AsrEvent(arrive, "arrive", i), AsrEvent(arrive + self.commit_lag_seconds, "commit", i)]
        # On a tie the commit goes first: the ASR settles old words before showing new ones.
        return sorted(events, key=lambda e: (e.t, e.kind != "commit", e.index))

    def source_ms(self, n_words: int) -> float:
        """Source duration: word i is spoken during [i, i + 1) / words_per_second."""
        return n_words / self.words_per_second * 1000.0


@dataclass
class Reply:
    utterance_id: int
    final: bool
    committed_text: str  # the utterance's accepted target (append-only)
    buffer_text: str  # drafted but held, shown to the user as the unstable part
    path: str
    engine_calls: int
    compute_ms: float  # inside the session (drafting included)
    round_trip_ms: float  # as the driver saw it (in-process: the same as compute_ms)


@dataclass
class ReplayStep:
    """One update and its reply, with the ASR state at that moment."""

    stream_ms: float  # when the ASR event happened (stream time)
    trigger: str  # arrive | commit
    committed_words: int  # source words committed so far in the whole stream
    arrived_words: int  # source words arrived so far in the whole stream
    is_final: bool  # the update closed the utterance
    reply: Reply
    read_words: int = -1  # committed + tail positions shown (-1: not recorded, read as arrived)
    close: str = ""  # why the utterance closed here: end | punctuation | oracle | server ("" open)

    def __post_init__(self) -> None:
        if self.read_words < 0:
            self.read_words = self.arrived_words


class Driver(Protocol):
    name: str

    def open(self) -> None: ...

    def update(self, committed: list[str], tail: list[str], is_final: bool, utterance_id: int) -> Reply: ...

    def close(self) -> None: ...


def session_config(preset: str, limits: ServerLimits | None = None,
                   settle_buffer_tokens: int | None = None) -> SessionConfig:
    """The `SessionConfig` the server gives a session of this preset (serve/admission.py `_open`),
    `settle_buffer_tokens` its `ServerConfig.settle_buffer_tokens` (`serve.config.served_settle`)."""
    p = resolve_preset(preset)
    limits = limits or ServerLimits()
    return SessionConfig(policy=p.policy, max_new_tokens=p.max_new_tokens, limits=limits,
                         settle_buffer_tokens=settle_buffer_tokens)


class InProcessDriver:
    name = "inprocess"

    def __init__(self, seam: Seam, preset: str, source_lang: str = "en", target_lang: str = "de",
                 settle_buffer_tokens: int | None = None) -> None:
        """`settle_buffer_tokens`: drafts settled as the server settles them (None: whole drafts)."""
        self.seam, self.preset = seam, preset
        self.source_lang, self.target_lang = source_lang, target_lang
        self.config = session_config(preset, settle_buffer_tokens=settle_buffer_tokens)
        self.session: Session | None = None

    def open(self) -> None:
        self.session = Session(self.seam, self.config, self.source_lang, self.target_lang)

    def update(self, committed, tail, is_final, utterance_id) -> Reply:
        started = time.perf_counter()
        step = self.session.update(committed, tail, is_final, utterance_id)
        rtt = (time.perf_counter() - started) * 1000.0
        # The server strips committed_text in its frame; so does this driver.
        return Reply(step.utterance_id, step.final, step.committed_text.strip(), step.buffer_text,
                     step.path, step.engine_calls, step.elapsed_ms, rtt)

    def close(self) -> None:
        self.session = None


class WebSocketDriver:
    name = "websocket"

    def __init__(self, url: str, preset: str, source_lang: str = "en", target_lang: str = "de",
                 timeout_s: float = 600.0) -> None:
        self.url, self.preset = url, preset
        self.source_lang, self.target_lang = source_lang, target_lang
        self.timeout_s = timeout_s
        self.client: ProtocolClient | None = None

    def open(self) -> None:
        self.client = ProtocolClient.connect(self.url, timeout=self.timeout_s, open_timeout=30)
        self.client.open(self.source_lang, self.target_lang, preset=self.preset)

    def update(self, committed, tail, is_final, utterance_id) -> Reply:
        started = time.perf_counter()
        reply = self.client.ask(committed, tail, is_final, utterance_id)
        if reply.get("type") == "error":
            raise AlignattError(f"server error on seq {self.client.seq}: {reply.get('code')}: {reply.get('message')}")
        rtt = (time.perf_counter() - started) * 1000.0
        return Reply(reply["utterance_id"], reply["final"], reply["committed_text"], reply["buffer_text"],
                     reply.get("path", ""), reply.get("engine_calls", 0), reply.get("compute_ms", 0.0), rtt)

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
            self.client = None


SEGMENTATIONS = ("punctuation", "oracle")


def replay(words: list[str], driver: Driver, schedule: Schedule, close_on_punctuation: bool = False,
           tail_model: TailModel | None = None, stream_id: str = "",
           oracle_ends: list[int] | None = None) -> list[ReplayStep]:
    """Replay one stream (a sentence, or a talk) through the driver; one step per sent update.
    `stream_id` keys the recogniser's draws, so every preset sees the same ASR on one stream.

    Where an utterance closes (the step's `close`): at the stream's last word (`end`); with
    `close_on_punctuation`, at a committed word whose text, as the client sees it (the ASR-like
    transcript's marks, errors included), ends a sentence (`punctuation`); with `oracle_ends` (gold
    word counts at which the reference segments end: the labelled oracle comparison) there and
    nowhere else (`oracle`); and where the session forced a final on its own (`server`)."""
    view = (tail_model or TailModel("gold")).view(words, stream_id)
    oracle = set(oracle_ends or ())
    steps: list[ReplayStep] = []
    uid = utt_start = committed = arrived = 0
    sent: tuple | None = None
    driver.open()
    try:
        for n, ev in enumerate(schedule.events(words)):
            close = ""
            if ev.kind == "arrive":
                arrived = ev.index + 1
            else:
                committed = ev.index + 1
                if committed == len(words):
                    close = "end"
                elif oracle_ends is not None:
                    close = "oracle" if committed in oracle else ""
                elif close_on_punctuation and view.ends_sentence(committed):
                    close = "punctuation"
            open_tokens = view.committed(utt_start, committed)
            if close:
                tail, covered = [], 0
            else:
                ages = [ev.t - schedule.visible_s(i) for i in range(committed, arrived)]
                tail, covered = view.tail(committed, arrived, ages, n)
            if not open_tokens and not tail:
                continue
            if (len(open_tokens), tail, bool(close)) == sent:
                continue
            sent = (len(open_tokens), tail, bool(close))
            reply = driver.update(open_tokens, tail, bool(close), uid)
            if not close and reply.final:
                close = "server"  # the session forced a final on a long utterance
            steps.append(ReplayStep(round(ev.t * 1000.0, 3), ev.kind, committed, arrived, bool(close), reply,
                                    committed + covered, close))
            if close:
                uid, utt_start, sent = uid + 1, committed, None
    finally:
        driver.close()
    return steps
