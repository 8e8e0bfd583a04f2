"""Front ends: more server processes on the one port, sharing the engines' processes.

One server process runs every session's protocol, policy and settling under one interpreter lock;
past a few hundred speakers that lock, not the GPU, paces it (the load stage's
`server_thread_cpu_cores`). With `ServerConfig.front_ends` N, the process `alignatt serve` starts
(the first front end) loads the engines, each in a process of its own, and starts N-1 more server
processes, as vLLM scales its API server out. Each listens on the same host:port (SO_REUSEPORT: the
kernel deals new connections among them), runs its own connections, sessions, draft scheduler and
tokenizing threads, and drives the same engine processes over a pipe of its own
(`serve.engine_client.EngineHandoff`): one engine step batches the drafts of every front end
(`serve.engine_process`). The first front end answers for the others: open sessions are counted
against `max_sessions` in shared memory, per front end and summed (`SessionSlots`), its `/stats`
lists every front end's figures, SIGTERM drains them all, it gives back the slots of one that dies,
and it stops them before it closes the engines.
"""

from __future__ import annotations

import logging
import multiprocessing
import multiprocessing.connection
import threading
from dataclasses import dataclass
from typing import Any, Callable

from alignatt.core.draft import Head
from alignatt.core.errors import AlignattError
from alignatt.serve.config import DirectionRoute, ServerConfig
from alignatt.serve.engine_client import EngineHandoff
from alignatt.serve.host import SessionSlots

log = logging.getLogger("alignatt.serve.server")


@dataclass
class AttachedEngine:
    """An engine another front end started, as this one drives it."""

    route: DirectionRoute
    heads: list[Head]
    handoff: EngineHandoff


@dataclass
class FrontEndSpec:
    """What a front end's process is started with (pickled once, when it is spawned)."""

    index: int
    config: ServerConfig  # the first front end's, with its port
    engines: list[AttachedEngine]
    slots: Any  # SessionSlots.shared
    control: multiprocessing.connection.Connection  # requests from the first front end


# What the first front end may ask another (each numbered; the answer carries the number).
SNAPSHOT, ENGINE_STATS, DRAIN, STOP = "snapshot", "engine_stats", "drain", "stop"


class FrontEnds:
    """The first front end's handle on the others: started after its engines are loaded and its
    socket listens, asked for their figures, drained and stopped with it."""

    def __init__(self, config: ServerConfig, slots: SessionSlots, main: Callable[[FrontEndSpec], None]) -> None:
        self.config = config
        self.slots = slots
        self.main = main  # a front end's process: `serve.server.run_front_end`
        self._processes: list[Any] = []
        self._control: list[multiprocessing.connection.Connection] = []
        self._lock = threading.Lock()  # one request at a time on the control pipes
        self._stopping = False
        self._asked = 0  # requests sent so far: each is numbered, and so is its answer
        self.lost: set[int] = set()  # front ends (by index) that exited unasked

    def start(self, port: int, engines: list[Any], timeout_s: float = 300.0) -> None:
        """Start `config.front_ends - 1` processes serving on `port`, each driving `engines` (the
        registry's, each in a process of its own) over the pipes their seams keep for it."""
        context = multiprocessing.get_context("spawn")
        config = self.config.model_copy(update={"port": port, "preload": False})
        for index in range(1, self.config.front_ends):
            ours, theirs = context.Pipe()
            attached = [AttachedEngine(e.route, e.heads, e.seam.handoffs[index - 1]) for e in engines]
            spec = FrontEndSpec(index, config, attached, self.slots.shared, theirs)
            process = context.Process(target=self.main, args=(spec,), name=f"alignatt-front-end-{index}")
            process.start()
            theirs.close()
            for engine in attached:  # the child took its copy of the pipe: ours would keep it open
                engine.handoff.conn.close()
            self._processes.append(process)
            self._control.append(ours)
        try:
            for index, conn in enumerate(self._control, start=1):
                if not conn.poll(timeout_s):
                    raise AlignattError(f"front end {index} did not start within {timeout_s:.0f}s")
                try:
                    reply = conn.recv()
                except EOFError:
                    raise AlignattError(f"front end {index} exited while starting "
                                        f"(code {self._processes[index - 1].exitcode})") from None
                if isinstance(reply, BaseException):
                    raise reply
        except BaseException:
            self.stop(timeout_s=10.0)  # the ones that did start
            raise
        log.info("%d more front ends listen on port %d (pids %s)", len(self._processes), port,
                 [p.pid for p in self._processes])
        threading.Thread(target=self._watch, name="front-ends-watch", daemon=True).start()

    def _watch(self) -> None:
        """A front end that exits unasked is lost: its sessions went with it (their clients see the
        socket close), its slots are given back, and the others serve on (`/health`: degraded)."""
        waiting = {p.sentinel: index for index, p in enumerate(self._processes, start=1)}
        while waiting and not self._stopping:
            for sentinel in multiprocessing.connection.wait(list(waiting), 1.0):
                index = waiting.pop(sentinel)
                if self._stopping:
                    return
                self.lost.add(index)
                held = self.slots.forget(index)
                log.error("front end %d (process %d) exited with code %s: its %d sessions are gone, the other "
                          "front ends serve on", index, self._processes[index - 1].pid,
                          self._processes[index - 1].exitcode, held)

    def ask(self, request: str, timeout_s: float = 10.0) -> list[Any]:
        """Every other front end's answer to `request` (None from one that is gone, or silent for
        `timeout_s`: its late answer is dropped when read, by its number)."""
        with self._lock:
            self._asked += 1
            answers = []
            for index, conn in enumerate(self._control, start=1):
                answers.append(None if index in self.lost else _answer(conn, self._asked, request, timeout_s))
            return answers

    def stop(self, timeout_s: float = 60.0) -> None:
        """Stop each (its sessions closed, its pipes to the engines closed), then reap it."""
        self._stopping = True
        self.ask(STOP, timeout_s)  # answered once its server has stopped
        for process in self._processes:
            process.join(timeout_s)
            if process.exitcode is None:
                process.kill()
                process.join(5.0)
        for conn in self._control:
            conn.close()
        self._processes, self._control = [], []


def _answer(conn: multiprocessing.connection.Connection, number: int, request: str, timeout_s: float) -> Any:
    """Request `number`'s answer on one control pipe (None: gone, or none within `timeout_s`)."""
    try:
        conn.send((number, request))
        while conn.poll(timeout_s):
            message = conn.recv()  # a late answer to an earlier request, or a start-up message, is dropped
            if isinstance(message, tuple) and message[0] == number:
                return message[1]
    except (EOFError, OSError):
        pass
    return None
