"""The load benchmark's speakers, in client processes of their own.

A real deployment's clients are other machines. Run as threads of the server's own process, 64
speakers' JSON and WebSocket work would share the server's interpreter lock with the engine's
step loop, and the RTT figures would measure that contention instead of the server. So the
speakers run in `spawn`ed processes, `speakers_per_process` threads each; every process imports
and connects nothing until all are ready, then all start from one shared instant, speaker i
`i * stagger_s` after it (the same staggering as in one process).
"""

from __future__ import annotations

import math
import multiprocessing as mp
import queue as queue_mod
import threading
import time
from dataclasses import dataclass
from typing import Any, Literal

from alignatt.core.errors import AlignattError
from alignatt.replay.events import RunRecord
from alignatt.replay.stream import SmokeStream

READY_TIMEOUT_S = 120.0  # a spawned process imports websockets and pydantic; a loaded CPU is slow


@dataclass(frozen=True)
class SpeakerPlan:
    """What every speaker of a level does (picklable: it crosses into the client processes)."""

    url: str
    preset: str
    speed: float
    stagger_s: float
    pacing: Literal["lockstep", "realtime"]
    streams: tuple[dict, ...]  # SmokeStream.model_dump() of each stream
    stop_lag_s: float | None = None  # a speaker this far behind its stream stops (LoadKnobs.stop_lag_s)


def _replay_one(plan: SpeakerPlan, stream: SmokeStream) -> RunRecord:
    if plan.pacing == "realtime":
        from alignatt.replay.realtime import replay_realtime

        return replay_realtime(plan.url, stream, plan.speed, plan.preset, stop_lag_s=plan.stop_lag_s)
    from alignatt.replay.lockstep import replay_native

    return replay_native(plan.url, stream, plan.speed, plan.preset, stop_lag_s=plan.stop_lag_s)


def run_speaker_threads(plan: SpeakerPlan, indices: list[int], start_at: float | None = None
                        ) -> dict[int, RunRecord | BaseException]:
    """Speakers `indices` as threads of this process; speaker i starts `i * stagger_s` after
    `start_at` (a `time.time()` instant shared across processes; None: now)."""
    streams = [SmokeStream.model_validate(s) for s in plan.streams]
    base = time.time() if start_at is None else start_at
    results: dict[int, RunRecord | BaseException] = {i: RuntimeError("did not run") for i in indices}

    def speaker(i: int) -> None:
        time.sleep(max(base + i * plan.stagger_s - time.time(), 0.0))
        try:
            results[i] = _replay_one(plan, streams[i % len(streams)])
        except BaseException as e:  # noqa: BLE001 - reported in the level as errors
            results[i] = e

    threads = [threading.Thread(target=speaker, args=(i,), name=f"speaker-{i}", daemon=True) for i in indices]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def _client_process(plan: SpeakerPlan, indices: list[int], ready: Any, start: Any, start_at: Any,
                    results: Any) -> None:
    """One client process: say it is ready, wait for the shared start, replay, send the records."""
    import alignatt.replay.lockstep  # noqa: F401 - the imports are paid before the start
    import alignatt.replay.realtime  # noqa: F401
    import websockets.sync.client  # noqa: F401

    ready.put(indices[0])
    start.wait()
    got = run_speaker_threads(plan, indices, start_at.value)
    # An exception may not pickle (its arguments); its text is what the level reports.
    results.put({i: (r if isinstance(r, RunRecord) else RuntimeError(f"{type(r).__name__}: {r}"))
                 for i, r in got.items()})


def process_groups(n: int, per_process: int) -> list[list[int]]:
    """Speakers 0..n-1 dealt round-robin over ceil(n / per_process) processes, so each process's
    speakers start spread over the whole stagger rather than in one burst."""
    k = max(math.ceil(n / per_process), 1)
    return [list(range(g, n, k)) for g in range(k) if g < n]


def run_speakers(plan: SpeakerPlan, n: int, clients: Literal["processes", "threads"] = "processes",
                 per_process: int = 16, timeout_s: float = 3600.0) -> tuple[list[RunRecord | BaseException], float]:
    """Every speaker's record (or its error), in speaker order, and the level's wall time."""
    if clients == "threads":
        started = time.perf_counter()
        got = run_speaker_threads(plan, list(range(n)))
        return [got[i] for i in range(n)], time.perf_counter() - started
    ctx = mp.get_context("spawn")
    ready, results = ctx.Queue(), ctx.Queue()
    start, start_at = ctx.Event(), ctx.Value("d", 0.0)
    groups = process_groups(n, per_process)
    procs = [ctx.Process(target=_client_process, args=(plan, g, ready, start, start_at, results),
                         name=f"load-clients-{j}", daemon=True) for j, g in enumerate(groups)]
    for p in procs:
        p.start()
    collected: dict[int, RunRecord | BaseException] = {}
    try:
        for _ in procs:
            try:
                ready.get(timeout=READY_TIMEOUT_S)
            except queue_mod.Empty:
                raise AlignattError(f"load clients: a client process was not ready within {READY_TIMEOUT_S:.0f}s") from None
        start_at.value = time.time() + 0.2
        start.set()
        started = time.perf_counter()
        deadline = time.monotonic() + timeout_s
        while len(collected) < n:
            try:
                collected.update(results.get(timeout=1.0))
            except queue_mod.Empty:
                if time.monotonic() > deadline:
                    raise AlignattError(f"load clients: the level did not finish within {timeout_s:.0f}s") from None
                dead = [p for p in procs if p.exitcode not in (None, 0)]
                if dead and results.empty():
                    raise AlignattError(f"load clients: process {dead[0].name} exited with code {dead[0].exitcode}")
        wall = time.perf_counter() - started
    finally:
        for p in procs:
            p.join(5.0)
            if p.is_alive():
                p.kill()
    return [collected[i] for i in range(n)], wall
