"""Where a route's engines run and how they come up together: the CUDA device each engine's process
is pinned to (`replica_devices`: one per GPU, or `ReplicaConfig.engines_per_gpu` sharing one), and
starting or closing them all at once, so each loads its model in parallel and a failed start leaves
no engine process behind. The engines themselves are `serve.pool.Engine`s (the server) or bare
`serve.engine_client.ProcessBatchSeam`s (the eval).
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Sequence, TypeVar

from alignatt.core.errors import AlignattError
from alignatt.serve.config import DirectionRoute, EngineCount


def visible_cuda_devices() -> list[str]:
    """The CUDA devices this process may use, as CUDA_VISIBLE_DEVICES names them."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [d.strip() for d in listed.split(",") if d.strip()]
    try:
        import torch

        return [str(i) for i in range(torch.cuda.device_count())]
    except Exception:  # noqa: BLE001 - no usable CUDA: no GPUs
        return []


def replica_devices(route: DirectionRoute, engines: EngineCount, per_gpu: int = 1) -> list[str | None]:
    """One entry per engine of `route`: the CUDA device its process is pinned to (None: CPU).

    `[None]` is one engine in the server's own process. "auto" is `per_gpu` engines per visible GPU for
    a `cuda` route (one engine when that makes one), one engine otherwise. Engines are dealt over
    the GPUs in turn, at most `per_gpu` on one."""
    if engines == "auto":
        visible = visible_cuda_devices() if route.device == "cuda" else []
        dealt = [d for _ in range(per_gpu) for d in visible]
        return dealt if len(dealt) > 1 else [None]
    if engines == 1 or not route.device.startswith("cuda"):
        return [None] * engines
    if route.device != "cuda":
        raise AlignattError(f"{engines} engines run one per GPU: the route's device must be 'cuda', "
                            f"not {route.device!r}")
    visible = visible_cuda_devices()
    if engines > len(visible) * per_gpu:
        raise AlignattError(f"{engines} engines asked for, but {len(visible)} CUDA GPUs are visible "
                            f"({per_gpu} engine{'s' if per_gpu > 1 else ''} per GPU)")
    return [visible[i % len(visible)] for i in range(engines)]


Started = TypeVar("Started")


def start_together(starts: Sequence[Callable[[], Started]]) -> list[Started]:
    """Run every start at once (each engine process loads its model in parallel). If one fails,
    close the ones that started and raise its error: no engine process outlives a failed start."""
    with ThreadPoolExecutor(max_workers=max(len(starts), 1)) as pool:
        futures = [pool.submit(start) for start in starts]
    errors = [f.exception() for f in futures if f.exception() is not None]
    if errors:
        for f in futures:
            if f.exception() is None:
                f.result().close()
        raise errors[0]
    return [f.result() for f in futures]


def close_together(engines: Sequence[Any]) -> None:
    """Close every engine at once (each waits for its seam, or its process, to stop); the first
    failure is raised once all of them were closed."""
    if len(engines) == 1:
        engines[0].close()
    elif engines:
        with ThreadPoolExecutor(max_workers=len(engines)) as pool:
            list(pool.map(lambda e: e.close(), engines))
