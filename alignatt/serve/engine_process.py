"""An engine in a process of its own: the child's side (what `alignatt.serve.engine_client` starts).

`serve_engine` is the child's main: it beats a heartbeat from a thread of its own, builds the
route's seam on its device, sends `Ready` (with the seam's preparer, so the server prepares
drafts), then answers messages (`alignatt.serve.engine_messages`) until the server sends `Close`
or its end of the pipe is gone. A `Step` carries the submits and aborts queued since the last one;
the child steps its engine once and answers with the drafts that finished. With several front ends
(`alignatt.serve.front_ends`) the child has a pipe to each: it answers each one's messages in that
one's order, and one engine step serves every front end whose `Step` is waiting. The server's
side, `ProcessBatchSeam`, is in `alignatt.serve.engine_client` (as vLLM splits its engine core's
loop from its client).
"""

from __future__ import annotations

import collections
import dataclasses
import multiprocessing.connection
import os
import pickle
import signal
import threading
import time
from dataclasses import dataclass
from typing import Any, Hashable, Sequence

from alignatt.core.draft import Head
from alignatt.serve.batch_seam import as_batch_seam
from alignatt.serve.budget import seam_positions, token_counting
from alignatt.serve.config import DirectionRoute, SeamFactory
from alignatt.serve.engine_messages import (Abort, ChildTotals, Close, Closed, Count, Counted, Described, Describe,
                                            Failed, KernelProfile, Ping, Pong, Profile, Ready, Step, Stepped,
                                            Submit, Totalled, Totals)
from alignatt.serve.engine_profile import KernelWindow, StepProfiler
from alignatt.serve.gc_pauses import freeze_startup_heap, process_pauses


@dataclass(frozen=True)
class EngineSpec:
    """What a child builds: `factory(route, heads)` (picklable: a module-level function or class)."""

    factory: SeamFactory
    route: DirectionRoute
    heads: list[Head]
    cuda_device: str | None = None  # the child's CUDA_VISIBLE_DEVICES; None: inherited
    heartbeat_s: float = 1.0  # the child beats twice in this time


def portable_error(error: BaseException) -> BaseException:
    """The error itself if it survives pickling, else a RuntimeError that names it."""
    try:
        pickle.loads(pickle.dumps(error))
        return error
    except Exception:  # noqa: BLE001
        return RuntimeError(f"{type(error).__name__}: {error}")


def _beat(heartbeat: Any, every_s: float) -> None:
    """The child's heartbeat: the time now, in memory the server reads, every `every_s`. A thread
    of its own, so it beats while the engine thread computes (whenever that thread lets the
    interpreter switch, as Python code does every few milliseconds and native kernels do)."""
    while True:
        heartbeat.value = time.monotonic()  # one clock for all processes (Linux: CLOCK_MONOTONIC)
        time.sleep(every_s)


