"""An engine in a process of its own: the child's side (what `alignatt.serve.engine_client` starts).

`serve_engine` is the child's main: it beats a heartbeat from a thread of its own, builds the
route's seam on its device, sends `Ready` (with the seam's preparer, so the server prepares
drafts), then answers one message at a time (`alignatt.serve.engine_messages`) until `Close` or
until the server's end of the pipe is gone. A `Step` carries the submits and aborts queued since
the last one; the child steps its engine once and answers with the drafts that finished. The
server's side, `ProcessBatchSeam`, is in `alignatt.serve.engine_client` (as vLLM splits its engine
core's loop from its client).
"""

from __future__ import annotations

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
from alignatt.serve.engine_messages import (Abort, Close, Closed, Count, Counted, Described, Describe, Failed,
                                            KernelProfile, Ping, Pong, Profile, Ready, Step, Stepped, Submit,
                                            Totalled, Totals)
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


def serve_engine(conn: multiprocessing.connection.Connection, spec: EngineSpec, heartbeat: Any = None) -> None:
    """The child's main: beat the heartbeat, build the seam on its device, then answer one request
    at a time until `Close` or until the server's end of the pipe is gone."""
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
            conn.send(ready)  # pickled whole before a byte is sent
        except (pickle.PicklingError, AttributeError, TypeError):  # a preparer that cannot travel
            conn.send(dataclasses.replace(ready, preparer=None))  # the child prepares, as before
        freeze_startup_heap()  # the engine's startup objects: no full collection walks them again
        pauses = process_pauses()
    except BaseException as e:  # noqa: BLE001 - reported to the server, which raises it
        conn.send(Failed(portable_error(e)))
        return

    profiler = StepProfiler()
    kernels = KernelWindow(seam)
    to_seam: dict[int, Hashable] = {}  # the server's handle -> the seam's, while the draft runs
    to_server: dict[Hashable, int] = {}
    # The step's submits and aborts, summed: the child's step outside the seam's own parts, sent with
    # them as `submit` (a seam without parts gets none).
    work_s = [0.0]

    def take_work(work: Sequence[Submit | Abort]) -> list[tuple[int, BaseException]]:
        refused = []
        for item in work:
            if isinstance(item, Abort):
                handle = to_seam.pop(item.handle, None)
                if handle is not None:  # else it finished first
                    del to_server[handle]
                    engine.abort(handle)
                continue
            try:
                handle = (engine.submit(item.request) if item.prepared is None
                          else engine.submit(item.request, item.prepared))
            except Exception as e:  # noqa: BLE001 - a bad request fails alone
                refused.append((item.handle, portable_error(e)))
                continue
            to_seam[item.handle], to_server[handle] = handle, item.handle
        return refused

    def answer(message: Any) -> Any:
        if isinstance(message, Step):
            started, cpu = time.perf_counter(), time.thread_time()
            overhead = kernels.overhead_s
            finished: list[tuple[int, Any]] = take_work(message.work)
            work_s[0] += time.perf_counter() - started
            if engine.has_unfinished():
                for handle, draft in kernels.step(engine.step):
                    if handle in to_server:
                        del to_seam[to_server[handle]]
                        finished.append((to_server.pop(handle), draft))
            phases = getattr(seam, "step_phases_s", None)
            # a kernel window's profiler started or written out in this step is no part of the step
            stall_wall, stall_cpu = (after - before for after, before in zip(kernels.overhead_s, overhead))
            return Stepped(finished, engine.has_unfinished(), time.perf_counter() - started - stall_wall,
                           time.thread_time() - cpu - stall_cpu,
                           dict(phases, submit=work_s[0]) if phases is not None else None, pauses.pause_s)
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

    try:
        while True:
            try:
                message = conn.recv()
            except EOFError:  # the server is gone
                return
            if isinstance(message, Close):
                break
            try:
                reply = answer(message)
            except Exception as e:  # noqa: BLE001 - the server raises it where it asked
                reply = Failed(portable_error(e))
            try:
                conn.send(reply)  # pickled whole before a byte is sent
            except (pickle.PicklingError, AttributeError, TypeError) as e:
                conn.send(Failed(RuntimeError(f"engine process: its reply cannot be sent: {e}")))
    finally:
        engine.close()
    conn.send(Closed())
