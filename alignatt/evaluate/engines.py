"""`alignatt eval --engines N`: which engines a variant's streams draft through, and what is recorded.

At N, N replay processes each drive an engine process of their own (`shards`); the engines share
the device, pinned as `replica_devices` deals them, each asking vLLM for its share of the GPU's
memory, as `alignatt serve --engines N` does. At 1 the engine runs where `alignatt serve` runs its
one engine (`own_processes`): in a process of its own for vLLM on CUDA, else in the eval's process.
"""

from __future__ import annotations

from typing import Sequence

from alignatt.core.draft import Head
from alignatt.serve.config import DirectionRoute, SeamFactory, served_own_process
from alignatt.serve.engine_devices import replica_devices
from alignatt.serve.engine_process import EngineSpec
from alignatt.serve.pool import shared_gpu_route


def check_engines(engines: int, concurrency: int, drivers: Sequence[str]) -> int:
    """`EvalOptions.engines`: several engines only spread in-process streams that run at once."""
    if engines == 1:
        return engines
    if concurrency < engines:
        raise ValueError(f"{engines} engines need concurrency >= {engines} (streams at once to spread over them), "
                         f"not {concurrency}")
    if list(drivers) != ["inprocess"]:
        raise ValueError(f"{engines} engines run the inprocess driver only, not {', '.join(drivers)}")
    return engines


def own_processes(engines: int, route: DirectionRoute, drivers: Sequence[str]) -> bool:
    """Whether the variant's streams replay through engine processes (`shards`): always at N > 1;
    at 1 where `alignatt serve` gives its one engine a process of its own, unless a protocol driver
    replays too (its server borrows the seam in the eval's process)."""
    return engines > 1 or (served_own_process(route.seam, route.device) and list(drivers) == ["inprocess"])


def engine_specs(factory: SeamFactory, route: DirectionRoute, heads: list[Head], count: int) -> list[EngineSpec]:
    """What each of `count` engine processes builds: all may share one GPU (cuda route), or run
    unpinned (cpu route). Raises AlignattError for a device that cannot be dealt (cuda:0)."""
    devices = replica_devices(route, count, per_gpu=count)
    return [EngineSpec(factory, shared_gpu_route(route, devices.count(d) if d is not None else 1), heads, d)
            for d in devices]


def config_notes(engines: int, own: bool) -> dict[str, str]:
    """The artifact config's note on the engines (none for one engine in the eval's process)."""
    if not own:
        return {}
    if engines == 1:
        return {"engine_processes": "one replay process driving the variant's engine in a process of its own, as "
                                    "`alignatt serve` runs it, through one draft scheduler; the under-load rows run "
                                    "after them, on one fresh engine process alone"}
    return {"engine_processes": f"{engines} replay processes, each with an engine process of the variant's seam "
                                "(sharing its device; vllm_capture on a GPU: each asks for its share of the "
                                "memory) and a draft scheduler over it; in the variant's longest-first order, "
                                f"stream i replays in process i mod {engines}, with its share of the streams at "
                                "once; the under-load rows run after them, on one fresh engine process alone"}
