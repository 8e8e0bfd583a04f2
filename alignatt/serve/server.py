"""alignatt-mt-server: the WhisperLiveKit `alignatt` protocol v1 over WebSocket.

One connection is one `Session`. Engines (a loaded seam, `alignatt.serve.pool`) are shared: every
draft of an engine runs on that engine's single worker thread, off the event loop, so one model
serves all sessions and the loop stays free for the zero-call paths (commit fast path, unchanged
updates), which run inline. Per connection, queued partial updates are coalesced (only the newest
is kept: each one carries the whole state of the open utterance) while finals are never dropped
or reordered; the client reads replies until one has its seq or a newer one. What is served
(presets, limits, directions) is `alignatt.serve.config`.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from alignatt.core.prompt import recent_history
from alignatt.serve.multi_target import MultiTargetSession
from alignatt.serve.pool import Engine, EngineRegistry, route_key
from alignatt.core.errors import AlignattError
from alignatt.serve.protocol import (
    BAD_PROTOCOL,
    BUSY,
    PROCESSING_FAILED,
    UNSUPPORTED_DIRECTION,
    ErrorFrame,
    InitFrame,
    InitOk,
    ProtocolError,
    TranslationFrame,
    UpdateFrame,
    override_policy_fields,
    parse_frame,
)
from alignatt.serve.config import (
    DirectionRoute,
    SeamFactory,
    ServerConfig,
    default_seam_factory,
    head_set_name,
    resolve_heads,
    resolve_preset,
    server_config,
)
from alignatt.serve.session import Session, SessionConfig, Step, UpdateRejected

log = logging.getLogger("alignatt.serve.server")


# ---- the server ----


@dataclass
class ServerStats:
    connections: int = 0
    sessions_opened: int = 0
    sessions_active: int = 0
    updates: int = 0
    coalesced: int = 0  # partials dropped because a newer update of the session was queued
    engine_calls: int = 0
    paths: collections.Counter = field(default_factory=collections.Counter)
    errors: collections.Counter = field(default_factory=collections.Counter)


class MTServer:
    def __init__(self, config: ServerConfig | None = None, seam_factory: SeamFactory | None = None):
        self.config = config or ServerConfig()
        resolve_preset(self.config.default_preset)  # fail at start, not at the first session
        self.registry = EngineRegistry(seam_factory or default_seam_factory, self.config.directions)
        self.stats = ServerStats()
        # Recent translation steps, server-side (the smoke reads the fast-path latencies here).
        self.step_log: collections.deque[dict] = collections.deque(maxlen=50_000)
        self.session_log: collections.deque[dict] = collections.deque(maxlen=1_000)  # accepted inits
        self._server = None
        self.port: int | None = None

    async def start(self) -> int:
        from websockets.asyncio.server import serve

        if self.config.preload:
            loop = asyncio.get_running_loop()
            for direction, route in self.config.directions.items():
                await loop.run_in_executor(None, self.registry.get, route, direction)
        limits = self.config.limits
        self._server = await serve(
            self._handle,
            self.config.host,
            self.config.port,
            max_size=limits.max_frame_bytes * limits.hard_frame_factor,
        )
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        self.registry.close()

    async def serve_forever(self) -> None:
        await self.start()
        try:
            await asyncio.Future()
        finally:
            await self.stop()

    async def _handle(self, ws) -> None:
        self.stats.connections += 1
        await _Connection(self, ws, self.stats.connections).run()


class _Connection:
    """One WebSocket connection: a reader that validates and queues, a worker that translates."""

    def __init__(self, server: MTServer, ws, connection_id: int) -> None:
        self.id = connection_id
        self.server = server
        self.ws = ws
        self.limits = server.config.limits
        self.session: Session | None = None
        self.multi: MultiTargetSession | None = None  # `target_langs` sessions
        self.engine: Engine | None = None
        self.pending: collections.deque[tuple[UpdateFrame, float]] = collections.deque()
        self.wake = asyncio.Event()
        self.last_seq: int | None = None
        self.worker: asyncio.Task | None = None
        self.holds_slot = False

    async def run(self) -> None:
        from websockets.exceptions import ConnectionClosed

        try:
            while True:
                try:
                    # Bytes for every frame: a frame that is not UTF-8 gets an error frame
                    # instead of failing the connection.
                    raw = await self.ws.recv(decode=False)
                except ConnectionClosed:
                    break
                received = time.perf_counter()
                try:
                    frame = parse_frame(raw, self.limits.max_frame_bytes)
                    if isinstance(frame, InitFrame):
                        await self._init(frame)
                    else:
                        self._enqueue(frame, received)
                except ProtocolError as e:
                    self.server.stats.errors[e.code] += 1
                    await self._send(e.frame().to_json())
                    if e.code == BUSY:
                        await self.ws.close(1013, "session limit reached")
                        break
        finally:
            if self.worker is not None:
                self.worker.cancel()
            if self.holds_slot:
                self.server.stats.sessions_active -= 1

    async def _send(self, text: str) -> None:
        from websockets.exceptions import ConnectionClosed

        try:
            await self.ws.send(text)
        except ConnectionClosed:
            pass  # the client left; its session ends with the reader loop

    def _routes(self, frame: InitFrame) -> dict[str, tuple[str, DirectionRoute]]:
        """(direction, route) per target language; every one must be served, by one engine."""
        server = self.server
        targets = frame.targets
        if frame.target_langs is not None and frame.target_lang.strip().lower() not in targets:
            raise ProtocolError(BAD_PROTOCOL, f"target_lang {frame.target_lang!r} is not one of target_langs {targets}")
        routes = {}
        for target in targets:
            direction = f"{frame.source_lang.strip().lower()}-{target}"
            route = server.config.directions.get(direction)
            if route is None:
                supported = sorted(server.config.directions)
                raise ProtocolError(
                    UNSUPPORTED_DIRECTION,
                    f"direction {direction} is not served here; supported: {', '.join(supported)}",
                    supported=supported,
                )
            routes[target] = (direction, route)
        if len({route_key(r) for _, r in routes.values()}) > 1:
            raise ProtocolError(BAD_PROTOCOL, f"target_langs {targets} are served by different models; "
                                              "a multi-target session needs one engine for all of them")
        return routes

    def _bounded_context(self, frame: InitFrame) -> tuple[str, list[tuple[str, str]], int]:
        """The context text and the history turns kept (the newest), or bad_protocol past a bound."""
        cfg = self.server.config.context
        context = frame.context_text.strip()
        if len(context) > cfg.max_context_chars:
            raise ProtocolError(BAD_PROTOCOL, f"context_text of {len(context)} characters exceeds the "
                                              f"{cfg.max_context_chars}-character bound")
        for i, pair in enumerate(frame.history):
            longest = max(len(x) for x in pair)
            if longest > cfg.max_history_entry_chars:
                raise ProtocolError(BAD_PROTOCOL, f"history[{i}] has a text of {longest} characters; the "
                                                  f"bound is {cfg.max_history_entry_chars}")
        kept = recent_history([tuple(p) for p in frame.history], cfg)
        return context, kept, len(frame.history) - len(kept)

    async def _init(self, frame: InitFrame) -> None:
        server = self.server
        if self.session is not None:
            raise ProtocolError(BAD_PROTOCOL, "this connection already has a session (one init per connection)")
        routes = self._routes(frame)
        direction, route = next(iter(routes.values()))
        context, history, trimmed = self._bounded_context(frame)
        preset = resolve_preset(frame.preset or server.config.default_preset)
        fields, unknown = override_policy_fields(frame.overrides)
        policy = preset.policy.model_copy(update=fields)
        if server.stats.sessions_active >= self.limits.max_sessions:
            raise ProtocolError(BUSY, f"all {self.limits.max_sessions} sessions are in use; retry later")
        server.stats.sessions_active += 1  # hold the slot while the engine is looked up
        self.holds_slot = True
        try:
            engine = await asyncio.get_running_loop().run_in_executor(
                None, server.registry.get, route, direction
            )
        except Exception as e:
            server.stats.sessions_active -= 1
            self.holds_slot = False
            log.exception("engine for %s failed to load", direction)
            raise ProtocolError(PROCESSING_FAILED, f"cannot load the engine for {direction}: {e}"[:300]) from None
        config = SessionConfig(
            policy=policy,
            max_new_tokens=preset.max_new_tokens,
            max_utterance_words=self.limits.max_utterance_words,
            max_tail_words=self.limits.max_tail_words,
            context=server.config.context,
        )
        self.engine = engine
        sessions: dict[str, Session] = {}
        described = []
        for i, (target, (d, r)) in enumerate(routes.items()):
            view = engine.view(resolve_heads(r, d))
            # The client's prefix and history are in its target_lang (the first target).
            sessions[target] = Session(
                view, config, source_lang=frame.source_lang.strip().lower(), target_lang=target,
                accepted_target_prefix=frame.accepted_target_prefix if i == 0 else "",
                history=history if i == 0 else [], context_text=context,
            )
            described.append({"target_lang": target, "direction": d, "model": r.model, "seam": r.seam,
                              "head_set": head_set_name(r, d), "heads": [(h.layer, h.head) for h in view.heads]})
        self.session = next(iter(sessions.values()))
        if frame.target_langs is not None:
            self.multi = MultiTargetSession(sessions, {t: engine for t in sessions})
        server.stats.sessions_opened += 1
        self.worker = asyncio.create_task(self._work())
        ok = InitOk(
            direction=direction,
            preset=preset.name,
            model=route.model,
            seam=route.seam,
            heads=described[0]["heads"],
            policy=policy.model_dump(),
            unknown_overrides=unknown,
            ignored_fields=frame.unknown_fields(),
            source_lang=frame.source_lang.strip().lower(),
            target_lang=described[0]["target_lang"],
            head_set=described[0]["head_set"],
            session=config.model_dump(),
            context_chars=len(context),
            history_received=len(frame.history),
            history_used=len(history),
            history_trimmed=trimmed,
            targets=described if self.multi is not None else None,
        )
        await self._send(ok.to_json())
        server.session_log.append({
            "connection": self.id, **ok.model_dump(include={"direction", "preset", "policy", "unknown_overrides"}),
            "accepted_target_prefix": frame.accepted_target_prefix, "history": len(frame.history),
            "history_trimmed": trimmed, "context_chars": len(context), "targets": list(routes),
        })

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
        # Every update carries the open utterance's whole state: queued partials are stale now.
        kept = collections.deque(item for item in self.pending if item[0].is_final)
        self.server.stats.coalesced += len(self.pending) - len(kept)
        kept.append((update, received))
        self.pending = kept
        self.wake.set()

    async def _work(self) -> None:
        while True:
            while not self.pending:
                self.wake.clear()
                await self.wake.wait()
            update, received = self.pending.popleft()
            await self._process(update, received)

    async def _process(self, update: UpdateFrame, received: float) -> None:
        session, stats = self.multi or self.session, self.server.stats
        args = (update.words, update.tail_words, update.is_final, update.utterance_id)
        stats.updates += 1
        try:
            if session.needs_engine(*args):
                loop = asyncio.get_running_loop()
                result = await loop.run_in_executor(self.engine.executor, session.update, *args)
            else:
                result = session.update(*args)  # no model work: answer from the event loop
        except asyncio.CancelledError:
            raise
        except UpdateRejected as e:
            stats.errors[BAD_PROTOCOL] += 1
            await self._send(ErrorFrame(code=BAD_PROTOCOL, message=str(e), seq=update.seq).to_json())
            return
        except Exception as e:  # the engine failed on this update; the session goes on
            log.exception("update seq=%s failed", update.seq)
            stats.errors[PROCESSING_FAILED] += 1
            message = f"{type(e).__name__}: {e}"[:300]
            await self._send(ErrorFrame(code=PROCESSING_FAILED, message=message, seq=update.seq).to_json())
            return
        # A multi-target session answers with one frame per target, each naming its target.
        for target, step in result if self.multi is not None else [(None, result)]:
            stats.engine_calls += step.engine_calls
            stats.paths[step.path] += 1
            frame = translation_frame(update, step, received)
            frame.target_lang = target
            await self._send(frame.to_json())
            self.server.step_log.append(
                {"connection": self.id, **frame.model_dump(include=_LOGGED)}
            )


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


# ---- running it ----


class ServerThread:
    """An `MTServer` on its own event loop in a background thread (tests, smoke, embedding)."""

    def __init__(self, config: ServerConfig | None = None, seam_factory: SeamFactory | None = None):
        self.server = MTServer(config, seam_factory)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stopped: asyncio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None

    @property
    def url(self) -> str:
        return f"ws://{self.server.config.host}:{self.server.port}"

    def start(self, timeout: float = 600.0) -> "ServerThread":
        self._thread = threading.Thread(target=self._run, name="alignatt-server", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout):
            raise AlignattError(f"server did not start within {timeout:.0f}s")
        if self._error is not None:
            raise self._error
        return self

    def _run(self) -> None:
        async def main() -> None:
            self._stopped = asyncio.Event()
            try:
                await self.server.start()
            except BaseException as e:  # reported to the starting thread
                self._error = e
                self._ready.set()
                return
            self._ready.set()
            await self._stopped.wait()
            await self.server.stop()

        self._loop = asyncio.new_event_loop()
        try:
            self._loop.run_until_complete(main())
        finally:
            self._loop.close()

    def call(self, fn: Callable[[], object]) -> object:
        """Run `fn` on the server's loop (to read its state consistently)."""
        async def wrapped():
            return fn()

        return asyncio.run_coroutine_threadsafe(wrapped(), self._loop).result(10)

    def stop(self) -> None:
        if self._loop is not None and self._stopped is not None and self._loop.is_running():
            self._loop.call_soon_threadsafe(self._stopped.set)
        if self._thread is not None:
            self._thread.join(30)

    def __enter__(self) -> "ServerThread":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def serve(config: ServerConfig, seam_factory: SeamFactory | None = None,
          on_ready: Callable[[MTServer], None] | None = None) -> None:
    """Run the server in the foreground until interrupted."""

    async def main() -> None:
        server = MTServer(config, seam_factory)
        await server.start()
        if on_ready is not None:
            on_ready(server)
        try:
            await asyncio.Future()
        finally:
            await server.stop()

    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        pass


