"""alignatt-mt-server: the WhisperLiveKit `alignatt` protocol v1 over WebSocket.

One connection is one `Session`. Engines (a loaded seam, `alignatt.serve.pool`) are shared: every
draft of an engine runs on that engine's single worker thread, off the event loop, so one model
serves all sessions and the loop stays free for the zero-call paths (commit fast path, unchanged
updates), which run inline. Per connection, queued partial updates are coalesced (only the newest
is kept: each one carries the whole state of the open utterance) while finals are never dropped
or reordered; the client reads replies until one has its seq or a newer one. A connection's
reader, worker and writer are `alignatt.serve.connection`. What is served (presets, limits,
directions, engines per route) is `alignatt.serve.config`. Besides WebSocket upgrades the server
answers two plain HTTP GETs, for load balancers and monitoring: `/health` and `/stats`. Who may
connect (Origin, token, TLS) is decided at the handshake: `alignatt.serve.access`.
"""

from __future__ import annotations

import asyncio
import gc
import http
import json
import logging
import signal
import threading
import time
from typing import Any, Callable

from alignatt.core.errors import AlignattError
from alignatt.serve import access
from alignatt.serve.budget import PromptBudget
from alignatt.serve.config import SeamFactory, ServerConfig, default_seam_factory, resolve_preset
from alignatt.serve.connection import Connection, peer_of, translation_frame  # noqa: F401 - translation_frame re-exported
from alignatt.serve.engine_process import portable_error
from alignatt.serve.front_ends import DRAIN, ENGINE_STATS, SNAPSHOT, STOP, FrontEnds, FrontEndSpec
from alignatt.serve.gc_pauses import freeze_startup_heap, process_pauses
from alignatt.serve.host import ServerStats, SessionSlots, WaitingPeers  # noqa: F401 - re-exported: the counters' home is serve.host
from alignatt.serve.pool import Engine, EngineRegistry, route_key
from alignatt.serve.records import ByteBoundedLog
from alignatt.serve.scheduler import SchedulerConfig
from alignatt.serve.session import SessionConfig

log = logging.getLogger("alignatt.serve.server")
# websockets' own logger: one INFO line per connection (refusals too) and, at DEBUG, every request
# line and header, a token among them. Kept at WARNING; the server logs what matters itself.
wire_log = logging.getLogger("alignatt.serve.wire")
wire_log.setLevel(logging.WARNING)


# ---- the server ----


