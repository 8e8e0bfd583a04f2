"""Engines: a loaded seam per (model, seam, device, dtype, options), each with its one worker thread.

One model serves every session of its routes, so all of an engine's drafts run one at a time on
its own thread, off the server's event loop. Directions that share a model share its engine: the
engine captures the union of their heads once, and each session sees only its direction's rows
(`HeadRows`).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Sequence

from alignatt.core.draft import Draft, DraftRequest, Head, Seam
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

    def view(self, heads: list[Head]) -> "HeadRows":
        """A seam for one direction: drafts on this engine, rows of `heads` only."""
        return HeadRows(self.seam, self.heads, heads)

    def draft_many(self, requests: Sequence[DraftRequest]) -> list[Draft]:
        """Several drafts in one engine batch where the seam batches (vLLM), else one by one."""
        batch = getattr(self.seam, "draft_many", None)
        return list(batch(requests)) if batch is not None else [self.seam.draft(r) for r in requests]

    def close(self) -> None:
        """Close the seam on its own thread (where it was built), then stop that thread."""
        try:
            self.executor.submit(self.seam.close).result(timeout=120)
        except Exception as e:  # noqa: BLE001 - shutdown goes on; the failure is logged
            log.warning("engine %s: closing its seam failed: %s", self.name, e)
        self.executor.shutdown(wait=False, cancel_futures=True)


class HeadRows:
    """One direction's seam on a shared engine: the engine drafts with the union of every route's
    heads; this view keeps its own heads' rows (and masses), in its own order."""

    def __init__(self, seam: Seam, engine_heads: list[Head], heads: list[Head]) -> None:
        missing = [h for h in heads if h not in engine_heads]
        if missing:
            raise ValueError(f"heads {missing} are not captured by this engine")
        self.seam = seam
        self.heads = list(heads)
        self.index = [engine_heads.index(h) for h in heads]
        self._n_engine = len(engine_heads)
        self.prefetched: list[tuple[DraftRequest, Draft]] = []  # drafts made in a batch, not yet taken

    @property
    def name(self) -> str:
        return self.seam.name

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
        """Nothing to release: the engine owns (and closes) the seam."""


def route_key(route: DirectionRoute) -> tuple:
    """Routes with equal keys share one engine (their heads are captured together)."""
    return (route.model, route.seam, route.device, route.dtype,
            json.dumps(route.seam_options, sort_keys=True, default=str))


class EngineRegistry:
    """Engines by (model, seam, device, dtype, options): directions of one model share one, whose
    heads are the union of the heads of every route in `routes` with that key."""

    def __init__(self, factory: SeamFactory, routes: dict[str, DirectionRoute] | None = None) -> None:
        self.factory = factory
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
