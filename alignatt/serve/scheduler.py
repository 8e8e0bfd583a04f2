"""One draft scheduler per engine: every session's partials and finals, batched onto one seam.

The scheduler owns the engine's one thread (the seam is built, driven and closed there) and keeps
the engine's batch full: whenever fewer than `max_batch` drafts are in the engine, queued ones are
submitted and join the running batch at the next step (for `vllm_capture` that is vLLM's own
continuous batching; a seam without a batch interface runs through `OneAtATime`, a batch of one).

Rules:
- a session has at most one partial queued or running: a newer update supersedes it (a queued
  one is dropped, a running one is aborted in the engine), its waiter gets `Superseded`;
- finals are never superseded, dropped or reordered within their session, and a session's finals
  go before its partial;
- sessions take turns, least recently served first, one draft each per turn (the share bound):
  between a draft being queued and its submission to the engine, every other session gets at most
  one draft submitted. So a 2-word partial waits for the drafts already running plus at most one
  draft of each other session, however many finals those sessions have queued;
- a session is what a client opened: the keys of one multi-target session share one `slot`, so it
  takes one place of `capacity` and one turn (its targets' drafts batch in extra passes of a turn
  when the engine has room);
- sessions are admitted up to `capacity` (`SchedulerBusy` beyond), and a session may queue at most
  `max_queued_finals` finals (a client that floods finals is refused, others are not slowed);
- results are handed over through futures: a session that never collects them blocks nothing;
- an engine that dies (`EngineDied`: its process is gone) or hangs (`EngineHung`: its process
  answered nothing within the deadline, noticed by the engine's watcher) fails everything the
  scheduler holds and every later submit or admission, with that error.
"""

from __future__ import annotations

import collections
import itertools
import logging
import threading
import time
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable, Optional, Sequence

from pydantic import BaseModel, ConfigDict, Field

from alignatt.core.draft import Draft, DraftRequest, Seam
from alignatt.serve.batch_seam import BatchSeam, as_batch_seam

log = logging.getLogger("alignatt.serve.scheduler")


class Superseded(Exception):
    """This partial was replaced by a newer update of its session before it was answered."""


class SchedulerBusy(Exception):
    """The engine serves as many sessions (or queued finals) as it is configured for."""


class EngineDied(Exception):
    """The engine is gone (its process exited): what it held is lost, and it takes no more work."""


class EngineHung(EngineDied):
    """The engine's process answered nothing within its deadline: it is taken out like a dead one."""


class SchedulerConfig(BaseModel):
    """How many sessions an engine admits and how much work it takes at once."""

    model_config = ConfigDict(extra="forbid")

    capacity: int = Field(64, ge=1, description="sessions admitted; more get `busy`")
    max_batch: Optional[int] = Field(None, ge=1, description="drafts in the engine at once; None: the seam's")
    max_queued_finals: int = Field(8, ge=1, description="finals one session may have waiting")
    abort_running: bool = Field(True, description="a newer update aborts its session's running partial")


@dataclass
class _Job:
    session: Hashable
    request: DraftRequest
    final: bool
    future: Future
    order: int
    submitted_at: float
    prepared: Any = None  # the engine's `prepare(request)`, done on the submitting thread
    handle: Any = None
    started_at: Optional[float] = None


@dataclass
class SchedulerStats:
    steps: int = 0
    submitted: int = 0
    finished: int = 0
    superseded_queued: int = 0
    aborted_running: int = 0
    discarded: int = 0  # finished after being superseded (could not be aborted)
    failed: int = 0
    refused: int = 0
    admitted: int = 0  # sessions opened on this engine, ever
    batch_sizes: collections.Counter = field(default_factory=collections.Counter)  # drafts in the engine per step
    peak_in_flight: int = 0
    # Inside the seam's step: wall time, and this thread's CPU time. The rest is blocked time: on
    # the GIL, a child process's reply, or a device wait that sleeps (a spinning one counts as CPU).
    step_s: float = 0.0
    step_cpu_s: float = 0.0
    collects: int = 0  # steps with no draft in flight (they only read what the engine held for nobody)
    # Where a delivered draft's time went, summed: queued here (submitted until picked for the engine),
    # then in the engine (picked until its draft came back to this thread).
    queued_s: float = 0.0
    in_engine_s: float = 0.0

    def as_dict(self) -> dict:
        out = {k: v for k, v in self.__dict__.items() if k != "batch_sizes"}
        out["batch_sizes"] = {str(k): v for k, v in sorted(self.batch_sizes.items())}
        return out


