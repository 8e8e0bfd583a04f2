"""Engines: a loaded seam per (model, seam, heads, options), each with its one worker thread.

One model serves every session of its routes, so all of an engine's drafts run one at a time on
its own thread, off the server's event loop.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from alignatt.core.draft import Head, Seam
from alignatt.serve.config import DirectionRoute, SeamFactory, resolve_heads

log = logging.getLogger("alignatt.serve.server")


class Engine:
    """A loaded seam and the one worker thread that runs all of its drafts.

    The seam is also built on that thread, so whatever the engine binds to its creating thread
    (CUDA graphs, vLLM's engine client) is used from the same thread afterwards.
    """

    def __init__(self, name: str, route: DirectionRoute, heads: list[Head], factory: SeamFactory) -> None:
        self.name = name
        self.route = route
        self.heads = heads
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"engine-{name}")
        try:
            self.seam: Seam = self.executor.submit(factory, route, heads).result()
        except BaseException:
            self.executor.shutdown(wait=False)
            raise

    def close(self) -> None:
        """Close the seam on its own thread (where it was built), then stop that thread."""
        try:
            self.executor.submit(self.seam.close).result(timeout=120)
        except Exception as e:  # noqa: BLE001 - shutdown goes on; the failure is logged
            log.warning("engine %s: closing its seam failed: %s", self.name, e)
        self.executor.shutdown(wait=False, cancel_futures=True)


class EngineRegistry:
    """Engines by (model, seam, device, dtype, heads): directions with equal routes share one."""

    def __init__(self, factory: SeamFactory) -> None:
        self.factory = factory
        self._engines: dict[tuple, Engine] = {}
        self._lock = threading.Lock()

    def get(self, route: DirectionRoute, direction: str) -> Engine:
        heads = resolve_heads(route, direction)
        key = (route.model, route.seam, route.device, route.dtype, tuple(heads),
               json.dumps(route.seam_options, sort_keys=True, default=str))
        with self._lock:  # loads are rare and slow; one at a time
            engine = self._engines.get(key)
            if engine is None:
                started = time.perf_counter()
                engine = Engine(f"{len(self._engines)}", route, heads, self.factory)
                self._engines[key] = engine
                log.info("engine %s: %s/%s heads=%s loaded in %.1fs", engine.name, route.model,
                         route.seam, [(h.layer, h.head) for h in heads], time.perf_counter() - started)
            return engine

    @property
    def engines(self) -> list[Engine]:
        return list(self._engines.values())

    def close(self) -> None:
        with self._lock:
            engines, self._engines = list(self._engines.values()), {}
        for e in engines:
            e.close()