class MTServer:
    def __init__(self, config: ServerConfig | None = None, seam_factory: SeamFactory | None = None,
                 front_end: FrontEndSpec | None = None):
        self.config = config or ServerConfig()
        resolve_preset(self.config.default_preset)  # fail at start, not at the first session
        # Capacity is counted once, in client sessions (a multi-target session is one): the server
        # admits `max_sessions`, and so does each engine's scheduler; `/health` reports the same.
        self.registry = EngineRegistry(seam_factory or default_seam_factory,
                                       SchedulerConfig(capacity=self.config.limits.max_sessions),
                                       routes=self.config.directions, engines=self.config.engines,
                                       replicas=self.config.replicas, front_ends=self.config.front_ends)
        # With several front ends (`serve.front_ends`): the first one (this, unless `front_end` says
        # which other one this is) loads the engines and starts the others; all count sessions as one.
        self.slots = (SessionSlots(front_end.slots, front_end.index) if front_end
                      else SessionSlots.for_front_ends(self.config.front_ends))
        self.front_ends = (FrontEnds(self.config, self.slots, run_front_end)
                           if self.config.front_ends > 1 and not front_end else None)
        for attached in front_end.engines if front_end else ():
            self.registry.attach(attached.handoff.name, attached.route, attached.heads, attached.handoff)
        self.stats = ServerStats(slots=self.slots)
        self.token = access.check_exposure(self.config)  # never logged, never echoed
        self.ssl = access.ssl_context(self.config)
        self.waiting = WaitingPeers()  # connections without a session yet, per peer address
        self._refusals_logged = access.OncePerPeer()
        limits = self.config.limits
        # Recent translation steps, server-side (the smoke reads the fast-path latencies here).
        self.step_log = ByteBoundedLog(limits.step_log_bytes)
        self.session_log = ByteBoundedLog(limits.session_log_bytes)  # accepted inits
        self._budgets: dict[str, PromptBudget | None] = {}
        self.connections: set[Connection] = set()
        self.draining = False  # SIGTERM: no new session; open ones handed over between utterances
        self._server = None
        self.port: int | None = None

    async def start(self) -> int:
        from websockets.asyncio.server import serve

        if self.config.preload:
            loop = asyncio.get_running_loop()
            for direction, route in self.config.directions.items():
                await loop.run_in_executor(None, self.registry.load, route, direction)
            freeze_startup_heap()  # the engines' startup objects: no full collection walks them again
        process_pauses()  # counted from here (`Engine.stats`)
        limits = self.config.limits
        self._server = await serve(
            self._handle,
            self.config.host,
            self.config.port,
            process_request=self._http,
            process_response=self._refusal_logged,
            origins=access.allowed_origins(self.config),
            ssl=self.ssl,
            logger=wire_log,
            max_size=limits.max_frame_bytes * limits.hard_frame_factor,
            ping_interval=limits.ping_interval_s,
            ping_timeout=limits.ping_timeout_s,
            reuse_port=self.config.front_ends > 1,  # every front end listens on the one port
        )
        self.port = self._server.sockets[0].getsockname()[1]
        if self.front_ends is not None:
            await asyncio.get_running_loop().run_in_executor(None, self.front_ends.start, self.port,
                                                             self.registry.engines)
        return self.port

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        if self.front_ends is not None:  # before the engines: their sessions' drafts end first
            await asyncio.get_running_loop().run_in_executor(None, self.front_ends.stop)
        self.registry.close()
        gc.unfreeze()  # what this server left behind can be collected (a process may start another)

    async def serve_forever(self) -> None:
        await self.start()
        try:
            await asyncio.Future()
        finally:
            await self.stop()

    async def budget_for(self, engine: Engine) -> PromptBudget | None:
        """The engine's token bounds (counted with its tokenizer, on its thread), built once."""
        if engine.name not in self._budgets:
            draft_tokens = SessionConfig().final_max_new_tokens
            budget = await asyncio.get_running_loop().run_in_executor(
                engine.tokenizing, engine.budget, self.config.limits, draft_tokens
            )
            self._budgets[engine.name] = budget
            log.info("engine %s: token bounds %s", engine.name, budget.describe() if budget else "none (no tokenizer)")
        return self._budgets[engine.name]

    async def _handle(self, ws) -> None:
        self.stats.connections += 1
        connection = Connection(self, ws, self.stats.connections)
        self.connections.add(connection)
        try:
            if self.draining:  # let in before the drain began, after the handshake's check
                connection.hand_over()
            await connection.run()
        finally:
            self.connections.discard(connection)

    async def drain(self) -> None:
        """Stop taking sessions (`/health` says `draining`, 503; new handshakes get 503), let every
        open utterance finish for up to `drain_s` (a session is handed over as soon as its last
        final is answered), then hand over the rest and wait for their sockets to close. What a
        rolling restart sends (SIGTERM): the clients reconnect through the balancer elsewhere."""
        loop = asyncio.get_running_loop()
        self.draining = True
        others = loop.run_in_executor(None, self.front_ends.ask, DRAIN, self.config.drain_s
                                      + self.config.limits.send_stall_s + 30) if self.front_ends else None
        log.info("draining: %d connections; open utterances may finish for %g s", len(self.connections),
                 self.config.drain_s)
        deadline = loop.time() + self.config.drain_s
        while self.connections and loop.time() < deadline:
            for connection in list(self.connections):
                if connection.session is None or connection.between_utterances():
                    connection.hand_over()
            await asyncio.sleep(0.05)
        for connection in list(self.connections):
            connection.hand_over()
        deadline = loop.time() + self.config.limits.send_stall_s
        while self.connections and loop.time() < deadline:
            await asyncio.sleep(0.05)
        if others is not None:
            await others
        log.info("drained (%d connections left open)", len(self.connections))

    # ---- health and stats ----

    def snapshot(self) -> dict:
        """The server's counters and every engine's figures (`Engine.stats`), alive or not; with
        several front ends, this one's, and each other one's under `front_ends`."""
        own = {**self.stats.as_dict(), "engines": [e.stats() for e in self.registry.engines]}
        if self.config.front_ends > 1:
            own["front_end"] = self.slots.index  # which process answered (0: the first)
        return {**own, "front_ends": self.front_ends.ask(SNAPSHOT)} if self.front_ends else own

    def level_counters(self) -> dict:
        """What a load level reads before and after itself, in one round of questions: the partials
        every front end dropped for a newer one, and each other front end's CPU time so far (None: lost)."""
        others = self.front_ends.ask(SNAPSHOT) if self.front_ends else []
        return {"coalesced": self.stats.coalesced + sum(s["coalesced"] for s in others if s),
                "front_end_cpu_s": [s["cpu_s"] if s else None for s in others]}

    def engine_stats(self) -> list[dict]:
        """`Engine.stats` of every engine as each front end drives it (the others' tagged `front_end`)."""
        own = [e.stats() for e in self.registry.engines]
        if self.front_ends is None:
            return own
        return own + [stats for answer in self.front_ends.ask(ENGINE_STATS) for stats in answer or []]

    def health(self) -> dict:
        """What a new session would get, in the one count of capacity (client sessions, a
        multi-target session is one; `max_sessions`, as `busy` is decided):

        - draining: SIGTERM came; no new session (`drain`);
        - down: some served route has engines but none of them live (dead, or hung: taken out);
        - full: `max_sessions` sessions are open, or no live engine of a loaded route has room;
        - degraded: admitted, but some engine is dead or hung (fewer engines serve the sessions), or
          some front end exited (fewer processes take the port's connections);
        - ok: admitted, every engine live. A route not loaded yet counts as up.
        """
        routes: dict[tuple, list[Engine]] = {}
        for e in self.registry.engines:
            routes.setdefault(route_key(e.route), []).append(e)
        live = {key: [e for e in engines if e.alive] for key, engines in routes.items()}
        down = any(not engines for engines in live.values())
        no_room = any(not any(e.scheduler.has_room() for e in engines) for engines in live.values())
        active, limit = self.slots.count, self.config.limits.max_sessions
        waiting = self.stats.connections_before_init
        limits = self.config.limits  # busy: a new connection would be refused (no idle one makes room)
        busy = not self.waiting.room_for(None, limits.max_connections_before_init_per_peer,
                                         limits.max_connections_before_init)
        lost = sum(len(engines) - len(live[key]) for key, engines in routes.items())
        lost += len(self.front_ends.lost) if self.front_ends else 0  # a front end gone: fewer serve
        status = ("draining" if self.draining else "down" if down else "full" if active >= limit or no_room
                  else "busy" if busy else "degraded" if lost else "ok")
        states = [e.state for e in self.registry.engines]
        return {"status": status, "sessions_active": active, "max_sessions": limit,
                "sessions_free": 0 if status in ("draining", "down", "full", "busy") else limit - active,
                "connections_before_init": waiting,
                "engines": len(states), "engines_alive": states.count("live"),
                "engines_hung": states.count("hung"), "engines_dead": states.count("dead"),
                **({"front_ends": self.config.front_ends, "front_ends_lost": len(self.front_ends.lost)}
                   if self.front_ends else {})}

    def _http(self, connection, request):
        """`GET /health` (open to all: 200 when a new session is admitted, ok or degraded, else
        503) and `GET /stats` (the token's, when there is one); anything else is a WebSocket,
        refused here without the token (401), or when no connection waiting for init can make room (503)."""
        path = access.path_of(request.path)
        authorized = self.token is None or access.token_matches(self.token, access.presented_token(request))
        if path == "/health":
            body = self.health()
            admitted = body["status"] in ("ok", "degraded")
            status = http.HTTPStatus.OK if admitted else http.HTTPStatus.SERVICE_UNAVAILABLE
        elif path == "/stats" and authorized:
            body, status = self.snapshot(), http.HTTPStatus.OK
        elif not authorized:
            self.stats.closes["unauthorized"] += 1
            self._log_refusal("token", peer_of(connection), f"no valid token for {path}")
            response = connection.respond(http.HTTPStatus.UNAUTHORIZED, "a valid token is required\n")
            response.headers["WWW-Authenticate"] = "Bearer"
            return response
        elif self.draining:
            self.stats.closes["draining"] += 1
            return connection.respond(http.HTTPStatus.SERVICE_UNAVAILABLE,
                                      "this server is draining (a restart); connect to another\n")
        elif not self.waiting.room_for(peer_of(connection), self.config.limits.max_connections_before_init_per_peer,
                                       self.config.limits.max_connections_before_init):
            # Every waiting connection (this address's, or all of them) opened within the grace.
            self.stats.closes["busy_before_init"] += 1
            self._log_refusal("waiting", peer_of(connection), "too many connections waiting for init")
            return connection.respond(http.HTTPStatus.SERVICE_UNAVAILABLE,
                                      "too many connections are waiting for init; retry later\n")
        else:
            return None
        response = connection.respond(status, json.dumps(body, default=str) + "\n")
        del response.headers["Content-Type"]
        response.headers["Content-Type"] = "application/json"
        return response


    def _refusal_logged(self, connection, request, response):
        """websockets' Origin check answered 403: counted, and logged once per peer."""
        from websockets.exceptions import InvalidOrigin

        if response.status_code == http.HTTPStatus.FORBIDDEN and isinstance(
                connection.protocol.handshake_exc, InvalidOrigin):
            self.stats.closes["origin_refused"] += 1
            origin = request.headers.get("Origin", "")
            self._log_refusal("origin", peer_of(connection), f"Origin {origin[:100]!r} is not allowed "
                                                               "(--allow-origin to trust a page)")
        return None

    def _log_refusal(self, kind: str, peer: str, why: str) -> None:
        if self._refusals_logged.first(kind, peer):
            log.warning("refused %s at the handshake: %s (logged once per address)", peer, why)


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
        scheme = "wss" if self.server.ssl is not None else "ws"
        return f"{scheme}://{self.server.config.host}:{self.server.port}"

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

    def drain(self, timeout: float = 120.0) -> None:
        """What SIGTERM does to `serve`: `MTServer.drain`, waited for (the server keeps listening)."""
        asyncio.run_coroutine_threadsafe(self.server.drain(), self._loop).result(timeout)

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
    """Run the server in the foreground until Ctrl-C or SIGTERM (what a service manager,
    `podman stop` or a rolling restart sends), then stop it cleanly. SIGTERM drains first
    (`MTServer.drain`: no new session, open utterances finish or are handed over); a second SIGTERM,
    or Ctrl-C, stops at once: sessions closed, seams closed."""

    async def main() -> None:
        server = MTServer(config, seam_factory)
        await server.start()
        loop = asyncio.get_running_loop()
        stopped = loop.create_future()
        draining: list[asyncio.Task] = []

        def on_term() -> None:
            if not draining:  # the first: drain, then stop
                draining.append(loop.create_task(server.drain()))
                draining[0].add_done_callback(lambda _: stopped.done() or stopped.set_result(None))
            elif not stopped.done():  # the second: stop now
                stopped.set_result(None)

        try:
            loop.add_signal_handler(signal.SIGTERM, on_term)
        except (NotImplementedError, RuntimeError):  # not the main thread, or no signals here
            pass
        if on_ready is not None:
            on_ready(server)
        try:
            await stopped
        finally:
            await server.stop()

    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        pass


