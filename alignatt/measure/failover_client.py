"""A real-time speaker that survives its engine: replays a stream on its clock, and when the server
says its engine is gone (`processing_failed` that says to reconnect, then a close), reconnects and
resumes where it was, the way a WhisperLiveKit front end is expected to.

Resuming: the new session's init carries `accepted_target_prefix`, the text shown for the oldest
utterance not yet answered final; finals sent but not answered are sent again, in order; then the
stream goes on. The record says what the speaker saw: every notice, when its engine's loss was
told and when a translation came again, and per utterance the text shown before the loss and the
final text, so `alignatt failover` can check that nothing committed was lost.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from alignatt.replay.client import ProtocolClient
from alignatt.replay.cursor import UpdateCursor
from alignatt.replay.stream import SmokeStream, paced_events

RECONNECT_TRIES = 40  # 0.25 s apart: 10 s for a live engine to take the session
DRAIN_S = 120.0  # after the last event, how long the finals may take


@dataclass
class SpeakerRecord:
    speaker: int
    connections: int = 0
    notices: list[dict[str, Any]] = field(default_factory=list)  # {t, code, message, close_code}
    resumed_at: list[float] = field(default_factory=list)  # first translation on each new connection
    reopened_at: list[float] = field(default_factory=list)  # init_ok on each new connection (a session again)
    shown: dict[int, str] = field(default_factory=dict)  # utterance -> committed text shown last
    lost_at: list[float] = field(default_factory=list)  # when each loss was told (time.time())
    shown_at_notice: list[dict[int, str]] = field(default_factory=list)  # `shown` at each loss
    finals: dict[int, str] = field(default_factory=dict)  # utterance -> its final committed text
    final_waits: list[float] = field(default_factory=list)  # s from a final's send to its answer or notice
    retractions: int = 0
    utterances: int = 0
    refused: list[str] = field(default_factory=list)  # reconnects the server refused (why)
    error: str | None = None


class Speaker:
    def __init__(self, index: int, url: str, stream: SmokeStream, speed: float, preset: str) -> None:
        self.url, self.stream, self.speed, self.preset = url, stream, speed, preset
        self.record = SpeakerRecord(index)
        self.lock = threading.Lock()
        self.broken = threading.Event()
        self.ws: ProtocolClient | None = None
        self.reader: threading.Thread | None = None
        self.seq = 0
        self.final_frames: dict[int, dict] = {}  # utterance -> its final frame, kept until answered
        self.final_sent: dict[int, float] = {}
        self.sent_uid: dict[int, int] = {}  # seq -> utterance
        self.awaiting_resume = False

    # ---- one connection ----

    def _connect(self) -> bool:
        from websockets.exceptions import InvalidStatus

        with self.lock:
            pending = sorted(u for u in self.final_frames if u not in self.record.finals)
            prefix = self.record.shown.get(pending[0], "") if pending else self._open_prefix
        for _ in range(RECONNECT_TRIES):
            try:
                ws = ProtocolClient.connect(self.url, timeout=60)
            except (OSError, InvalidStatus) as e:  # down, or refused at the handshake (503): try again
                self.record.refused.append(f"connect: {e}"[:200])
                time.sleep(0.25)
                continue
            try:
                ok = ws.init(preset=self.preset, accepted_target_prefix=prefix)
            except Exception as e:  # noqa: BLE001 - closed or silent: try again
                ok = {"type": "error", "code": type(e).__name__}
            ws.timeout = None  # the reader waits until the server speaks or closes
            if ok.get("type") == "init_ok":
                self.ws = ws
                if self.record.connections:
                    self.record.reopened_at.append(time.time())
                self.record.connections += 1
                self.broken.clear()
                self.reader = threading.Thread(target=self._read, args=(ws,), daemon=True)
                self.reader.start()
                for uid in pending:  # the finals the lost engine never answered, again, in order
                    self._send(dict(self.final_frames[uid]), uid, final=True)
                return True
            self.record.refused.append(str(ok.get("code")))
            ws.close()
            time.sleep(0.25)
        return False

    def _read(self, ws) -> None:
        from websockets.exceptions import ConnectionClosed

        while True:
            try:
                reply = ws.recv()
            except ConnectionClosed as e:
                if not self.finished:
                    self._notice("closed", "", e.rcvd.code if e.rcvd else None)
                return
            except Exception:  # noqa: BLE001 - the socket is gone
                return
            now = time.time()
            with self.lock:
                if reply.get("type") == "translation":
                    uid, text = reply["utterance_id"], reply["committed_text"]
                    if not text.startswith(self.record.shown.get(uid, "")):
                        self.record.retractions += 1
                    self.record.shown[uid] = text
                    if self.awaiting_resume:
                        self.record.resumed_at.append(now)
                        self.awaiting_resume = False
                    if reply.get("final") and uid not in self.record.finals:
                        self.record.finals[uid] = text
                        if uid in self.final_sent:
                            self.record.final_waits.append(now - self.final_sent.pop(uid))
                elif reply.get("type") == "error":
                    self.record.notices.append({"t": now, "code": reply.get("code"),
                                                "message": str(reply.get("message"))[:200]})
                    if "reconnect" in str(reply.get("message")):
                        self._lost(now)

    def _notice(self, code: str, message: str, close_code: int | None) -> None:
        now = time.time()
        with self.lock:
            self.record.notices.append({"t": now, "code": code, "message": message, "close_code": close_code})
            self._lost(now)

    def _lost(self, now: float) -> None:
        """The connection is lost (lock held): what was shown is kept, the finals' waits end here."""
        if self.broken.is_set():
            return
        self.record.lost_at.append(now)
        self.record.shown_at_notice.append(dict(self.record.shown))
        for uid, sent in list(self.final_sent.items()):
            self.record.final_waits.append(now - sent)
            del self.final_sent[uid]
        self.awaiting_resume = True
        self.broken.set()

    def _send(self, frame: dict, uid: int, final: bool) -> None:
        self.seq += 1
        frame["seq"] = self.seq
        with self.lock:
            self.sent_uid[self.seq] = uid
            if final:
                self.final_frames[uid] = frame
                self.final_sent.setdefault(uid, time.time())
        try:
            self.ws.send(frame)
        except Exception:  # noqa: BLE001 - the reader tells why; the frame is resent if final
            self.broken.set()

    def _resume_if_lost(self) -> bool:
        if not self.broken.is_set():
            return True
        try:
            self.ws.close()
        except Exception:  # noqa: BLE001
            pass
        if self.reader is not None:
            self.reader.join(5)
        return self._connect()

    # ---- the replay ----

    finished = False
    _open_prefix = ""

    def run(self) -> SpeakerRecord:
        try:
            self._replay()
        except Exception as e:  # noqa: BLE001 - reported in the artifact
            self.record.error = f"{type(e).__name__}: {e}"
        finally:
            self.finished = True
            if self.ws is not None:
                try:
                    self.ws.close()
                except Exception:  # noqa: BLE001
                    pass
        return self.record

    def _replay(self) -> None:
        if not self._connect():
            raise RuntimeError(f"no session: {self.record.refused[-3:]}")
        cursor = UpdateCursor(self.stream.words)
        for ev, _ in paced_events(self.stream, self.speed):
            step = cursor.step(ev)
            if step is None:
                continue
            with self.lock:
                self._open_prefix = self.record.shown.get(step.utterance_id, "")
            if not self._resume_if_lost():
                raise RuntimeError(f"could not reconnect: {self.record.refused[-3:]}")
            self._send(step.frame(), step.utterance_id, step.final)
            if step.final:
                cursor.close_utterance()
        self.record.utterances = cursor.uid
        deadline = time.monotonic() + DRAIN_S
        while time.monotonic() < deadline:
            with self.lock:
                done = all(u in self.record.finals for u in range(cursor.uid))
            if done:
                return
            if self.broken.is_set() and not self._resume_if_lost():
                raise RuntimeError(f"could not reconnect: {self.record.refused[-3:]}")
            time.sleep(0.05)


def run_speakers(url: str, streams: list[SmokeStream], n: int, speed: float, preset: str,
                 stagger_s: float) -> list[SpeakerRecord]:
    """`n` speakers as threads (the server is another process), speaker i starting i x stagger_s late."""
    records: list[SpeakerRecord | None] = [None] * n

    def one(i: int) -> None:
        time.sleep(i * stagger_s)
        records[i] = Speaker(i, url, streams[i % len(streams)], speed, preset).run()

    threads = [threading.Thread(target=one, args=(i,), name=f"failover-speaker-{i}") for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [r if r is not None else SpeakerRecord(i, error="did not run") for i, r in enumerate(records)]
