"""Replaying an ASR stream into the MT server through real WebSocket clients.

The stream (`alignatt/data/mt_server_smoke_stream.json`) is replayed as an ASR would produce it:
word i arrives as unstable tail at i / words_per_second and is committed commit_lag_seconds later;
a committed word with sentence punctuation closes the sentence (a final). With 2.4 words/s and a
2.0 s lag, arrivals and commits interleave, so every commit that follows an arrival moves only the
frontier over an unchanged source text: the server's commit fast path.

- `replay_native` reports every ASR event as one update and waits for its reply before the next
  one (lockstep: when the engine is slower than the stream the replay runs behind schedule, and
  records by how much).
- `replay_wlk` drives the unmodified WhisperLiveKit client the way WhisperLiveKit's translation
  loop does (committed tokens, then the tail snapshot; its own pacing decides what is sent).
"""

from __future__ import annotations

import importlib
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from alignatt.core.errors import AlignattError
from alignatt.replay.wlk_client import load_wlk_client

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


class UpdateCursor:
    """Where an ASR replay stands: the open utterance's committed words and the unstable tail at
    each event, as the protocol-v1 update frame a client sends (both replay clients use it)."""

    def __init__(self, words: list[str]) -> None:
        self.words = words
        self.seq = self.uid = self.utt_start = self.committed = self.arrived = 0

    def frame(self, ev: AsrEvent) -> tuple[dict[str, Any], list[str], list[str], bool] | None:
        """(frame, open words, tail, is_final) for this event, or None when there is nothing to send."""
        final = False
        if ev.kind == "arrive":
            self.arrived = ev.index + 1
        else:
            self.committed = ev.index + 1
            final = ends_sentence(self.words[ev.index])
        open_words = self.words[self.utt_start:self.committed]
        tail = [] if final else self.words[self.committed:self.arrived]
        if not open_words and not tail:
            return None
        self.seq += 1
        frame = {"type": "update", "seq": self.seq, "utterance_id": self.uid,
                 "words": [[w, None, None] for w in open_words],
                 "clock_ms": round(ev.t * 1000.0, 1), "is_final": final}
        if tail:
            frame["tail"] = {"words": [[w, None, None] for w in tail]}
        return frame, open_words, tail, final

    def close_utterance(self) -> None:
        """The open utterance became final: the next words start a new one."""
        self.uid += 1
        self.utt_start = self.committed


@dataclass
class RunRecord:
    client: str
    events: list[dict[str, Any]]
    wall_s: float
    max_lag_s: float


def count_retractions(events: list[dict[str, Any]]) -> int:
    """Replies whose committed_text does not extend the last one shown for the same utterance."""
    shown: dict[Any, str] = {}
    count = 0
    for e in events:
        text = e.get("committed_text")
        if text is None:
            continue
        # A reconnected client starts a new server session seeded with the text it showed.
        key = (e.get("connection"), e.get("utterance_id"))
        if not text.startswith(shown.get(key, "")):
            count += 1
        shown[key] = text
    return count


# ---- the native client (lockstep, every ASR event is an update) ----


def replay_native(url: str, stream: SmokeStream, speed: float, preset: str) -> RunRecord:
    from websockets.sync.client import connect

    words = stream.words
    events: list[dict[str, Any]] = []
    with connect(url, open_timeout=10, max_size=None) as ws:
        ws.send(json.dumps({"type": "init", "protocol_version": 1, "source_lang": "en",
                            "target_lang": "de", "preset": preset}))
        ok = json.loads(ws.recv(timeout=600))
        if ok.get("type") != "init_ok":
            raise AlignattError(f"server refused the session: {ok.get('code')}: {ok.get('message')}")
        cursor = UpdateCursor(words)
        max_lag = 0.0
        start = time.perf_counter()
        for ev, due in paced_events(stream, speed):
            lag = max(time.perf_counter() - due, 0.0)
            max_lag = max(max_lag, lag)
            step = cursor.frame(ev)
            if step is None:
                continue
            frame, open_words, tail, final = step
            seq = cursor.seq
            sent = time.perf_counter()
            ws.send(json.dumps(frame))
            reply = _await_reply(ws, seq)
            rtt = (time.perf_counter() - sent) * 1000.0
            record = {
                "client": "native", "seq": seq, "trigger": ev.kind, "stream_s": round(ev.t, 3),
                "lag_s": round(lag, 3), "committed_words": len(open_words), "tail_words": len(tail),
                "is_final": final, "rtt_ms": round(rtt, 3),
            }
            if reply.get("type") == "translation":
                record.update({k: reply.get(k) for k in (
                    "utterance_id", "final", "forced_final", "path", "engine_calls", "server_ms",
                    "compute_ms", "committed_text", "committed_delta", "buffer_text", "stop_reason",
                    "covered_source_units")})
            else:
                record.update(error=reply.get("code"), message=reply.get("message"))
            events.append(record)
            if final or reply.get("final"):
                cursor.close_utterance()
        return RunRecord("native", events, time.perf_counter() - start, max_lag)


