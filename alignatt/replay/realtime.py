"""A real-time replay client that never waits: every ASR event is sent when it is due.

Unlike `replay/lockstep.py` (an update waits for its reply), this client sends updates on the
stream's clock and reads replies on a second thread, like a live ASR front end. A partial that a
newer update superseded gets no reply (the server answers the newer one); finals are always
answered. Per reply: RTT (sent -> answered) and lag (due on the stream clock -> answered), so a
server that cannot keep up shows a growing lag here too. With `stop_lag_s`, the first reply that
far behind stops the sending; what was sent is still drained.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from alignatt.replay.client import ProtocolClient
from alignatt.replay.cursor import UpdateCursor
from alignatt.record.events import ReplayEvent
from alignatt.replay.events import RunRecord
from alignatt.replay.stream import SmokeStream, paced_events


def replay_realtime(url: str, stream: SmokeStream, speed: float, preset: str, drain_s: float = 120.0,
                    stop_lag_s: float | None = None) -> RunRecord:
    sent: dict[int, dict[str, Any]] = {}  # seq -> what was sent, when it was due and sent
    events: list[ReplayEvent] = []
    finals_sent: list[int] = []
    lock = threading.Lock()
    done = threading.Event()
    behind = threading.Event()  # a reply came more than stop_lag_s late: send no more
    stopped_at = None
    with ProtocolClient.connect(url) as client:
        client.open(preset=preset)

        def read() -> None:
            while not done.is_set():
                try:
                    reply = client.recv(0.2)
                except TimeoutError:
                    continue
                except Exception:  # noqa: BLE001 - the connection closed: stop reading
                    return
                now = time.perf_counter()
                with lock:
                    info = sent.get(reply.get("seq"))
                    if info is None:
                        continue
                    lag = max(now - info["due"], 0.0)
                    event = info["event"].model_copy(update={
                        "rtt_ms": round((now - info["sent"]) * 1000.0, 3), "lag_s": round(lag, 3)})
                    events.append(event.answered(reply))
                if stop_lag_s is not None and lag > stop_lag_s:
                    behind.set()

        reader = threading.Thread(target=read, name="realtime-reader", daemon=True)
        reader.start()
        cursor = UpdateCursor(stream.words)
        seq = 0
        start = time.perf_counter()
        for ev, due in paced_events(stream, speed):
            if behind.is_set():
                stopped_at = ev.t
                break
            step = cursor.step(ev)
            if step is None:
                continue
            seq = step.seq
            event = ReplayEvent(client="realtime", seq=seq, trigger=ev.kind, stream_s=round(ev.t, 3),
                                committed_words=len(step.words), tail_words=len(step.tail), is_final=step.final)
            frame = step.frame()  # built and checked before the clock starts: the round trip is the server's
            with lock:
                sent[seq] = {"due": due, "sent": time.perf_counter(), "event": event}
            client.send(frame)
            if step.final:
                finals_sent.append(seq)
                cursor.close_utterance()
        # Every final is answered (never superseded): wait for them, bounded.
        deadline = time.monotonic() + drain_s
        while time.monotonic() < deadline:
            with lock:
                answered = {e.seq for e in events}
            if all(s in answered for s in finals_sent) and (seq in answered or not seq):
                break
            time.sleep(0.02)
        done.set()
        reader.join(5)
    with lock:
        ordered = sorted(events, key=lambda e: e.seq)
    lag = max((e.lag_s for e in ordered), default=0.0)
    return RunRecord("realtime", ordered, time.perf_counter() - start, lag, stopped_at,
                     cursor.committed if stopped_at is not None else None)
