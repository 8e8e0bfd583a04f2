"""`alignatt eval --engines N`: a variant's in-process streams drafting through N engine processes.

On a GPU the eval is bound by one engine thread's host work (vLLM's step, the capture's fetch,
prompt building) and by the GIL that thread shares with the streams' threads. As
`alignatt serve --engines N` does, N engines then share the device, each in a process of its own
(`alignatt.serve.engine_client.ProcessBatchSeam`, pinned as `replica_devices` deals them, each asking
vLLM for its share of the GPU's memory) and each drafting through a `DraftScheduler` of its own in
this process (`shared_engine.ConcurrentStreams`). At 1 the seam is built in this process, as always.
"""

from __future__ import annotations

from functools import partial
from typing import Sequence

from alignatt.core.draft import Head, Seam
from alignatt.serve.config import DirectionRoute, SeamFactory
from alignatt.serve.pool import shared_gpu_route
from alignatt.serve.engine_process import EngineSpec
from alignatt.serve.engine_client import ProcessBatchSeam
from alignatt.serve.engine_devices import close_together, replica_devices, start_together


def check_engines(engines: int, concurrency: int, drivers: Sequence[str]) -> int:
    """`EvalOptions.engines`: several engines only spread in-process streams that run at once."""
    if engines == 1:
        return engines
    if concurrency < 2:
        raise ValueError(f"{engines} engines need concurrency > 1 (streams at once to spread over them), "
                         f"not {concurrency}")
    if list(drivers) != ["inprocess"]:
        raise ValueError(f"{engines} engines run the inprocess driver only, not {', '.join(drivers)}")
    return engines


def engine_specs(factory: SeamFactory, route: DirectionRoute, heads: list[Head], count: int) -> list[EngineSpec]:
    """What each of `count` engine processes builds: all may share one GPU (cuda route), or run
    unpinned (cpu route). Raises AlignattError for a device that cannot be dealt (cuda:0)."""
    devices = replica_devices(route, count, per_gpu=count)
    return [EngineSpec(factory, shared_gpu_route(route, devices.count(d) if d is not None else 1), heads, d)
            for d in devices]


class VariantEngines:
    """A variant's loaded engines: its seam in this process, or one `ProcessBatchSeam` per engine."""

    def __init__(self, seams: list[Seam]) -> None:
        self.seams = seams

    def close(self) -> None:
        """Close every engine, all at once; the first failure is raised once every one was closed."""
        close_together(self.seams)


def load_engines(factory: SeamFactory, route: DirectionRoute, heads: list[Head], count: int) -> VariantEngines:
    """`count` engines of the route: 1 in this process, more in a process each, started at once.
    If one fails to start, the others are closed and its error raised."""
    if count == 1:
        return VariantEngines([factory(route, heads)])
    specs = engine_specs(factory, route, heads, count)
    return VariantEngines(start_together([partial(ProcessBatchSeam, spec, f"eval-{i}")
                                          for i, spec in enumerate(specs)]))


def config_notes(engines: int) -> dict[str, str]:
    """The artifact config's note on the engines (none at 1: the seam in the eval's process)."""
    if engines == 1:
        return {}
    return {"engine_processes": f"{engines} engine processes of the variant's seam share its device (vllm_capture "
                                "on a GPU: each asks for its share of the memory), each with a draft scheduler of "
                                f"its own; stream i of a row drafts through engine i mod {engines}; the under-load "
                                "rows run on engine 0 alone"}
