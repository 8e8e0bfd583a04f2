"""`alignatt eval --engines N`: a variant's streams replayed by N processes at once, each with an engine.

One process replaying every stream is bound by its own host work: building and tokenising prompts and
running the policy take about 0.9 ms an update under one interpreter lock, so on the H200 (69972d8)
128 streams on four engine processes kept a batch mean of 18.6 of 32. With N engines, each of N replay
processes (spawned: CUDA does not survive a fork) takes every N-th job of the variant's longest-first
order (`jobs.ordered`), and replays it, a share of the streams at once, through a draft scheduler over
an engine process of its own (`ProcessBatchSeam`, built from `engines.engine_specs`: its share of the
GPU's memory). Each sends back its outputs and batch sizes; the rows are built by the caller.
Progress comes back as streams end. The first failing stream stops every shard from starting
another, and its error is raised here once every shard has ended.
"""

from __future__ import annotations

import collections
import multiprocessing
import threading
from multiprocessing.connection import wait
from typing import Callable, Sequence

from alignatt.core.errors import AlignattError
from alignatt.evaluate.emissions import StreamOutput
from alignatt.evaluate.jobs import Job, Replayer
from alignatt.evaluate.shared_engine import ConcurrentStreams
from alignatt.serve.engine_client import ProcessBatchSeam
from alignatt.serve.engine_process import EngineSpec, portable_error


class Replayed:
    """What the shards sent back: outputs by job index, and per engine its batch sizes."""

    def __init__(self, count: int) -> None:
        self.outputs: dict[int, StreamOutput] = {}
        self.batch_sizes: list[collections.Counter] = [collections.Counter() for _ in range(count)]
        self.engine_limit = 1


def shares(total: int, count: int) -> list[int]:
    """`total` streams at once dealt over `count` shards (the first ones take the remainder)."""
    return [total // count + (i < total % count) for i in range(count)]


def replay_in_shards(specs: Sequence[EngineSpec], jobs: Sequence[Job], order: Sequence[int], replayer: Replayer,
                     concurrency: int, tick: Callable[[int], None]) -> Replayed:
    """Every job replayed, shard i taking `order[i::len(specs)]` through an engine built from specs[i];
    `tick(words)` as each job ends."""
    count = len(specs)
    context = multiprocessing.get_context("spawn")
    stop = context.Event()
    dealt = [list(order[i::count]) for i in range(count)]
    got, errors = Replayed(count), []
    processes, pending = [], {}
    try:
        for i, (spec, at_once) in enumerate(zip(specs, shares(concurrency, count))):
            receive, send = context.Pipe(duplex=False)
            process = context.Process(target=_shard_main, name=f"alignatt-eval-shard-{i}",
                                      args=(send, spec, i, [jobs[j] for j in dealt[i]], replayer, at_once, stop))
            process.start()
            send.close()  # the child holds the only sending end: its exit ends our recv
            processes.append(process)
            pending[receive] = i
        while pending:
            for conn in wait(list(pending)):
                i = pending[conn]
                try:
                    kind, *body = conn.recv()
                except EOFError:
                    kind, body = "failed", [AlignattError(f"eval shard {i} ended without its outputs")]
                if kind == "tick":
                    tick(body[0])
                    continue
                del pending[conn]
                if kind == "done":
                    outputs, got.batch_sizes[i], got.engine_limit = body
                    got.outputs.update(zip(dealt[i], outputs))
                else:
                    errors.append(body[0])
                    stop.set()
    finally:
        if pending:  # left early (this process was interrupted): stop the shards, read them out to their end
            stop.set()
            _drain(pending)
        for process in processes:
            process.join()
    if errors:  # the failure itself, not a shard that stopped because of it
        raise next((e for e in errors if not str(e).startswith("stopped after")), errors[0])
    return got


def _drain(pending: dict) -> None:
    """Read every pending shard's messages until it closes its end: a shard blocked on a full pipe
    would never exit, and joining it would wait forever."""
    while pending:
        for conn in wait(list(pending)):
            try:
                conn.recv()
            except EOFError:
                del pending[conn]


def _shard_main(conn, spec: EngineSpec, index: int, jobs: list[Job], replayer: Replayer, concurrency: int,
                stop) -> None:
    """A shard's process: its engine, its streams through a draft scheduler, its outputs sent back."""
    lock = threading.Lock()  # the streams' threads share the pipe

    def send(message: tuple) -> None:
        with lock:
            conn.send(message)

    def replay(seam, job: Job) -> StreamOutput:
        out = replayer(seam, job)
        send(("tick", job.words))
        return out

    try:
        seam = ProcessBatchSeam(spec, f"eval-{index}")
        try:
            streams = ConcurrentStreams(seam, concurrency, name=f"eval-{index}")
            try:
                outputs = streams.map(replay, jobs, [job.name for job in jobs], stop=stop)
                sizes, limit = streams.batch_sizes(), streams.scheduler.max_batch
            finally:
                streams.close()
        finally:
            seam.close()
        send(("done", outputs, sizes, limit))
    except BaseException as e:  # noqa: BLE001 - sent to the eval's process, which raises it
        stop.set()
        send(("failed", portable_error(e)))
    finally:
        conn.close()
