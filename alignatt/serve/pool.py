"""Engines: loaded seams per (model, seam, device, dtype, options), each driven by one draft scheduler.

One model serves every session of its routes. An engine's drafts are batched by its
`DraftScheduler` (alignatt.serve.scheduler) on the engine's own thread, off the server's event
loop; a connection awaits its draft's future (`Engine.submit`), no thread waits for it.
Directions that share a model share its engines: they capture the union of their heads once, and
each session sees only its direction's rows (`HeadRows`). A route served by several engines has
one process per engine (driven by `alignatt.serve.engine_client`, on the devices that
`alignatt.serve.engine_devices` deals); each new session is placed on the least loaded live one
and stays there. An engine in its own process is watched: one that exits is dead,
one that answers nothing within `ReplicaConfig.step_deadline_s` is hung (killed, then dead); either
way its sessions are told to reconnect and it gets no new ones.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from functools import partial
from typing import Callable, Hashable, Sequence

from alignatt.capture.names import VLLM_CAPTURE, gpu_memory_share
from alignatt.core.draft import Draft, DraftRequest, Head, Seam
from alignatt.serve.budget import PromptBudget
from alignatt.serve.config import SERVED_VLLM_OPTIONS, DirectionRoute, EngineCount, ReplicaConfig, SeamFactory, resolve_heads
from alignatt.serve.gc_pauses import process_pauses
from alignatt.serve.limits import DraftTooLarge
from alignatt.serve.engine_client import EngineHandoff, ProcessBatchSeam, draft_work
from alignatt.serve.engine_devices import close_together, replica_devices, start_together
from alignatt.serve.engine_process import EngineSpec
from alignatt.serve.scheduler import DraftScheduler, EngineDied, EngineHung, SchedulerConfig, SessionSeam
from alignatt.serve.session import SessionLimits

log = logging.getLogger("alignatt.serve.server")


# The share of a GPU's memory that vLLM's start-up check may ask for, split between the engines on it
# (vLLM refuses to start when less than gpu_memory_utilization x total is free); less where this process
# has only a part of the device (ALIGNATT_VLLM_GPU_MEMORY_SHARE: the GPU suite's lanes).
GPU_MEMORY_SHARED = 0.9


def shared_gpu_route(route: DirectionRoute, engines_on_gpu: int) -> DirectionRoute:
    """The route one of `engines_on_gpu` engines on one GPU builds: vllm_capture asks for its share
    of the memory this process may use, unless the route's engine options say how much."""
    if route.seam != VLLM_CAPTURE or engines_on_gpu <= 1:
        return route
    kwargs = dict(route.seam_options.get("engine_kwargs") or {})
    ours = gpu_memory_share() or GPU_MEMORY_SHARED
    kwargs.setdefault("gpu_memory_utilization", round(ours / engines_on_gpu, 3))
    return route.model_copy(update={"seam_options": {**route.seam_options, "engine_kwargs": kwargs}})


def served_route(route: DirectionRoute, engines_on_gpu: int = 1) -> DirectionRoute:
    """The route as the server builds it (vllm_capture: prefix caching, a large batch, fullgraph;
    with several engines on one GPU, each asks for its share of the memory unless the route says)."""
    if route.seam != VLLM_CAPTURE:
        return route
    served = route.model_copy(update={"seam_options": {**SERVED_VLLM_OPTIONS, **route.seam_options}})
    return shared_gpu_route(served, engines_on_gpu)


