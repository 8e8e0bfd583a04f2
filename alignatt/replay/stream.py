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
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from alignatt.core.errors import AlignattError

SENTENCE_MARKS = set(".!?。！？")  # WhisperLiveKit's PUNCTUATION_MARKS


class SmokeStream(BaseModel):
    model_config = ConfigDict(extra="ignore")

    description: str = ""
    words_per_second: float = Field(gt=0)
    commit_lag_seconds: float = Field(ge=0)
    replay_speed: float = Field(4.0, gt=0)
    text: str = Field(min_length=1)

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


def load_stream(path: str | None = None) -> SmokeStream:
    if path is None:
        from importlib import resources

        text = (resources.files("alignatt") / "data" / "mt_server_smoke_stream.json").read_text()
        where = "bundled smoke stream"
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
    index: int  # word index in the stream


def asr_events(stream: SmokeStream) -> list[AsrEvent]:
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