def _await_reply(ws, seq: int, timeout: float = 600.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise AlignattError(f"no reply to update seq {seq} within {timeout:.0f}s")
        reply = json.loads(ws.recv(timeout=remaining))
        if reply.get("type") == "error" and reply.get("seq") in (None, seq):
            return reply
        if reply.get("type") == "translation" and reply.get("seq", -1) >= seq:
            return reply


# ---- the WhisperLiveKit client ----


def replay_wlk(url: str, stream: SmokeStream, speed: float, preset: str, latency: str,
               server_log: Callable[[], list[dict]]) -> RunRecord:
    """Drive `AlignAttTranslationClient` the way WhisperLiveKit's translation loop does.

    Due events are batched (the loop drains its queue), committed tokens are inserted before the
    tail snapshot, and `process()` runs once per batch; the client decides what it sends.
    `server_log()` returns the server's step records of this client's connection.
    """
    wlk = load_wlk_client()
    timed = importlib.import_module("whisperlivekit.timed_objects")
    engine = wlk.AlignAttRemoteEngine(url=url, source_language="en", preset=preset, latency=latency)
    client = engine.new_session("de")
    words = stream.words
    per_word = 1.0 / stream.words_per_second
    pending = asr_events(stream)
    records: list[dict[str, Any]] = []
    committed = arrived = 0
    max_lag = 0.0
    start = time.perf_counter()

    disconnects: list[dict[str, Any]] = []

    def process(stream_s: float, lag: float) -> None:
        seq_before = client._seq  # read-only peeks: which updates this call sent, and whether
        was_up = client._ws is not None  # the client dropped its connection (it then retries)
        began = time.perf_counter()
        segment, buffer = client.process()
        took = (time.perf_counter() - began) * 1000.0
        if not client._connected_once:
            raise AlignattError("the WhisperLiveKit client could not open a session (see the log)")
        if was_up and client._ws is None:
            # e.g. a reply slower than the client's 15 s call timeout; it reconnects with its
            # accepted text as accepted_target_prefix, which the artifact then shows.
            disconnects.append({"client": "wlk", "event": "disconnect", "stream_s": round(stream_s, 3),
                                "after_ms": round(took, 3)})
        records.append({
            "client": "wlk", "stream_s": round(stream_s, 3), "lag_s": round(lag, 3),
            "sent_seqs": list(range(seq_before + 1, client._seq + 1)),
            "process_ms": round(took, 3), "segment": segment.text if segment else None,
            "buffer": buffer.text or "",
        })

    i = 0
    while i < len(pending):
        due = start + pending[i].t / speed
        now = time.perf_counter()
        if now < due:
            time.sleep(due - now)
        lag = max(time.perf_counter() - due, 0.0)
        max_lag = max(max_lag, lag)
        horizon = (time.perf_counter() - start) * speed
        items: list[Any] = []
        while i < len(pending) and pending[i].t <= horizon:
            ev = pending[i]
            if ev.kind == "arrive":
                arrived = ev.index + 1
            else:
                committed = ev.index + 1
                t0 = ev.index * per_word
                items.append(timed.ASRToken(start=t0, end=t0 + per_word, text=" " + words[ev.index]))
            i += 1
        tail = " ".join(words[committed:arrived])
        if tail:
            items.append(timed.HypothesisTail(start=None, end=horizon, text=tail))
        client.insert_tokens(items)
        process(horizon, lag)
    # Remaining finals go one per process() call, like WhisperLiveKit; a client that dropped its
    # connection gets its backoff time to come back (bounded).
    deadline = time.monotonic() + 120.0
    while client._pending_finals and time.monotonic() < deadline:
        if client._ws is None:
            time.sleep(max(client._retry_at - time.monotonic(), 0.0) + 0.05)
        process(horizon, 0.0)
    wall = time.perf_counter() - start
    if client._ws is not None:
        client._ws.close()

    steps = {s["seq"]: s for s in server_log()}
    events = []
    for r in records:
        for seq in r["sent_seqs"]:
            s = steps.get(seq)
            if s is None:
                continue  # coalesced or failed: the client reads on to a newer seq
            events.append({"client": "wlk", "stream_s": r["stream_s"], "lag_s": r["lag_s"],
                           "process_ms": r["process_ms"], "segment": r["segment"],
                           "buffer": r["buffer"], **s})
    events += disconnects
    if client._pending_finals:
        events.append({"client": "wlk", "event": "unsent_finals", "count": len(client._pending_finals)})
    return RunRecord("wlk", events, wall, max_lag)