def run_front_end(spec: FrontEndSpec) -> None:
    """A front end's main: serve the first one's config on its port with the engines it was handed,
    and answer the first one's requests until it asks to stop (or is gone)."""
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s %(name)s[{spec.index}] %(message)s")
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the first front end, which stops us
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # so does SIGTERM: the first one drains us with it

    async def main() -> None:
        loop = asyncio.get_running_loop()
        try:
            server = MTServer(spec.config, front_end=spec)
            await server.start()
        except BaseException as e:  # noqa: BLE001 - the first front end raises it
            spec.control.send(portable_error(e))
            return
        spec.control.send("listening")
        stopped = loop.create_future()

        def answer(request: str) -> Any:
            if request == SNAPSHOT:
                return {**server.snapshot(), "cpu_s": time.process_time()}
            if request == ENGINE_STATS:
                return [dict(e.stats(), front_end=spec.index) for e in server.registry.engines]
            raise ValueError(f"front end: unknown request {request!r}")

        def control() -> None:
            while True:
                try:
                    number, request = spec.control.recv()
                except (EOFError, OSError):  # the first front end is gone
                    number, request = None, STOP
                if request == STOP:  # answered once this server has stopped
                    stopping.append(number)
                    loop.call_soon_threadsafe(lambda: stopped.done() or stopped.set_result(None))
                    return
                if request == DRAIN:
                    asyncio.run_coroutine_threadsafe(server.drain(), loop).result()
                    reply: Any = "drained"
                else:
                    reply = asyncio.run_coroutine_threadsafe(_on_loop(answer, request), loop).result()
                spec.control.send((number, reply))

        stopping: list[int | None] = []
        threading.Thread(target=control, name="front-end-control", daemon=True).start()
        try:
            await stopped
        finally:
            await server.stop()
        try:
            spec.control.send((stopping[0] if stopping else None, "stopped"))
        except OSError:
            pass

    asyncio.run(main())


async def _on_loop(fn: Any, *args: Any) -> Any:
    return fn(*args)

