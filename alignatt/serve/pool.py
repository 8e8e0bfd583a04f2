"""Engines: a loaded seam per (model, seam, device, dtype, options), each driven by one draft scheduler.

One model serves every session of its routes. An engine's drafts are batched by its
`DraftScheduler` (alignatt.serve.scheduler) on the engine's own thread, off the server's event
loop; session updates that wait for a draft wait on the engine's `executor`, one thread each.
Directions that share a model share its engine: it captures the union of their heads once, and
each session sees only its direction's rows (`HeadRows`).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any, Hashable, Sequence

from alignatt.core.draft import Draft, DraftRequest, Head, Seam
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

    def open_view(self, key: Hashable, heads: list[Head]) -> "HeadRows":
        """Admit a session that drafts with `heads` (a subset of the engine's): its seam view."""
        return HeadRows(self.open_session(key), self.heads, heads)

    def draft_together(self, keyed: Sequence[tuple[Hashable, DraftRequest]], final: bool) -> list[Draft]:
        """Several sessions' drafts queued at once, so the scheduler runs them in one batch."""
        futures = [self.scheduler.submit(key, request, final=final) for key, request in keyed]
        return [f.result(600.0) for f in futures]

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


class HeadRows:
    """One direction's seam on a shared engine: the engine drafts with the union of every route's
    heads; this view keeps its own heads' rows (and masses), in its own order.

    `prefetched` holds drafts already made for it in a batch (`MultiTargetSession`): a request
    equal to one of them is answered from there instead of the engine."""

    def __init__(self, seam: Seam, engine_heads: list[Head], heads: list[Head]) -> None:
        missing = [h for h in heads if h not in engine_heads]
        if missing:
            raise ValueError(f"heads {missing} are not captured by this engine")
        self.seam = seam
        self.heads = list(heads)
        self.index = [engine_heads.index(h) for h in heads]
        self._n_engine = len(engine_heads)
        self.prefetched: list[tuple[DraftRequest, Draft]] = []

    @property
    def name(self) -> str:
        return getattr(self.seam, "name", "seam")

    def select(self, draft: Draft) -> Draft:
        idx = self.index

        def pick(a):
            return a if a is None or len(a) != self._n_engine else a[idx]

        tokens = [replace(t, rows=pick(t.rows), other_prompt_mass=pick(t.other_prompt_mass),
                          generated_mass=pick(t.generated_mass), context_mass=pick(t.context_mass),
                          history_mass=pick(t.history_mass)) for t in draft.tokens]
        return replace(draft, heads=list(self.heads) if draft.heads else [], tokens=tokens)

    def draft(self, request: DraftRequest) -> Draft:
        for i, (r, d) in enumerate(self.prefetched):
            if r == request:
                del self.prefetched[i]
                return d
        return self.select(self.seam.draft(request))

    def close(self) -> None:
        self.seam.close()


def route_key(route: DirectionRoute) -> tuple:
    """Routes with equal keys share one engine (their heads are captured together)."""
    return (route.model, route.seam, route.device, route.dtype,
            json.dumps(route.seam_options, sort_keys=True, default=str))


class EngineRegistry:
    """Engines by (model, seam, device, dtype, options): directions of one model share one, whose
    heads are the union of the heads of every route in `routes` with that key."""

    def __init__(self, factory: SeamFactory, scheduler: SchedulerConfig | None = None,
                 routes: dict[str, DirectionRoute] | None = None) -> None:
        self.factory = factory
        self.scheduler = scheduler
        self.routes = dict(routes or {})
        self._engines: dict[tuple, Engine] = {}
        self._lock = threading.Lock()

    def union_heads(self, route: DirectionRoute, direction: str) -> list[Head]:
        """Every same-engine route's heads, directions in sorted order, each head once."""
        heads: list[Head] = []
        for d, r in sorted({**self.routes, direction: route}.items()):
            if route_key(r) == route_key(route):
                heads += [h for h in resolve_heads(r, d) if h not in heads]
        return heads

    def get(self, route: DirectionRoute, direction: str) -> Engine:
        key = route_key(route)
        with self._lock:  # loads are rare and slow; one at a time
            engine = self._engines.get(key)
            if engine is None:
                heads = self.union_heads(route, direction)
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
