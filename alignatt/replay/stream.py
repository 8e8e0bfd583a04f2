"""The ASR stream a replay plays, and its schedule.

The stream (`alignatt/data/mt_server_smoke_stream.json`) is replayed as an ASR would produce it:
word i arrives as unstable tail at i / words_per_second and is committed commit_lag_seconds later
(`asr_events`); `replay/cursor.py` says when an utterance closes. With 2.4 words/s and a 2.0 s lag,
arrivals and commits interleave, so every commit that follows an arrival moves only the frontier
over an unchanged source text: the server's commit fast path.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from alignatt.core.errors import AlignattError

SENTENCE_MARKS = set(".!?。！？")  # WhisperLiveKit's PUNCTUATION_MARKS


class TimedStep(BaseModel):
    """One step of a recogniser run live: what it showed, and when."""

    model_config = ConfigDict(extra="forbid")

    t: float = Field(ge=0)  # stream seconds: the audio heard so far plus the recogniser's own time
    committed: int = Field(ge=0)  # words of the stream's text committed so far (they never change)
    tail: list[str] = Field(default_factory=list)  # the unstable hypothesis shown past them


class SmokeStream(BaseModel):
    """A replayed ASR stream. Scripted (no `timeline`): word i arrives as tail at i / words_per_second
    and is committed `commit_lag_seconds` later, the tail being the words themselves. Recognised
    (`timeline`, from `alignatt speech-stream`): the recogniser's own steps, its tail its own
    hypothesis, which may differ from the words it commits later."""

    model_config = ConfigDict(extra="ignore")

    description: str = ""
    words_per_second: float = Field(gt=0)
    commit_lag_seconds: float = Field(ge=0)
    replay_speed: float = Field(4.0, gt=0)
    text: str = Field(min_length=1)
    timeline: list[TimedStep] | None = None
    recognised: dict[str, Any] | None = None  # a recognised stream's source: clip, recogniser, its cost, WER

    @model_validator(mode="after")
    def _timeline_goes_forward(self) -> "SmokeStream":
        steps = self.timeline or []
        for before, after in zip(steps, steps[1:]):
            if after.t < before.t or after.committed < before.committed:
                raise ValueError(f"timeline: a step at {after.t} s goes back (time or committed words)")
        if steps and steps[-1].committed != len(self.words):
            raise ValueError(f"timeline: commits {steps[-1].committed} words, the text has {len(self.words)}")
        return self

    @property
    def words(self) -> list[str]:
        return self.text.split()

    def first_sentences(self, n: int) -> "SmokeStream":
        """The same stream cut after its n-th sentence mark (the marks kept: each one closes an utterance)."""
        if n < 1:
            raise AlignattError(f"first_sentences: n must be at least 1, got {n}")
        words, seen = self.words, 0
        for i, word in enumerate(words):
            seen += ends_sentence(word)
            if seen == n:
                return self.model_copy(update={"text": " ".join(words[: i + 1])})
        raise AlignattError(f"the stream has {seen} sentences, fewer than {n}")


SPEECH_PREFIX = "speech:"  # speech:<clip>: the clip's recognised stream, bundled (alignatt speech-stream)


def load_stream(path: str | None = None) -> SmokeStream:
    from importlib import resources

    if path is None:
        text = (resources.files("alignatt") / "data" / "mt_server_smoke_stream.json").read_text()
        where = "bundled smoke stream"
    elif path.startswith(SPEECH_PREFIX):
        clip = path[len(SPEECH_PREFIX):]
        folder = resources.files("alignatt") / "data" / "speech"
        bundled = folder / f"{clip}.json"
        if not clip or not bundled.is_file():
            made = ", ".join(sorted(f.name.removesuffix(".json") for f in folder.iterdir() if f.name.endswith(".json")))
            raise AlignattError(f"no recognised stream for clip {clip!r}: the bundled ones are {made} (a clip's "
                                "stream is made with `alignatt speech-stream --clip NAME`)")
        text, where = bundled.read_text(encoding="utf-8"), path
    else:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as e:
            raise AlignattError(f"cannot read stream {path}: {e.strerror}") from None
        where = path
    try:
        return SmokeStream.model_validate_json(text)
    except ValidationError as e:
        first = e.errors()[0]
        raise AlignattError(f"{where}: {'.'.join(map(str, first['loc']))}: {first['msg']}") from None


def ends_sentence(word: str) -> bool:
    return any(ch in SENTENCE_MARKS for ch in word)


@dataclass(frozen=True)
class AsrEvent:
    t: float  # stream seconds
    kind: Literal["arrive", "commit"]
    index: int  # word index in the stream (an arrival: the last word the tail reaches)
    tail: tuple[str, ...] | None = None  # a recognised stream's tail (None: the stream's own next words)


def _recognised_events(stream: SmokeStream) -> list[AsrEvent]:
    """Per recogniser step: a commit event at each newly committed word that ends a sentence (it
    closes its utterance), one at the last committed word with the step's tail, or an arrival
    that shows the tail alone."""
    words, events, done = stream.words, [], 0
    for step in stream.timeline or []:
        tail = tuple(step.tail)
        closing = [i for i in range(done, step.committed) if ends_sentence(words[i])]
        events += [AsrEvent(step.t, "commit", i, ()) for i in closing]
        if step.committed > done and (not closing or closing[-1] != step.committed - 1):
            events.append(AsrEvent(step.t, "commit", step.committed - 1, tail))
        elif tail:
            events.append(AsrEvent(step.t, "arrive", step.committed - 1 + len(tail), tail))
        done = max(done, step.committed)
    return events


def asr_events(stream: SmokeStream) -> list[AsrEvent]:
    if stream.timeline is not None:
        return _recognised_events(stream)
    events = []
    for i in range(len(stream.words)):
        arrive = i / stream.words_per_second
        events += [AsrEvent(arrive, "arrive", i), AsrEvent(arrive + stream.commit_lag_seconds, "commit", i)]
    # On a tie the commit goes first: the ASR settles old words before showing new ones.
    return sorted(events, key=lambda e: (e.t, e.kind != "commit", e.index))


def paced_events(stream: SmokeStream, speed: float):
    """The stream's ASR events, each yielded when it is due (`speed` x real time), with its due time."""
    start = time.perf_counter()
    for ev in asr_events(stream):
        due = start + ev.t / speed
        now = time.perf_counter()
        if now < due:
            time.sleep(due - now)
        yield ev, due
