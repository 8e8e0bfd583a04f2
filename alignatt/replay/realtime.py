"""A real-time replay client that never waits: every ASR event is sent when it is due.

Unlike `stream_replay.replay_native` (lockstep: an update waits for its reply), this client sends
updates on the stream's clock and reads replies on a second thread, like a live ASR front end.
A partial that a newer update superseded gets no reply (the server answers the newer one); finals
are always answered. Per reply: RTT (sent -> answered) and lag (due on the stream clock ->
answered), so a server that cannot keep up shows a growing lag here too.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any

from alignatt.core.errors import AlignattError
from alignatt.replay.stream import RunRecord, SmokeStream, UpdateCursor, paced_events

_REPLY_FIELDS = ("utterance_id", "final", "forced_final", "path", "engine_calls", "server_ms", "compute_ms",
                 "committed_text", "committed_delta", "buffer_text", "stop_reason", "covered_source_units")


def replay_realtime(url: str, stream: SmokeStream, speed: float, preset: str, drain_s: float = 120.0) -> RunRecord:
    from websockets.sync.client import connect

    words = stream.words
    sent: dict[int, dict[str, Any]] = {}  # seq -> what was sent, when it was due and sent
    events: list[dict[str, Any]] = []
    finals_sent: list[int] = []
    lock = threading.Lock()
    done = threading.Event()
    with connect(url, open_timeout=10, max_size=None) as ws:
        ws.send(json.dumps({"type": "init", "protocol_version": 1, "source_lang": "en", "target_lang": "de",
                            "preset": preset}))
        ok = json.loads(ws.recv(timeout=600))
        if ok.get("type") != "init_ok":
            raise AlignattError(f"server refused the session: {ok.get('code')}: {ok.get('message')}")

        def read() -> None:
            while not done.is_set():
                try:
                    reply = json.loads(ws.recv(timeout=0.2))
                except TimeoutError:
                    continue
                except Exception:  # noqa: BLE001 - the connection closed: stop reading
                    return
                now = time.perf_counter()
                seq = reply.get("seq")
                with lock:
                    info = sent.get(seq)
                    if info is None:
                        continue
                    record = {**info["record"], "rtt_ms": round((now - info["sent"]) * 1000.0, 3),
                              "lag_s": round(max(now - info["due"], 0.0), 3)}
                    if reply.get("type") == "translation":
                        record.update({k: reply.get(k) for k in _REPLY_FIELDS})
                    else:
                        record.update(error=reply.get("code"), message=reply.get("message"))
                    events.append(record)

        reader = threading.Thread(target=read, name="realtime-reader", daemon=True)
        reader.start()
        cursor = UpdateCursor(words)
        seq = 0
        start = time.perf_counter()
        for ev, due in paced_events(stream, speed):
            step = cursor.frame(ev)
            if step is None:
                continue
            frame, open_words, tail, final = step
            seq = cursor.seq
            record = {"client": "realtime", "seq": seq, "trigger": ev.kind, "stream_s": round(ev.t, 3),
                      "committed_words": len(open_words), "tail_words": len(tail), "is_final": final}
            with lock:
                sent[seq] = {"due": due, "sent": time.perf_counter(), "record": record}
            ws.send(json.dumps(frame))
            if final:
                finals_sent.append(seq)
                cursor.close_utterance()
        # Every final is answered (never superseded): wait for them, bounded.
        deadline = time.monotonic() + drain_s
        while time.monotonic() < deadline:
            with lock:
                answered = {e["seq"] for e in events}
            if all(s in answered for s in finals_sent) and (seq in answered or not seq):
                break
            time.sleep(0.02)
        done.set()
        reader.join(5)
    with lock:
        ordered = sorted(events, key=lambda e: e["seq"])
    lag = max((e["lag_s"] for e in ordered), default=0.0)
    return RunRecord("realtime", ordered, time.perf_counter() - start, lag)