def main(argv: list[str] | None = None) -> int:
    """`alignatt-mt-server` / `python -m alignatt.serve.server`: `alignatt serve` without the typer CLI
    (for hosts that have the inference stack but not the CLI's dependencies)."""
    import argparse

    p = argparse.ArgumentParser(prog="alignatt-mt-server", description=main.__doc__)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8765)
    p.add_argument("--model", default="gemma3-270m")
    p.add_argument("--seam", default="hf_qk_fast")
    p.add_argument("--preset", default="balanced")
    p.add_argument("--direction", default="en-de")
    p.add_argument("--heads")
    p.add_argument("--top-k", type=int, default=4)
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype")
    p.add_argument("--max-sessions", type=int, default=8)
    p.add_argument("--max-utterance-words", type=int, default=80)
    p.add_argument("--vllm-mode")
    p.add_argument("--config", help="ServerConfig JSON; replaces the options above")
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    try:
        cfg = server_config(
            config_path=a.config, host=a.host, port=a.port, model=a.model, seam=a.seam, preset=a.preset,
            direction=a.direction, heads=a.heads, top_k=a.top_k, device=a.device, dtype=a.dtype,
            max_sessions=a.max_sessions, max_utterance_words=a.max_utterance_words, vllm_mode=a.vllm_mode,
        )
        serve(cfg, on_ready=lambda s: print(
            f"alignatt-mt-server listening on ws://{cfg.host}:{s.port} (preset {cfg.default_preset})", flush=True))
    except AlignattError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