class Engine:
    """A loaded seam and its scheduler.

    The seam is built, driven and closed on the scheduler's thread, so whatever the engine binds
    to its creating thread (CUDA graphs, vLLM's engine client) is only used there. With
    `in_process=False` the seam lives in a child process pinned to `cuda_device`
    (`ProcessBatchSeam`), and a watcher thread notices when that process exits or hangs.
    """

    def __init__(self, name: str, route: DirectionRoute, heads: list[Head], factory: SeamFactory,
                 scheduler: SchedulerConfig | None = None, in_process: bool = True,
                 cuda_device: str | None = None, replicas: ReplicaConfig | None = None,
                 engines_on_gpu: int = 1, front_ends: int = 1, handoff: EngineHandoff | None = None) -> None:
        self.name = name
        self.route = route
        self.heads = heads
        self.cuda_device = cuda_device
        self.replicas = replicas or ReplicaConfig()
        config = scheduler or SchedulerConfig()
        if handoff is not None:  # another front end's engine process (`serve.front_ends`)
            build = lambda: ProcessBatchSeam.attached(handoff)  # noqa: E731
        elif in_process:
            build = lambda: factory(served_route(route), heads)  # noqa: E731
        else:
            spec = EngineSpec(factory, served_route(route, engines_on_gpu), heads, cuda_device,
                              self.replicas.heartbeat_s)
            build = lambda: ProcessBatchSeam(spec, name, front_ends=front_ends)  # noqa: E731
        self.scheduler = DraftScheduler(build, config, name=name)
        self.seam: Seam = self.scheduler.seam
        # The engine's tokenizer work, off the event loop and off the engine thread: an init's
        # bounds, and every draft's prompt (the seam's `prepare`, run inside `submit`).
        self.tokenizing = ThreadPoolExecutor(max_workers=2, thread_name_prefix=f"engine-{name}-tokenize")
        self._on_death: dict[Hashable, Callable[[EngineDied], None]] = {}
        self._lock = threading.Lock()
        self._closing = False
        self._told = False  # its sessions were told it is gone
        if isinstance(self.seam, ProcessBatchSeam):
            threading.Thread(target=self._watch, name=f"engine-{name}-watch", daemon=True).start()

    # ---- the engine's process ----

    @property
    def alive(self) -> bool:
        """It takes work: not known dead or hung, and its process (if it has one) still runs."""
        return self.scheduler.dead is None and getattr(self.seam, "alive", True)

    @property
    def state(self) -> str:
        """live | hung (taken out for answering nothing within the deadline) | dead."""
        if isinstance(self.scheduler.dead, EngineHung):
            return "hung"
        return "live" if self.alive else "dead"

    def load(self) -> tuple[int, int]:
        """What placement compares: admitted sessions, then drafts queued or running."""
        return self.scheduler.sessions, self.scheduler.queue_depth

    def on_death(self, key: Hashable, notify: Callable[[EngineDied], None]) -> None:
        """Call `notify` (from the watcher's thread) when this engine dies while `key` is open;
        at once if it already has."""
        with self._lock:
            self._on_death[key] = notify
        if self.scheduler.dead is not None:
            notify(self.scheduler.dead)

    def _watch(self) -> None:
        """Until the engine closes: its process exiting is a death; a hang is its heartbeat silent
        past the deadline, a call outstanding past its work's bound, or an idle process that does
        not answer a ping within the deadline. A slow step whose heartbeat beats is left to finish."""
        seam = self.seam
        while not seam.wait_exited(self.replicas.heartbeat_s):
            if self._closing:
                return
            try:
                why = self._hung_because()
            except EngineDied:  # it exited while pinged: the loop's wait sees it
                continue
            if why is not None:
                self._taken_out(EngineHung(f"engine {self.name} (process {seam.pid}) {why}: taken out"))
                seam.kill()  # frees its memory; whoever waits on its pipe gets EngineDied
        if not self._closing:
            self._taken_out(seam.died())

    def _hung_because(self) -> str | None:
        """Why the engine process counts as hung now (None: it does not)."""
        seam, cfg = self.seam, self.replicas
        silent = seam.heartbeat_age_s()
        if silent > cfg.step_deadline_s:
            return f"answered nothing, its heartbeat silent for {silent:.1f} s (deadline {cfg.step_deadline_s:g} s)"
        late, work = seam.waiting_s(), seam.running_work
        bound = self.step_bound_s(work)
        if late > bound:
            return (f"answered nothing for {late:.1f} s, past the bound of its work ({work} tokens: "
                    f"{cfg.step_deadline_s:g} s + {cfg.step_token_s:g} s per token = {bound:.1f} s)")
        if not late and seam.idle_s() >= cfg.heartbeat_s and not seam.ping(cfg.step_deadline_s):
            return f"answered nothing to a ping for {cfg.step_deadline_s:g} s (deadline {cfg.step_deadline_s:g} s)"
        return None

    def step_bound_s(self, work: int) -> float:
        """How long a step may run with `work` tokens of drafts in it before its engine is hung."""
        return self.replicas.step_deadline_s + self.replicas.step_token_s * work

    def _taken_out(self, error: EngineDied) -> None:
        """Fail what the scheduler holds and tell every open session, once."""
        if self.scheduler.dead is not None and self._told:
            return
        self.scheduler.engine_died(error)
        error = self.scheduler.dead  # the first cause wins: a hang, then the kill that ended it
        with self._lock:
            self._told = True
            notify = list(self._on_death.values())
        for n in notify:
            try:
                n(error)
            except Exception:  # noqa: BLE001 - one session's notice failing must not stop the others'
                log.exception("engine %s: telling a session it died failed", self.name)

    def budget(self, limits: SessionLimits, draft_tokens: int) -> PromptBudget | None:
        """The engine's token bounds, counted with its seam's tokenizer (in its process)."""
        if isinstance(self.seam, ProcessBatchSeam):
            return self.seam.prompt_budget(limits, draft_tokens)
        return PromptBudget.for_seam(self.seam, limits, draft_tokens)

    # ---- sessions (the server's side) ----

    def open_session(self, key: Hashable) -> SessionSeam:
        """Admit a session (`SchedulerBusy` past capacity); the seam its `Session` drafts through."""
        self.scheduler.open_session(key)
        return SessionSeam(self.scheduler, key)

    def close_session(self, key: Hashable) -> None:
        with self._lock:
            self._on_death.pop(key, None)
        self.scheduler.close_session(key)

    def open_view(self, key: Hashable, heads: list[Head]) -> "HeadRows":
        """Admit a session that drafts with `heads` (a subset of the engine's): its seam view."""
        return HeadRows(self.open_session(key), self.heads, heads)

    def view(self, key: Hashable, heads: list[Head]) -> "HeadRows":
        """The seam view of a session already admitted (`EngineRegistry.place`), drafting with `heads`."""
        if not self.scheduler.admitted(key):
            raise ValueError(f"session {key!r} is not admitted to engine {self.name}")
        return HeadRows(SessionSeam(self.scheduler, key), self.heads, heads)

    def submit(self, key: Hashable, request: DraftRequest) -> Future:
        """Queue a session's draft (a final in order, a partial superseding its stale one); the
        future resolves to the `Draft`, `Superseded`, or the engine's error. On a watched engine
        a draft whose step could not be bounded within `max_step_s` is refused here, before it
        runs (`DraftTooLarge`), rather than taking its engine out as hung."""
        if isinstance(self.seam, ProcessBatchSeam):
            work = draft_work(request)
            bound = self.step_bound_s(work)
            if bound > self.replicas.max_step_s:
                kind = "final" if request.final else "draft"
                raise DraftTooLarge(
                    f"{kind} too large for this engine: {work} tokens of work ({request.max_new_tokens} new, "
                    f"{work - request.max_new_tokens} prompt words) need a step bound of {bound:.0f} s, past "
                    f"max_step_s={self.replicas.max_step_s:g} s; send shorter utterances")
        return self.scheduler.submit(key, request)

    def supersede(self, key: Hashable) -> None:
        """A newer update of the session arrived: its queued or running partial is stale."""
        self.scheduler.supersede(key)

    def stats(self) -> dict:
        child = isinstance(self.seam, ProcessBatchSeam)
        return {"engine": self.name, "seam": getattr(self.seam, "name", "?"), "max_batch": self.scheduler.max_batch,
                "device": self.route.device, "gpu": self.cuda_device, "pid": self.seam.pid if child else os.getpid(),
                "alive": self.alive, "state": self.state,
                "sessions": self.scheduler.sessions, "queued": self.scheduler.queue_depth,
                **self.scheduler.stats.as_dict(),
                "gc_s": process_pauses().pause_s,  # this process's collections (all its threads wait)
                **({"child_steps": self.seam.child.steps, "child_drafts": self.seam.child.drafts,
                    "child_step_s": self.seam.child.wall_s, "child_cpu_s": self.seam.child.cpu_s,
                    "child_gc_s": self.seam.child_gc_s} if child else {}),
                **({"step_phases_s": dict(phases)} if (phases := getattr(self.seam, "step_phases_s", None)) else {})}

    def close(self) -> None:
        """Stop the scheduler (it closes the seam on its own thread), then the tokenizing threads."""
        self._closing = True
        try:
            self.scheduler.close()
        except Exception as e:  # noqa: BLE001 - shutdown goes on; the failure is logged
            log.warning("engine %s: closing its scheduler failed: %s", self.name, e)
        self.tokenizing.shutdown(wait=False, cancel_futures=True)


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
        self._identity = self.index == list(range(self._n_engine))  # the engine's heads, in order

    @property
    def name(self) -> str:
        return getattr(self.seam, "name", "seam")

    def select(self, draft: Draft) -> Draft:
        idx = self.index
        if self._identity:  # the route's own heads, in order: nothing to pick
            return draft if draft.heads == self.heads or not draft.heads else replace(draft, heads=list(self.heads))

        def pick(a):
            return a if a is None or len(a) != self._n_engine else a[idx]

        tokens = [replace(t, rows=pick(t.rows), other_prompt_mass=pick(t.other_prompt_mass),
                          generated_mass=pick(t.generated_mass), context_mass=pick(t.context_mass),
                          history_mass=pick(t.history_mass)) for t in draft.tokens]
        return replace(draft, heads=list(self.heads) if draft.heads else [], tokens=tokens)

    def draft(self, request: DraftRequest) -> Draft:
        return self.select(self.seam.draft(request))

    def close(self) -> None:
        self.seam.close()