def serve_engine(conns: multiprocessing.connection.Connection | Sequence[multiprocessing.connection.Connection],
                 spec: EngineSpec, heartbeat: Any = None) -> None:
    """The child's main: beat the heartbeat, build the seam on its device, then answer its clients
    until the first one (the server that started it) sends `Close` or is gone. Several clients are
    the server's front ends (`ServerConfig.front_ends`): one engine step serves every client whose
    `Step` is waiting, so their drafts share the batch."""
    conns = [conns] if isinstance(conns, multiprocessing.connection.Connection) else list(conns)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C stops the server, which closes us
    if heartbeat is not None:
        threading.Thread(target=_beat, args=(heartbeat, spec.heartbeat_s / 2), name="engine-heartbeat",
                         daemon=True).start()
    if spec.cuda_device is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = spec.cuda_device
    try:
        seam = spec.factory(spec.route, spec.heads)
        engine = as_batch_seam(seam)
        counting = token_counting(seam)
        ready = Ready(name=getattr(seam, "name", "seam"), max_batch=getattr(engine, "max_batch", 1),
                      pid=os.getpid(), counts=counting is not None, positions=seam_positions(seam),
                      template_tokens=counting.template_tokens if counting else None,
                      preparer=getattr(seam, "preparer", None) if hasattr(engine, "prepare") else None)
        try:
            pickle.dumps(ready)
        except (pickle.PicklingError, AttributeError, TypeError):  # a preparer that cannot travel
            ready = dataclasses.replace(ready, preparer=None)  # the child prepares, as before
        for conn in conns:
            conn.send(ready)
        freeze_startup_heap()  # the engine's startup objects: no full collection walks them again
        pauses = process_pauses()
    except BaseException as e:  # noqa: BLE001 - reported to the server, which raises it
        for conn in conns:
            conn.send(Failed(portable_error(e)))
        return

    profiler = StepProfiler()
    kernels = KernelWindow(seam)
    # A draft is named by (client, the client's handle) here, and by the seam's handle in the seam.
    to_seam: dict[tuple[int, int], Hashable] = {}
    to_client: dict[Hashable, tuple[int, int]] = {}
    running = [0] * len(conns)  # drafts each client has in the engine
    finished_for: list[list[tuple[int, Any]]] = [[] for _ in conns]  # kept until the client's next Step
    pending: list[collections.deque] = [collections.deque() for _ in conns]  # read, not yet answered
    open_clients = dict(enumerate(conns))
    # The steps' submits and aborts, summed: the child's step outside the seam's own parts, sent with
    # them as `submit` (a seam without parts gets none).
    work_s = 0.0
    totals = ChildTotals()

    def take_work(client: int, work: Sequence[Submit | Abort]) -> None:
        for item in work:
            if isinstance(item, Abort):
                handle = to_seam.pop((client, item.handle), None)
                if handle is not None:  # else it finished first
                    del to_client[handle]
                    running[client] -= 1
                    engine.abort(handle)
                continue
            try:
                handle = (engine.submit(item.request) if item.prepared is None
                          else engine.submit(item.request, item.prepared))
            except Exception as e:  # noqa: BLE001 - a bad request fails alone
                finished_for[client].append((item.handle, portable_error(e)))
                continue
            to_seam[client, item.handle], to_client[handle] = handle, (client, item.handle)
            running[client] += 1

    def step(steps: dict[int, Step]) -> dict[int, Stepped]:
        """Take every waiting `Step`'s work, step the engine once, answer each of those clients."""
        nonlocal totals, work_s
        started, cpu = time.perf_counter(), time.thread_time()
        overhead = kernels.overhead_s
        for client, message in steps.items():
            take_work(client, message.work)
        work_s += time.perf_counter() - started
        batch = sum(running)  # every client's drafts: the engine's whole batch
        ran = engine.has_unfinished()
        if ran:
            for handle, draft in kernels.step(engine.step):
                owner = to_client.pop(handle, None)
                if owner is not None:
                    del to_seam[owner]
                    running[owner[0]] -= 1
                    finished_for[owner[0]].append((owner[1], draft))
        phases = getattr(seam, "step_phases_s", None)
        # a kernel window's profiler started or written out in this step is no part of the step
        stall_wall, stall_cpu = (after - before for after, before in zip(kernels.overhead_s, overhead))
        wall, cpu = time.perf_counter() - started - stall_wall, time.thread_time() - cpu - stall_cpu
        totals = ChildTotals(totals.steps + ran, totals.drafts + batch * ran, totals.wall_s + wall, totals.cpu_s + cpu)
        replies = {}
        for client in steps:
            finished, finished_for[client] = finished_for[client], []
            replies[client] = Stepped(finished, running[client] > 0, totals,
                                      dict(phases, submit=work_s) if phases is not None else None, pauses.pause_s)
        return replies

    def answer(message: Any) -> Any:
        if isinstance(message, Count):
            if counting is None:
                raise TypeError(f"seam {getattr(seam, 'name', '?')} cannot count tokens")
            return Counted(counting.prompt(message.request) if message.request else counting.text(message.text))
        if isinstance(message, Ping):
            return Pong()
        if isinstance(message, Describe):
            describe = getattr(seam, "describe", None)
            return Described(describe() if callable(describe) else None)
        if isinstance(message, Profile):
            return profiler.toggle(message.path)
        if isinstance(message, KernelProfile):
            return kernels.arm(message.path, message.steps)
        if isinstance(message, Totals):
            totals = getattr(seam, "acceptance_totals", None)
            return Totalled(totals() if callable(totals) else None)
        raise TypeError(f"engine process: unexpected message {type(message).__name__}")

    def send(client: int, reply: Any) -> None:
        conn = open_clients.get(client)
        if conn is None:
            return
        try:
            conn.send(reply)  # pickled whole before a byte is sent
        except (pickle.PicklingError, AttributeError, TypeError) as e:
            conn.send(Failed(RuntimeError(f"engine process: its reply cannot be sent: {e}")))
        except OSError:  # that client is gone; the end of its pipe says so at the next read
            pass

    def drop(client: int) -> None:
        """A front end that closed or is gone: its drafts leave the engine."""
        open_clients.pop(client).close()
        pending[client].clear()
        take_work(client, [Abort(handle) for c, handle in list(to_seam) if c == client])
        finished_for[client].clear()

    try:
        while True:
            # Read what has come (waiting only when nothing read is unanswered), one message per client.
            idle = not any(pending)
            for conn in multiprocessing.connection.wait(list(open_clients.values()), None if idle else 0):
                client = conns.index(conn)
                try:
                    message = conn.recv()
                except EOFError:  # that client is gone; without the first one, so is the server
                    if client == 0:
                        return
                    drop(client)
                    continue
                pending[client].append(message)
            # Answer, in each client's order: what comes before its next Step, then one engine step
            # for every client whose Step is next.
            steps: dict[int, Step] = {}
            for client, queue in enumerate(pending):
                while queue and not isinstance(queue[0], Step):
                    message = queue.popleft()
                    if isinstance(message, Close):
                        if client == 0:  # the server: the engine closes
                            raise _Closing
                        send(client, Closed())  # a front end leaving; the engine goes on
                        drop(client)
                        break
                    try:
                        reply = answer(message)
                    except Exception as e:  # noqa: BLE001 - the server raises it where it asked
                        reply = Failed(portable_error(e))
                    send(client, reply)
                if queue:
                    steps[client] = queue.popleft()
            if steps:
                try:
                    replies = step(steps)
                except Exception as e:  # noqa: BLE001 - the server raises it where it asked
                    replies = dict.fromkeys(steps, Failed(portable_error(e)))
                for client, reply in replies.items():
                    send(client, reply)
    except _Closing:
        pass
    finally:
        engine.close()
    conns[0].send(Closed())


class _Closing(Exception):
    """The server's `Close`: out of the child's loop, the seam closed, `Closed` sent."""
