"""The lockstep replay: every ASR event is one update, and the next waits for its reply.

When the engine is slower than the stream the replay runs behind schedule, and records by how much
(`lag_s`); per update it records the round trip and what the reply said. With `stop_lag_s` it stops
once it is that far behind (the server cannot keep up; the rest would only say so for longer).
"""

from __future__ import annotations

import time

from alignatt.replay.client import ProtocolClient
from alignatt.replay.cursor import UpdateCursor
from alignatt.record.events import ReplayEvent
from alignatt.replay.events import RunRecord
from alignatt.replay.stream import SmokeStream, paced_events


def replay_native(url: str, stream: SmokeStream, speed: float, preset: str,
                  stop_lag_s: float | None = None) -> RunRecord:
    events: list[ReplayEvent] = []
    stopped_at = None
    with ProtocolClient.connect(url) as client:
        client.open(preset=preset)
        cursor = UpdateCursor(stream.words)
        max_lag = 0.0
        start = time.perf_counter()
        for ev, due in paced_events(stream, speed):
            lag = max(time.perf_counter() - due, 0.0)
            if stop_lag_s is not None and lag > stop_lag_s:
                stopped_at = ev.t
                break
            max_lag = max(max_lag, lag)
            step = cursor.step(ev)
            if step is None:
                continue
            frame = step.frame()  # built and checked before the clock starts: the round trip is the server's
            sent = time.perf_counter()
            client.send(frame)
            reply = client.await_reply(step.seq)
            rtt = (time.perf_counter() - sent) * 1000.0
            event = ReplayEvent(
                client="native", seq=step.seq, trigger=ev.kind, stream_s=round(ev.t, 3), lag_s=round(lag, 3),
                committed_words=len(step.words), tail_words=len(step.tail), is_final=step.final,
                rtt_ms=round(rtt, 3)).answered(reply)
            events.append(event)
            if step.final or reply.get("final"):  # the server may force a final on a long utterance
                cursor.close_utterance()
        return RunRecord("native", events, time.perf_counter() - start, max_lag, stopped_at,
                         cursor.committed if stopped_at is not None else None)