class DraftScheduler:
    """Builds the seam on its own thread, then schedules every session's drafts onto it."""

    def __init__(self, build: Callable[[], Seam], config: SchedulerConfig | None = None, name: str = "0",
                 start_timeout_s: float = 1800.0) -> None:
        self.config = config or SchedulerConfig()
        self.name = name
        self.stats = SchedulerStats()
        self.seam: Seam | None = None
        self._engine: BatchSeam | None = None
        self._cond = threading.Condition()
        self._slot_of: dict[Hashable, Hashable] = {}  # session key -> its slot (the client's session)
        self._served: dict[Hashable, int] = {}  # slot -> the turn it was last served in (0: never)
        self._turns = itertools.count(1)
        self._finals: collections.deque[_Job] = collections.deque()
        self._partials: dict[Hashable, _Job] = {}  # queued partial per session
        self._running: dict[Any, _Job] = {}  # engine handle -> job
        self._to_abort: list[Any] = []
        self._order = itertools.count()
        self._stopping = False
        self.dead: EngineDied | None = None
        self._built = threading.Event()
        self._build_error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(build,), name=f"engine-{name}", daemon=True)
        self._thread.start()
        if not self._built.wait(start_timeout_s):
            raise TimeoutError(f"engine {name} did not load within {start_timeout_s:.0f}s")
        if self._build_error is not None:
            self._thread.join(5)
            raise self._build_error

    @property
    def max_batch(self) -> int:
        own = getattr(self._engine, "max_batch", 1)
        return min(self.config.max_batch, own) if self.config.max_batch else own

    # ---- sessions ----

    def admitted(self, session: Hashable) -> bool:
        with self._cond:
            return session in self._slot_of

    def open_session(self, session: Hashable, slot: Hashable | None = None) -> None:
        """Admit `session` (a key drafts are submitted under) in `slot` (default: its own): keys of
        one slot are one client session, which takes one place of `capacity` and one turn."""
        slot = session if slot is None else slot
        with self._cond:
            if self.dead is not None:
                raise EngineDied(str(self.dead))
            if session in self._slot_of:  # a session is admitted once (admission.py views it after)
                raise ValueError(f"session {session!r} is already admitted to engine {self.name}")
            if slot not in self._served:
                if len(self._served) >= self.config.capacity:
                    self.stats.refused += 1
                    raise SchedulerBusy(f"all {self.config.capacity} sessions of engine {self.name} are in use")
                self._served[slot] = 0
                self.stats.admitted += 1
            self._slot_of[session] = slot

    def has_room(self) -> bool:
        """A new session would be admitted (what `/health` reports as capacity)."""
        with self._cond:
            return self.dead is None and len(self._served) < self.config.capacity

    def close_session(self, session: Hashable) -> None:
        """The session is gone: its queued work is dropped and its running work aborted."""
        with self._cond:
            slot = self._slot_of.pop(session, None)
            if slot is not None and slot not in self._slot_of.values():
                self._served.pop(slot, None)
            self._drop_partial(session, "session closed")
            for job in [j for j in self._finals if j.session == session]:
                self._finals.remove(job)
                _fail(job.future, Superseded("session closed"))
            for handle, job in list(self._running.items()):
                if job.session == session:
                    self._abort_running(handle, job, "session closed")
            self._cond.notify_all()

    @property
    def sessions(self) -> int:
        """Client sessions admitted (a multi-target session is one)."""
        return len(self._served)

    @property
    def queue_depth(self) -> int:
        """Drafts queued or running."""
        with self._cond:
            return len(self._finals) + len(self._partials) + len(self._running)

    # ---- work ----

    def submit(self, session: Hashable, request: DraftRequest) -> Future:
        """Queue one draft (`request.final`: in order, never superseded); the future resolves to its
        `Draft` (or `Superseded`, or the error)."""
        final = request.final
        future: Future = Future()
        # The draft's own host work, here on the caller's thread: a bad request fails its caller
        # at once, and the engine thread only hands the prepared prompt to the engine.
        prepare = getattr(self._engine, "prepare", None)
        prepared = prepare(request) if prepare is not None else None
        with self._cond:
            if self._stopping:
                raise RuntimeError(f"engine {self.name} is shutting down")
            if self.dead is not None:
                raise EngineDied(str(self.dead))
            if session not in self._slot_of:
                raise SchedulerBusy(f"session {session!r} was not admitted to engine {self.name}")
            job = _Job(session, request, final, future, next(self._order), time.perf_counter(), prepared)
            if final:
                queued = sum(1 for j in self._finals if j.session == session)
                if queued >= self.config.max_queued_finals:
                    raise SchedulerBusy(f"session {session!r} already has {queued} finals waiting")
                self._finals.append(job)
            else:
                self._supersede_locked(session)
                self._partials[session] = job
            self.stats.submitted += 1
            self._cond.notify_all()
        return future

    def supersede(self, session: Hashable) -> None:
        """A newer update of `session` arrived: its queued or running partial is stale."""
        with self._cond:
            self._supersede_locked(session)
            self._cond.notify_all()

    def _supersede_locked(self, session: Hashable) -> None:
        self._drop_partial(session, "a newer update of this session arrived")
        if self.config.abort_running:
            for handle, job in list(self._running.items()):
                if job.session == session and not job.final:
                    self._abort_running(handle, job, "a newer update of this session arrived")

    def _drop_partial(self, session: Hashable, why: str) -> None:
        job = self._partials.pop(session, None)
        if job is not None:
            self.stats.superseded_queued += 1
            _fail(job.future, Superseded(why))

    def _abort_running(self, handle: Any, job: _Job, why: str) -> None:
        del self._running[handle]
        self._to_abort.append(handle)
        self.stats.aborted_running += 1
        _fail(job.future, Superseded(why))

    def _next_jobs(self, room: int) -> list[_Job]:
        """Up to `room` drafts, sessions taking turns (see the module docstring): each session with
        work, least recently served first, gives its next draft (its oldest final, else its
        partial); while room is left, another pass."""
        if room <= 0 or not (self._finals or self._partials):
            return []
        queues: dict[Hashable, collections.deque[_Job]] = {}
        for job in [*self._finals, *sorted(self._partials.values(), key=lambda j: j.order)]:
            queues.setdefault(self._slot_of.get(job.session, job.session), collections.deque()).append(job)
        turn_order = sorted(queues, key=lambda slot: (self._served.get(slot, 0), queues[slot][0].order))
        picked: list[_Job] = []
        while len(picked) < room and any(queues.values()):
            for slot in turn_order:
                if queues[slot] and len(picked) < room:
                    picked.append(queues[slot].popleft())
                    if slot in self._served:
                        self._served[slot] = next(self._turns)
        taken = {id(job) for job in picked}
        self._finals = collections.deque(j for j in self._finals if id(j) not in taken)
        now = time.perf_counter()
        for job in picked:
            job.started_at = now
            if not job.final:
                del self._partials[job.session]
        return picked

    # ---- the engine thread ----

    def _run(self, build: Callable[[], Seam]) -> None:
        try:
            self.seam = build()
            self._engine = as_batch_seam(self.seam)
        except BaseException as e:  # reported to the constructing thread
            self._build_error = e
            self._built.set()
            return
        self._built.set()
        try:
            self._loop()
        finally:
            try:
                self._engine.close()
            except Exception as e:  # noqa: BLE001 - shutdown goes on; the failure is logged
                log.warning("engine %s: closing its seam failed: %s", self.name, e)

    def _loop(self) -> None:
        engine = self._engine
        while True:
            with self._cond:
                while not self._stopping and self.dead is None and not (
                        self._finals or self._partials or self._running or self._to_abort or engine.has_unfinished()):
                    self._cond.wait()
                if self._stopping:
                    self._fail_all(RuntimeError(f"engine {self.name} shut down"))
                    return
                if self.dead is not None:
                    return
                aborts, self._to_abort = self._to_abort, []
                jobs = self._next_jobs(max(self.max_batch - len(self._running), 0))
            try:
                for handle in aborts:
                    engine.abort(handle)
            except EngineDied as e:
                self.engine_died(e, jobs)
                return
            for job in jobs:
                try:
                    job.handle = (engine.submit(job.request) if job.prepared is None
                                  else engine.submit(job.request, job.prepared))
                except EngineDied as e:
                    self.engine_died(e, [j for j in jobs if j.handle is None])
                    return
                except Exception as e:  # noqa: BLE001 - a bad request fails alone
                    self.stats.failed += 1
                    _fail(job.future, e)
                    continue
                with self._cond:
                    self._running[job.handle] = job
            if not engine.has_unfinished():
                self._fail_running(RuntimeError(f"engine {self.name} holds none of its running drafts"))
                continue
            with self._cond:
                in_flight = len(self._running)
            # With nothing in flight, a step only collects what the engine holds for nobody (an engine
            # process's step sent ahead, aborted drafts): not an engine step, not counted as one.
            if in_flight:
                self.stats.batch_sizes[in_flight] += 1
                self.stats.peak_in_flight = max(self.stats.peak_in_flight, in_flight)
                self.stats.steps += 1
            else:
                self.stats.collects += 1
            started, cpu = time.perf_counter(), time.thread_time()
            try:
                finished = engine.step()
            except EngineDied as e:
                self.engine_died(e)
                return
            except Exception as e:  # noqa: BLE001 - the engine failed this step: fail what it held
                log.exception("engine %s step failed", self.name)
                self._fail_running(e)
                continue
            finally:
                if in_flight:
                    self.stats.step_s += time.perf_counter() - started
                    self.stats.step_cpu_s += time.thread_time() - cpu
            self._deliver(finished)

    def _deliver(self, finished: Sequence[tuple[Any, Draft]]) -> None:
        now = time.perf_counter()  # one step's drafts came back together
        with self._cond:
            for handle, draft in finished:
                job = self._running.pop(handle, None)
                if job is None:
                    self.stats.discarded += 1  # superseded while it ran to completion
                    continue
                if isinstance(draft, BaseException):  # refused when the engine took it
                    self.stats.failed += 1
                    _fail(job.future, draft)
                    continue
                self.stats.finished += 1
                if job.started_at is not None:
                    self.stats.queued_s += job.started_at - job.submitted_at
                    self.stats.in_engine_s += now - job.started_at
                _resolve(job.future, draft)

    def _fail_running(self, error: BaseException) -> None:
        with self._cond:
            running, self._running = list(self._running.values()), {}
            for job in running:
                self.stats.failed += 1
                _fail(job.future, error)
        engine = self._engine
        for job in running:  # a failed step may leave them in the engine
            try:
                engine.abort(job.handle)
            except Exception:  # noqa: BLE001 - best effort
                pass

    def engine_died(self, error: EngineDied, taken: Sequence[_Job] = ()) -> None:
        """The engine is gone: fail every draft held (and `taken`, picked but not yet submitted),
        refuse all later work. Called by whoever notices first: the engine thread or a watcher."""
        with self._cond:
            if self.dead is None:
                self.dead = error
                log.error("engine %s died: %s", self.name, error)
            for job in [*taken, *self._finals, *self._partials.values(), *self._running.values()]:
                if not job.future.done():
                    self.stats.failed += 1
                    _fail(job.future, EngineDied(str(error)))
            self._finals.clear()
            self._partials.clear()
            self._running.clear()
            self._cond.notify_all()

    def _fail_all(self, error: BaseException) -> None:
        for job in [*self._finals, *self._partials.values(), *self._running.values()]:
            if not job.future.done():
                _fail(job.future, error)
        self._finals.clear()
        self._partials.clear()
        self._running.clear()

    def close(self, timeout_s: float = 120.0) -> None:
        """Fail what is pending, stop the thread, close the seam on it."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            log.warning("engine %s: its thread did not stop within %.0fs", self.name, timeout_s)


def _resolve(future: Future, draft: Draft) -> None:
    """Deliver a draft, unless its waiter cancelled the future (then nobody wants it)."""
    try:
        future.set_result(draft)
    except InvalidStateError:
        pass


def _fail(future: Future, error: BaseException) -> None:
    try:
        future.set_exception(error)
    except InvalidStateError:
        pass


class SessionSeam:
    """The `Seam` a `Session` drafts through when it drafts itself (`Session.update`): its drafts
    go to the engine's scheduler, queued as the request says (a final or a partial)."""

    def __init__(self, scheduler: DraftScheduler, session: Hashable, timeout_s: float = 600.0) -> None:
        self.scheduler = scheduler
        self.session = session
        self.name = getattr(scheduler.seam, "name", "seam")
        self.timeout_s = timeout_s

    def draft(self, request: DraftRequest) -> Draft:
        return self.scheduler.submit(self.session, request).result(self.timeout_s)

    def close(self) -> None:
        self.scheduler.close_session(self.session)
