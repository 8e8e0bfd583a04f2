"""Engines: a loaded seam per (model, seam, heads, options), each driven by one draft scheduler.

One model serves every session of its routes. An engine's drafts are batched by its
`DraftScheduler` (alignatt.serve.scheduler) on the engine's own thread, off the server's event
loop; session updates that wait for a draft wait on the engine's `executor`, one thread each.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Hashable

from alignatt.core.draft import Head, Seam
from alignatt.serve.config import DirectionRoute, SeamFactory, resolve_heads
from alignatt.serve.scheduler import DraftScheduler, SchedulerConfig, SessionSeam

log = logging.getLogger("alignatt.serve.server")

# What a served vLLM engine gets unless the route says otherwise: a growing utterance re-drafts a
# prompt whose prefix is already cached, and the batch holds every admitted session.
SERVED_VLLM_OPTIONS = {"enable_prefix_caching": True, "max_num_seqs": 128}


def served_route(route: DirectionRoute) -> DirectionRoute:
    """The route as the server builds it (prefix caching and a large batch for vllm_capture)."""
    if route.seam != "vllm_capture":
        return route
    return route.model_copy(update={"seam_options": {**SERVED_VLLM_OPTIONS, **route.seam_options}})


class Engine:
    """A loaded seam, its scheduler, and the threads that wait for its drafts.

    The seam is built, driven and closed on the scheduler's thread, so whatever the engine binds
    to its creating thread (CUDA graphs, vLLM's engine client) is only used there.
    """

    def __init__(self, name: str, route: DirectionRoute, heads: list[Head], factory: SeamFactory,
                 scheduler: SchedulerConfig | None = None) -> None:
        self.name = name
        self.route = route
        self.heads = heads
        config = scheduler or SchedulerConfig()
        self.scheduler = DraftScheduler(lambda: factory(served_route(route), heads), config, name=name)
        self.seam: Seam = self.scheduler.seam
        # One waiting thread per admitted session: a session's update blocks only its own thread.
        self.executor = ThreadPoolExecutor(max_workers=config.capacity, thread_name_prefix=f"engine-{name}-wait")
        self._proxies: dict[Hashable, SessionSeam] = {}

    # ---- sessions (the server's side) ----

    def open_session(self, key: Hashable) -> SessionSeam:
        """Admit a session (`SchedulerBusy` past capacity); the seam its `Session` drafts through."""
        self.scheduler.open_session(key)
        proxy = SessionSeam(self.scheduler, key)
        self._proxies[key] = proxy
        return proxy

    def close_session(self, key: Hashable) -> None:
        self._proxies.pop(key, None)
        self.scheduler.close_session(key)

    def supersede(self, key: Hashable) -> None:
        """A newer update of the session arrived: its queued or running partial is stale."""
        self.scheduler.supersede(key)

    def update(self, key: Hashable, session: Any, words: list[str], tail: list[str], is_final: bool,
               utterance_id: int | None) -> Any:
        """`session.update` with its draft queued as a final or a partial (runs on `executor`)."""
        proxy = self._proxies.get(key)
        if proxy is not None:
            proxy.final = bool(is_final)
        return session.update(words, tail, is_final, utterance_id)

    def stats(self) -> dict:
        return {"engine": self.name, "seam": getattr(self.seam, "name", "?"), "max_batch": self.scheduler.max_batch,
                **self.scheduler.stats.as_dict()}

    def close(self) -> None:
        """Stop the scheduler (it closes the seam on its own thread), then the waiting threads."""
        try:
            self.scheduler.close()
        except Exception as e:  # noqa: BLE001 - shutdown goes on; the failure is logged
            log.warning("engine %s: closing its scheduler failed: %s", self.name, e)
        self.executor.shutdown(wait=False, cancel_futures=True)


class EngineRegistry:
    """Engines by (model, seam, device, dtype, heads): directions with equal routes share one."""

    def __init__(self, factory: SeamFactory, scheduler: SchedulerConfig | None = None) -> None:
        self.factory = factory
        self.scheduler = scheduler
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
                engine = Engine(f"{len(self._engines)}", route, heads, self.factory, self.scheduler)
                self._engines[key] = engine
                log.info("engine %s: %s/%s heads=%s loaded in %.1fs (batch %d)", engine.name, route.model,
                         route.seam, [(h.layer, h.head) for h in heads], time.perf_counter() - started,
                         engine.scheduler.max_batch)
            return engine

    @property
    def engines(self) -> list[Engine]:
        return list(self._engines.values())

    def close(self) -> None:
        with self._lock:
            engines, self._engines = list(self._engines.values()), {}
        for e in engines:
            e.close()
