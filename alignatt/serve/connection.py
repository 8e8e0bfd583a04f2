"""One WebSocket connection of the MT server: reader, session worker and writer, and their bounds.

The reader validates frames, has `serve/admission.py` open the session an `init` asks for, and
queues updates (partials coalesce, finals never); the worker plans each update on every target's
`Session`, awaits the drafts it needs from the engine's scheduler (queued together, so a
multi-target update is one batch; no thread waits), and applies them; the writer sends replies
from a bounded outbox. Nothing that goes wrong inside ends a session silently: it becomes an
error frame, or a close with a code and a reason (1008 a bound passed, 1011 an internal error,
1012 its engine died: reconnect, 1013 busy), counted in `ServerStats.closes`.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from concurrent.futures import Future

from alignatt.core.draft import Draft
from alignatt.serve.admission import admit
from alignatt.serve.host import ConnectionHost
from alignatt.serve.multi_target import Targets
from alignatt.serve.pool import Engine
from alignatt.serve.protocol import (
    BAD_PROTOCOL,
    BUSY,
    PROCESSING_FAILED,
    ErrorFrame,
    FrameTooLarge,
    InitFrame,
    ProtocolError,
    TranslationFrame,
    UpdateFrame,
    parse_frame,
)
from alignatt.serve.limits import UpdateRejected
from alignatt.serve.scheduler import EngineDied, Superseded
from alignatt.serve.session import Session, SourceUpdate, Step

log = logging.getLogger("alignatt.serve.server")


# Close codes: 1008 policy violation (a bound the client passed), 1011 an internal error,
# 1012 service restart (the session's engine died: reconnect), 1013 try again later (the session limit).
CLOSE_POLICY, CLOSE_INTERNAL, CLOSE_RESTART, CLOSE_BUSY = 1008, 1011, 1012, 1013
# How long a close handshake may wait on a client that does not read before the socket is cut.
_CLOSE_WAIT_S = 5.0


class Connection:
    """One WebSocket connection: a reader that validates and queues, a worker that translates, and
    a writer that sends. Replies go through a bounded outbox, so neither the reader nor the worker
    ever waits on a client that stops reading; past a bound that session is closed with a reason.
    """

    def __init__(self, server: ConnectionHost, ws, connection_id: int) -> None:
        self.id = connection_id
        self.keys: list = [connection_id]  # the scheduler's session keys (one per target)
        self.targets: Targets | None = None  # the session of every target (one without `target_langs`)
        self.key_of: dict[str, object] = {}  # target -> its scheduler key
        self.multi = False  # `target_langs`: every frame names its target
        self.server = server
        self.ws = ws
        self.limits = server.config.limits
        self.session: Session | None = None
        self.engine: Engine | None = None
        self.pending: collections.deque[tuple[UpdateFrame, float]] = collections.deque()
        self.wake = asyncio.Event()
        self.last_seq: int | None = None
        self.worker: asyncio.Task | None = None
        self.holds_slot = False
        self.outbox: collections.deque[str] = collections.deque()
        self.outbox_bytes = 0
        self.outbox_wake = asyncio.Event()
        self.writer: asyncio.Task | None = None
        self.closing: tuple[int, str] | None = None  # (code, reason) once the session is ending
        self._closer: asyncio.Task | None = None
        self.in_flight = False  # the worker is answering an update (the client may wait, silent)
        self._before_init = False  # counted in `connections_before_init` and `server.waiting`
        self.peer = peer_of(ws)
        self.utterance_open = False  # the last update received was a partial: its utterance is open

    async def run(self) -> None:
        from websockets.exceptions import ConnectionClosed

        self.writer = asyncio.create_task(self._write())
        limits, stats = self.limits, self.server.stats
        # Connections without a session cost the loop and memory but hold no slot: bounded too, per
        # address and in all; at a bound the longest-waiting idle one makes room (`WaitingPeers`).
        admitted = self.server.waiting.enter(self.peer, self.id, self._make_room,
                                             limits.max_connections_before_init_per_peer,
                                             limits.max_connections_before_init)
        if admitted:
            stats.connections_before_init += 1
            self._before_init = True
        try:
            if not admitted:
                stats.errors[BUSY] += 1
                self._send(ErrorFrame(code=BUSY, message=f"{limits.max_connections_before_init} connections are "
                                                         "already waiting for init; retry later").to_json())
                self._end(CLOSE_BUSY, "too many connections waiting for init", "busy_before_init")
            while self.closing is None:
                try:
                    # Bytes for every frame: a frame that is not UTF-8 gets an error frame
                    # instead of failing the connection.
                    wait = limits.init_timeout_s if self.session is None else limits.idle_timeout_s
                    raw = await asyncio.wait_for(self.ws.recv(decode=False), wait)
                except ConnectionClosed:
                    break
                except asyncio.TimeoutError:
                    if self.session is None:
                        self._end(CLOSE_POLICY, f"no init within {limits.init_timeout_s:g} s", "init_timeout")
                        break
                    if self.pending or self.in_flight:  # a client waiting for its replies is not idle
                        continue
                    self._end(CLOSE_POLICY, f"idle: no update for {limits.idle_timeout_s:g} s", "idle_timeout")
                    break
                received = time.perf_counter()
                try:
                    # Before init only an init is expected: a smaller frame bound, and past it one
                    # bad_protocol then the close (such a client has nothing to lose yet).
                    bound = limits.max_frame_bytes if self.session is not None else limits.max_init_frame_bytes
                    frame = parse_frame(raw, bound)
                    if isinstance(frame, InitFrame):
                        await self._init(frame)
                    else:
                        self._enqueue(frame, received)
                except ProtocolError as e:
                    stats.errors[e.code] += 1
                    self._send(e.frame().to_json())
                    if e.code == BUSY:
                        self._end(CLOSE_BUSY, "session limit reached", "busy")
                    elif isinstance(e, FrameTooLarge) and self.session is None:
                        self._end(CLOSE_POLICY, "frame before init too large", "init_frame_too_large")
                except asyncio.CancelledError:
                    raise
                except Exception as e:  # a bug on the reader's side: a reply, or a close with a reason
                    self._fail("reading a frame", e)
        finally:
            self._leave_before_init()
            if self.worker is not None:
                self.worker.cancel()
            if self.holds_slot:
                self.server.slots.give()
                self.holds_slot = False
            if self.session is not None:
                for key in self.keys:  # drops their queued drafts, aborts their running ones
                    self.engine.close_session(key)
            if self.closing is None:
                self.closing = (1000, "")  # the client left: the writer stops
            self.outbox_wake.set()
            await self._wait_closed()

    def _leave_before_init(self) -> None:
        if self._before_init:
            self._before_init = False
            self.server.stats.connections_before_init -= 1
            self.server.waiting.leave(self.id)

    def _make_room(self) -> None:
        """Closed without a session: it waited longest, and a newer connection needs its place."""
        self._leave_before_init()
        self._end(CLOSE_POLICY, "no init: closed to make room for a newer connection", "evicted_before_init")

    # ---- sending ----

    def _send(self, text: str) -> None:
        """Queue one reply for the writer; never waits. Past the outbox bounds the session closes."""
        if self.closing is not None:
            return
        self.outbox.append(text)
        self.outbox_bytes += len(text.encode("utf-8", "surrogatepass"))
        if len(self.outbox) > self.limits.max_outgoing_frames or self.outbox_bytes > self.limits.max_outgoing_bytes:
            self._abandon(
                f"{len(self.outbox)} replies ({self.outbox_bytes} bytes) queued: the client is not reading",
                "slow_reader",
            )
            return
        self.outbox_wake.set()

    async def _write(self) -> None:
        from websockets.exceptions import ConnectionClosed

        while True:
            while not self.outbox:
                if self.closing is not None:
                    await self._close_socket(*self.closing)
                    return
                self.outbox_wake.clear()
                await self.outbox_wake.wait()
            text = self.outbox.popleft()
            self.outbox_bytes -= len(text.encode("utf-8", "surrogatepass"))
            try:
                # websockets' own keepalive ping waits behind a blocked write, so a stalled send
                # is timed here: it is what notices a client that stopped reading.
                await asyncio.wait_for(self.ws.send(text), self.limits.send_stall_s)
            except asyncio.TimeoutError:
                self._abandon(f"a reply was blocked for {self.limits.send_stall_s:g} s: the client is not reading",
                              "send_stall", from_writer=True)
                return
            except ConnectionClosed:
                return  # the client left; its session ends with the reader loop

    def _end(self, code: int, reason: str, kind: str) -> None:
        """Close after the queued replies are sent (an error frame first, then the close)."""
        if self.closing is None:
            self.closing = (code, reason)
            self.server.stats.closes[kind] += 1
            log.info("connection %d: closing (%d %s)", self.id, code, reason)
        self.outbox_wake.set()

    def _abandon(self, reason: str, kind: str, code: int = CLOSE_POLICY, from_writer: bool = False) -> None:
        """Close now, dropping queued replies (the client is not taking them, or cannot)."""
        if self.closing is not None and self._closer is not None:
            return
        self.closing = (code, reason)
        self.server.stats.closes[kind] += 1
        log.warning("connection %d: closing (%d %s)", self.id, code, reason)
        self.outbox.clear()
        self.outbox_bytes = 0
        self.pending.clear()
        if self.worker is not None and self.worker is not asyncio.current_task():
            self.worker.cancel()
        if self.writer is not None and not from_writer and self.writer is not asyncio.current_task():
            self.writer.cancel()
        self._closer = asyncio.create_task(self._close_socket(code, reason))

    async def _close_socket(self, code: int, reason: str) -> None:
        try:
            await asyncio.wait_for(self.ws.close(code, reason[:120]), _CLOSE_WAIT_S)
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - a close that cannot complete: cut the socket
            transport = getattr(self.ws, "transport", None)
            if transport is not None:
                transport.abort()

    async def _wait_closed(self) -> None:
        tasks = [t for t in (self.writer, self._closer) if t is not None]
        if tasks:
            done, late = await asyncio.wait(tasks, timeout=self.limits.send_stall_s + _CLOSE_WAIT_S)
            for t in late:
                t.cancel()

    def _engine_died(self, error: EngineDied, seq: int | None = None) -> None:
        """The session's engine is gone: one `processing_failed` that says to reconnect (the client
        resumes with `accepted_target_prefix`, on a live engine), then a 1012 close."""
        if self.closing is not None:
            return
        self.server.stats.errors[PROCESSING_FAILED] += 1
        message = f"{error}; reconnect to continue (send the text shown as accepted_target_prefix)"
        self._send(ErrorFrame(code=PROCESSING_FAILED, message=message[:300], seq=seq).to_json())
        self.pending.clear()
        self._end(CLOSE_RESTART, "engine stopped: reconnect", "engine_died")

    def between_utterances(self) -> bool:
        """Nothing of the client's is waiting or open: handing the session over loses no work."""
        return not self.pending and not self.in_flight and not self.utterance_open

    def hand_over(self) -> None:
        """The server is draining: the session goes on elsewhere. Told as an engine's death is (the
        client resumes on another replica with `accepted_target_prefix`), then closed with 1012."""
        if self.closing is not None:
            return
        if self.session is None:
            self._end(CLOSE_RESTART, "server draining: connect again", "drained")
            return
        message = "server draining; reconnect to continue (send the text shown as accepted_target_prefix)"
        self._send(ErrorFrame(code=PROCESSING_FAILED, message=message).to_json())
        self.pending.clear()
        self._end(CLOSE_RESTART, "server draining: reconnect", "drained")

    def _fail(self, stage: str, error: BaseException) -> None:
        """An unexpected error: tell the client if a frame can still be sent, else close with a reason."""
        log.exception("connection %d: %s failed", self.id, stage, exc_info=error)
        self.server.stats.errors[PROCESSING_FAILED] += 1
        try:
            message = f"internal error while {stage}: {type(error).__name__}"
            self._send(ErrorFrame(code=PROCESSING_FAILED, message=message).to_json())
        except Exception:  # noqa: BLE001 - not even an error frame: end the session, with a reason
            self._abandon(f"internal error while {stage}", "internal_error", code=CLOSE_INTERNAL)

    # ---- the session ----

    async def _init(self, frame: InitFrame) -> None:
        if self.session is not None:
            raise ProtocolError(BAD_PROTOCOL, "this connection already has a session (one init per connection)")
        admitted = await admit(self.server, frame, self.id)
        self.holds_slot = True  # admit took a session slot; the connection gives it back when it ends
        self.session, self.engine, self.targets = admitted.session, admitted.engine, admitted.targets
        self.keys, self.key_of, self.multi = admitted.keys, admitted.key_of, admitted.multi
        loop = asyncio.get_running_loop()
        self.engine.on_death(self.keys[0], lambda error: loop.call_soon_threadsafe(self._engine_died, error))
        self._leave_before_init()
        self.server.stats.sessions_opened += 1
        self.worker = asyncio.create_task(self._work())
        self.worker.add_done_callback(self._worker_done)
        self._send(admitted.ok.to_json())
        self._record(self.server.session_log, admitted.log_entry)

    def _enqueue(self, update: UpdateFrame, received: float) -> None:
        if self.session is None:
            raise ProtocolError(BAD_PROTOCOL, "update before init: send an init frame first", seq=update.seq)
        if self.last_seq is not None and update.seq <= self.last_seq:
            raise ProtocolError(
                BAD_PROTOCOL, f"seq {update.seq} does not follow seq {self.last_seq}", seq=update.seq
            )
        if len(update.words) > self.limits.max_update_words:
            raise ProtocolError(
                BAD_PROTOCOL,
                f"{len(update.words)} committed words in one update; the limit is "
                f"{self.limits.max_update_words} (utterances close at {self.limits.max_utterance_words})",
                seq=update.seq,
            )
        longest = max((len(w) for w in update.words + update.tail_words), default=0)
        if longest > self.limits.max_word_chars:
            raise ProtocolError(
                BAD_PROTOCOL, f"a word of {longest} characters; the limit is {self.limits.max_word_chars}",
                seq=update.seq,
            )
        self.last_seq = update.seq
        self.utterance_open = not update.is_final
        for key in self.keys:  # a draft still running for an older partial is stale now
            self.engine.supersede(key)
        # Every update carries the open utterance's whole state: queued partials are stale now.
        kept = collections.deque(item for item in self.pending if item[0].is_final)
        self.server.stats.coalesced += len(self.pending) - len(kept)
        kept.append((update, received))
        self.pending = kept
        finals = sum(1 for item in kept if item[0].is_final)
        if finals > self.limits.max_pending_finals:
            self._abandon(f"{finals} finals queued for the engine; the limit is {self.limits.max_pending_finals}",
                          "pending_finals")
            return
        self.wake.set()

    async def _work(self) -> None:
        while self.closing is None:
            while not self.pending:
                self.wake.clear()
                await self.wake.wait()
            update, received = self.pending.popleft()
            self.in_flight = True
            try:
                await self._process(update, received)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # the worker never dies silently: a reply or a close with a reason
                self._fail(f"answering seq {update.seq}", e)
            finally:
                self.in_flight = False
            if self.server.draining and self.between_utterances():  # its last final is answered
                self.hand_over()

    def _fit_and_submit(self, wanted: list) -> list:
        return [(t, self.engine.submit(self.key_of[t], request)) for t, request in self.targets.fit(wanted)]

    def _worker_done(self, task: asyncio.Task) -> None:
        if task.cancelled() or self.closing is not None:
            return
        # Unreachable by design (`_work` catches everything); if it ever happens, say so.
        error = task.exception()
        log.error("connection %d: worker ended: %r", self.id, error)
        self._abandon(f"internal error: the session's worker ended ({type(error).__name__})",
                      "internal_error", code=CLOSE_INTERNAL)

    async def _process(self, update: UpdateFrame, received: float) -> None:
        stats = self.server.stats
        source = SourceUpdate.of(update.words, update.tail_words, update.is_final, update.utterance_id)
        stats.updates += 1
        try:
            # Planned on the event loop: a cached path (the commit fast path) costs no thread and
            # no engine call; an utterance id going back raises here.
            wanted = self.targets.plan(source)
            # Fitted to the token budget, then queued together (so the scheduler batches them), on
            # the engine's tokenizing threads: fitting may count a prompt's tokens exactly (in an
            # engine process: over its pipe) and queueing builds and tokenises each prompt (the
            # seam's `prepare`); neither may block the event loop or the engine thread. A refused
            # update raises before any target's draft is queued.
            futures = (await asyncio.get_running_loop().run_in_executor(
                self.engine.tokenizing, self._fit_and_submit, wanted)) if wanted else []
            drafts = {t: await _draft_of(f) for t, f in futures}
            steps = self.targets.apply(source, drafts)
            frames = []
            for target, step in steps:
                frame = translation_frame(update, step, received)
                frame.target_lang = target if self.multi else None
                frames.append((step, frame, frame.to_json()))
        except asyncio.CancelledError:
            raise
        except Superseded:  # a newer update of this session is queued; it answers instead
            stats.coalesced += 1
            return
        except EngineDied as e:  # the session cannot go on here; it reconnects to a live engine
            self._engine_died(e, update.seq)
            return
        except UpdateRejected as e:
            stats.errors[BAD_PROTOCOL] += 1
            self._send(ErrorFrame(code=BAD_PROTOCOL, message=str(e), seq=update.seq).to_json())
            return
        except Exception as e:  # the engine (or the reply) failed on this update; the session goes on
            log.exception("update seq=%s failed", update.seq)
            stats.errors[PROCESSING_FAILED] += 1
            message = f"{type(e).__name__}: {e}"[:300]
            self._send(ErrorFrame(code=PROCESSING_FAILED, message=message, seq=update.seq).to_json())
            return
        for step, frame, text in frames:
            self._send(text)
            stats.engine_calls += step.engine_calls
            stats.paths[step.path] += 1
            self._record(self.server.step_log, {"connection": self.id, **frame.model_dump(include=_LOGGED)})

    def _record(self, records, entry: dict) -> None:
        try:
            records.append(entry)
        except Exception:  # noqa: BLE001 - a record that cannot be kept loses nothing the client needs
            log.exception("connection %d: record not kept", self.id)