def route_key(route: DirectionRoute) -> tuple:
    """Routes with equal keys share one engine (their heads are captured together)."""
    return (route.model, route.seam, route.device, route.dtype,
            json.dumps(route.seam_options, sort_keys=True, default=str))


class EngineRegistry:
    """Engines by (model, seam, device, dtype, options): directions of one model share them, and
    their heads are the union of the heads of every route in `routes` with that key. `engines`
    says how many serve one key (`replica_devices`): one runs in this process, more run in a
    process each."""

    def __init__(self, factory: SeamFactory, scheduler: SchedulerConfig | None = None,
                 routes: dict[str, DirectionRoute] | None = None, engines: EngineCount = 1,
                 replicas: ReplicaConfig | None = None, front_ends: int = 1) -> None:
        self.factory = factory
        self.front_ends = front_ends  # server processes driving each engine (`serve.front_ends`)
        self.scheduler = scheduler
        self.replicas = replicas or ReplicaConfig()
        self.routes = dict(routes or {})
        self.engines_per_route = engines
        self._engines: dict[tuple, list[Engine]] = {}
        self._count = 0
        self._lock = threading.Lock()

    def union_heads(self, route: DirectionRoute, direction: str) -> list[Head]:
        """Every same-engine route's heads, directions in sorted order, each head once."""
        heads: list[Head] = []
        for d, r in sorted({**self.routes, direction: route}.items()):
            if route_key(r) == route_key(route):
                heads += [h for h in resolve_heads(r, d) if h not in heads]
        return heads

    def load(self, route: DirectionRoute, direction: str) -> list[Engine]:
        """The route's engines, loaded on first use (several at once, one process each)."""
        key = route_key(route)
        with self._lock:  # loads are rare and slow; one at a time
            engines = self._engines.get(key)
            if engines is None:
                engines = self._build(route, direction)
                self._engines[key] = engines
            return engines

    def _build(self, route: DirectionRoute, direction: str) -> list[Engine]:
        heads = self.union_heads(route, direction)
        devices = replica_devices(route, self.engines_per_route, self.replicas.engines_per_gpu)
        names = [str(self._count + i) for i in range(len(devices))]
        self._count += len(devices)
        started = time.perf_counter()
        if devices == [None] and not self.replicas.own_process and self.front_ends == 1:
            engines = [Engine(names[0], route, heads, self.factory, self.scheduler)]
        else:
            engines = start_together([partial(Engine, n, route, heads, self.factory, self.scheduler, False, d,
                                              self.replicas, devices.count(d) if d is not None else 1,
                                              self.front_ends)
                                      for n, d in zip(names, devices)])
        for e in engines:
            log.info("engine %s: %s/%s heads=%s on %s loaded in %.1fs (batch %d)", e.name, route.model, route.seam,
                     [(h.layer, h.head) for h in heads], f"GPU {e.cuda_device}" if e.cuda_device else
                     ("its own process" if isinstance(e.seam, ProcessBatchSeam) else "this process"),
                     time.perf_counter() - started, e.scheduler.max_batch)
        return engines

    def attach(self, name: str, route: DirectionRoute, heads: list[Head], handoff: EngineHandoff) -> Engine:
        """An engine another front end loaded, driven from here over the pipe it handed over."""
        engine = Engine(name, route, heads, self.factory, self.scheduler, False, handoff.cuda_device, self.replicas,
                        handoff=handoff)
        with self._lock:
            self._engines.setdefault(route_key(route), []).append(engine)
        return engine

    def get(self, route: DirectionRoute, direction: str) -> Engine:
        """The route's least loaded live engine (without admitting anything to it)."""
        return least_loaded(self.load(route, direction), route)

    def place(self, route: DirectionRoute, direction: str, keys: Sequence[Hashable]) -> Engine:
        """Admit the session `keys` (one per target, one slot: a session takes one place of the
        engine's capacity whatever its targets) to the route's least loaded live engine;
        `SchedulerBusy` when it is full, `EngineDied` when none is left."""
        engines = self.load(route, direction)
        with self._lock:  # placements one at a time, so two sessions never both see the same load
            engine = least_loaded(engines, route)
            admitted = []
            try:
                for key in keys:
                    engine.scheduler.open_session(key, slot=keys[0])
                    admitted.append(key)
            except BaseException:
                for key in admitted:
                    engine.close_session(key)
                raise
            return engine

    @property
    def engines(self) -> list[Engine]:
        return [e for engines in list(self._engines.values()) for e in engines]

    def close(self) -> None:
        """Close every engine, all at once (each one waits for its seam, or its process, to stop)."""
        with self._lock:
            engines, self._engines = self.engines, {}
        close_together(engines)


def least_loaded(engines: Sequence[Engine], route: DirectionRoute) -> Engine:
    """Fewest admitted sessions, then fewest drafts queued or running, then the first; dead ones never."""
    live = [e for e in engines if e.alive]
    if not live:
        raise EngineDied(f"every engine serving {route.model}/{route.seam} has stopped")
    return min(live, key=lambda e: e.load())