def peer_of(ws) -> str:
    """The peer's address (no port): what the per-peer bounds count."""
    address = getattr(ws, "remote_address", None)
    return str(address[0]) if address else "?"


async def _draft_of(future: Future) -> Draft:
    """The draft of a scheduler future, awaited without a thread. Shielded: a closing connection
    stops waiting but never cancels a future the engine thread resolves (closing the session
    drops its drafts); whatever arrives after nobody waits is read here, so nothing is logged as
    lost."""
    waited = asyncio.wrap_future(future)
    waited.add_done_callback(lambda f: f.cancelled() or f.exception())
    return await asyncio.shield(waited)


_LOGGED = {"seq", "utterance_id", "final", "path", "engine_calls", "compute_ms", "server_ms",
           "committed_text", "committed_delta", "stop_reason"}


def translation_frame(update: UpdateFrame, step: Step, received: float) -> TranslationFrame:
    return TranslationFrame(
        seq=update.seq,
        utterance_id=step.utterance_id,
        final=step.final,
        forced_final=step.forced_final,
        committed_text=step.committed_text.strip(),
        committed_delta=step.committed_delta,
        buffer_text=step.buffer_text,
        covered_source_units=step.covered_source_units,
        stop_reason=step.stop_reason,
        path=step.path,
        engine_calls=step.engine_calls,
        compute_ms=round(step.elapsed_ms, 3),
        server_ms=round((time.perf_counter() - received) * 1000.0, 3),
        ignored_fields=update.unknown_fields() or None,
    )
