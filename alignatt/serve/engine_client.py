"""The client of an engine in a process of its own: `ProcessBatchSeam`, the server's side of the
pipe, which drives the child with typed messages (`serve.engine_messages`). The child's loop is
`serve.engine_process`, as vLLM keeps its engine core (`core.py`) apart from its client
(`core_client.py`); which device each child runs on is `serve.engine_devices`.

With several engines per route, each one is a child process (multiprocessing "spawn") that pins
itself to one CUDA device and builds the route's seam there, so everything the model binds to its
process (vLLM's engine and capture hooks, CUDA graphs) stays in that process. The server keeps
the engine's `DraftScheduler`; its `BatchSeam` is a `ProcessBatchSeam`, which forwards each call
(`Step`, `Count`, `Describe`, `Totals`, `Ping`, `Close`); the child answers them in order.
Submits and aborts wait for the next `Step` and ride with it, so a step costs one message however
many drafts join or leave the batch in it. While the child has drafts running, one `Step` is always
on its way ahead of the one the server waits for: the child steps on as soon as it has sent a
step's drafts, instead of waiting for the server to read them and answer, which waits for this
process's interpreter lock (the event loop and the sessions' threads hold it most of the time
under load). A reply read while waiting for another call's is kept for `step`. A child that
is gone (end of pipe, broken pipe) is an `EngineDied`. A child that is alive but answers nothing
(stopped, or stuck in a step) is noticed by its engine's watcher (`alignatt.serve.pool.Engine`).
Liveness and slowness are told apart: the child beats a heartbeat (a shared timestamp) from a
thread of its own, which runs while its engine thread computes, and the server counts the work
of the drafts running in it (`draft_work`). A heartbeat silent past `ReplicaConfig.step_deadline_s`,
a call outstanding past its work's bound (`step_deadline_s + step_token_s` per token of work), or
an idle child that does not answer a `Ping` within the deadline, is an `EngineHung`, and the child
is killed.
A seam with a `preparer` (its
`prepare` as a picklable object) hands it over in `Ready`: the server's threads then build and
tokenise each draft's prompt and send it with `Submit`, and the child's one thread only steps.
"""

from __future__ import annotations

import collections
import itertools
import multiprocessing
import multiprocessing.connection
import multiprocessing.util
import os
import pickle
import signal
import threading
import time
from dataclasses import dataclass
from typing import Any, Hashable

from alignatt.core.draft import Draft, DraftRequest
from alignatt.core.errors import AlignattError
from alignatt.serve.budget import PromptBudget
from alignatt.serve.engine_messages import (Abort, ChildTotals, Close, Count, Describe, Failed, KernelProfile, Ping, Profile,
                                            Profiled, Step, Submit, Totals)
from alignatt.serve.engine_process import EngineSpec, serve_engine
from alignatt.serve.scheduler import EngineDied
from alignatt.serve.session import SessionLimits


def draft_work(request: DraftRequest) -> int:
    """Tokens of work a draft may cost its step: the new tokens it may make, plus its prompt's
    words (source, target prefix, context, history). Prefill costs far less per token than
    decoding, so this over-counts: a bound, not an estimate."""
    words = (len(request.source_words) + len(request.target_prefix.split()) + len(request.context_text.split())
             + sum(len(s.split()) + len(t.split()) for s, t in request.history))
    return request.max_new_tokens + words


@dataclass(frozen=True)
class EngineHandoff:
    """What another front end needs to drive an engine process this one started: its own end of a
    pipe to the child (the child sends it `Ready` too), the child's heartbeat and pid. Passed to that
    front end's process when it is spawned (the pipe and the heartbeat travel only then)."""

    name: str
    conn: multiprocessing.connection.Connection
    heartbeat: Any
    pid: int
    cuda_device: str | None = None


class _Sibling:
    """The engine's process seen from a front end that did not start it (so not its parent): waited
    on through a pidfd, killed by pid; its exit status is its parent's to read."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.sentinel = os.pidfd_open(pid)

    @property
    def exitcode(self) -> int | None:
        """None while it runs; -1 once it has exited (how, only its parent knows)."""
        return None if not multiprocessing.connection.wait([self.sentinel], 0) else -1

    def join(self, timeout: float | None = None) -> None:
        multiprocessing.connection.wait([self.sentinel], timeout)

    def kill(self) -> None:
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _unwrapped(reply: Any) -> Any:
    """A reply, or the child's error raised where the server asked."""
    if isinstance(reply, Failed):
        raise reply.error
    return reply


class ProcessBatchSeam:
    """A `BatchSeam` whose seam runs in a child process (see the module docstring).

    Calls are serialised by a lock: the scheduler's thread steps, the sessions' waiting threads
    count tokens; each waits for its reply. Construction returns once the child's seam is built."""

    def __init__(self, spec: EngineSpec, name: str, start_timeout_s: float = 1800.0, front_ends: int = 1) -> None:
        context = multiprocessing.get_context("spawn")
        ends = [context.Pipe() for _ in range(front_ends)]  # (ours, the child's), one per front end
        heartbeat = context.RawValue("d", time.monotonic())  # the child's last beat (shared memory)
        process = context.Process(target=serve_engine, args=([child for _, child in ends], spec, heartbeat),
                                  name=f"alignatt-engine-{name}")
        try:
            process.start()
        except (pickle.PicklingError, AttributeError, TypeError) as e:  # what pickling a closure raises
            for pair in ends:
                for end in pair:
                    end.close()
            raise AlignattError(f"engine {name}: its seam factory cannot be sent to a process of its own ({e}); "
                                "give a module-level function") from None
        for _, child in ends:
            child.close()  # the child holds the only other ends: its exit reads as end of pipe here
        # The other front ends' ends, for `ServerConfig.front_ends` processes to drive the same child.
        self.handoffs = [EngineHandoff(name, conn, heartbeat, process.pid, spec.cuda_device) for conn, _ in ends[1:]]
        self._connect(ends[0][0], heartbeat, name, spec.cuda_device, process, start_timeout_s)

    @classmethod
    def attached(cls, handoff: "EngineHandoff", start_timeout_s: float = 1800.0) -> "ProcessBatchSeam":
        """The seam of a front end that did not start the engine's process: it drives the child over
        its own pipe; the child's life stays the starting server's (closing this one only detaches)."""
        seam = cls.__new__(cls)
        seam.handoffs = []
        seam._connect(handoff.conn, handoff.heartbeat, handoff.name, handoff.cuda_device, _Sibling(handoff.pid),
                      start_timeout_s)
        return seam

    def _connect(self, conn: multiprocessing.connection.Connection, heartbeat: Any, name: str,
                 cuda_device: str | None, process: Any, start_timeout_s: float) -> None:
        self._conn, self._heartbeat, self.process = conn, heartbeat, process
        # At interpreter exit, before multiprocessing joins its children: our end closes, so they stop.
        multiprocessing.util.Finalize(self, self._conn.close, exitpriority=10)
        self.engine_name = name
        self.cuda_device = cuda_device
        self._lock = threading.Lock()
        self._reap = threading.Lock()  # one thread at a time waits for the child's exit status
        self._closed = False
        self._unfinished = False
        self._work: list[Submit | Abort] = []  # for the next step (the scheduler's thread only)
        # A `Step` sent ahead (its reply not collected by `step` yet): sent while the child still
        # ran drafts, so it never waits for this process between steps. `_early`: replies to steps
        # ahead that another call read from the pipe on its way to its own reply, in order.
        self._ahead = 0  # steps ahead whose replies are still in the pipe
        self._early: collections.deque[Any] = collections.deque()
        self._ahead_took_work = False  # the step ahead carried submits (so the child will run drafts)
        self._sent_at: collections.deque[float] = collections.deque()  # unanswered calls, oldest first
        self._handles = itertools.count()
        self._work_of: dict[int, int] = {}  # draft handle -> its work (`draft_work`), while in the child
        self.running_work = 0  # their sum: what bounds a step (read by the watcher's thread)
        self.child = ChildTotals()  # the child's own steps and time, as of its last reply
        self.child_gc_s = 0.0  # its garbage collector's pauses so far, as of its last step
        self.step_phases_s: dict[str, float] | None = None  # the child's seam's, as of its last step
        self._answered_at = time.monotonic()
        try:
            ready = self._call(None, timeout_s=start_timeout_s)  # `Ready`: every front end gets one
        except BaseException:
            self._stop()
            raise
        self.name = ready.name
        self.max_batch = ready.max_batch
        self.pid = ready.pid
        self._ready = ready
        if ready.preparer is not None:
            # The draft's host work (prompt building, tokenising) on the submitting thread, here: the
            # child's one thread only steps its engine (a profile of the eval found ~30 % tokenising).
            self.prepare = ready.preparer


    # ---- the pipe ----

    def _call(self, message: Any, timeout_s: float | None = None) -> Any:
        with self._lock:
            return self._call_locked(message, timeout_s)

    def _send(self, message: Any) -> None:
        try:
            self._conn.send(message)
        except (EOFError, OSError):  # broken pipe, closed: the child is gone
            raise self.died() from None
        self._sent_at.append(time.monotonic())

    def _recv(self, timeout_s: float | None) -> Any:
        """The oldest unanswered call's reply (raises `TimeoutError` past `timeout_s`)."""
        try:
            answered = timeout_s is None or self._conn.poll(timeout_s)
            reply = self._conn.recv() if answered else None
        except (EOFError, OSError):  # end of pipe, closed: the child is gone
            raise self.died() from None
        if not answered:
            raise TimeoutError(f"engine {self.engine_name}: no answer from its process within {timeout_s:.0f}s")
        self._sent_at.popleft()
        self._answered_at = time.monotonic()
        return reply

    def _call_locked(self, message: Any, timeout_s: float | None) -> Any:
        """Send `message` (None: only read) and return its reply; the replies of steps sent ahead
        come first in the pipe and are kept for `step`."""
        if message is not None:
            self._send(message)
        else:  # the child's first message (`Ready`) is on its way unasked
            self._sent_at.append(time.monotonic())
        while self._ahead:
            self._early.append(self._recv(timeout_s))
            self._ahead -= 1
        return _unwrapped(self._recv(timeout_s))

    def died(self) -> EngineDied:
        """The error that says this engine's process is gone, and how it ended."""
        with self._reap:
            self.process.join(2.0)
            code = self.process.exitcode
        how = ("still running, its pipe closed" if code is None else "exited" if isinstance(self.process, _Sibling)
               else f"killed by signal {-code}" if code < 0 else f"exited with code {code}")
        return EngineDied(f"engine {self.engine_name} (process {self.process.pid}) stopped: {how}")

    @property
    def alive(self) -> bool:
        return not self.wait_exited(0)

    # ---- liveness (read by the engine's watcher) ----

    def waiting_s(self) -> float:
        """How long the oldest unanswered call (a step sent ahead included) has waited (0: none)."""
        try:  # the watcher's thread: the deque may empty under it
            return time.monotonic() - self._sent_at[0]
        except IndexError:
            return 0.0

    def idle_s(self) -> float:
        """How long since the child last answered anything."""
        return time.monotonic() - self._answered_at

    def heartbeat_age_s(self) -> float:
        """How long since the child's heartbeat thread last beat."""
        return time.monotonic() - self._heartbeat.value

    def ping(self, timeout_s: float) -> bool:
        """True if the child answers a `Ping` within `timeout_s`, or is busy answering another call
        (whose wait `waiting_s` measures); False if it does not answer. Raises `EngineDied`."""
        if not self._lock.acquire(blocking=False):
            return True
        try:
            self._call_locked(Ping(), timeout_s)
            return True
        except TimeoutError:
            return False
        finally:
            self._lock.release()

    def kill(self) -> None:
        """End the child now (a hung one: SIGKILL also ends a stopped process); its pipe reads as
        closed, so whoever waits on it gets `EngineDied`."""
        if self.process.exitcode is None:
            self.process.kill()

    def wait_exited(self, timeout_s: float | None = None) -> bool:
        """Block until the child has exited (True), or `timeout_s` passed (False)."""
        return bool(multiprocessing.connection.wait([self.process.sentinel], timeout_s))

    # ---- BatchSeam ----

    def submit(self, request: DraftRequest, prepared: Any = None) -> Hashable:
        """Queued for the next step (no round trip); a request the seam refuses comes back from it."""
        handle = next(self._handles)
        self._work.append(Submit(handle, request, prepared))
        self._work_of[handle] = work = draft_work(request)
        self.running_work += work
        return handle

    def abort(self, handle: Hashable) -> None:
        self._work.append(Abort(handle))
        self.running_work -= self._work_of.pop(handle, 0)

    def step(self) -> list[tuple[Hashable, Draft | BaseException]]:
        """The drafts of the child's next step. With a step already on its way ahead, the next one
        (this call's submits and aborts) is sent before that one's reply is read, when the child
        will have drafts to run; after a reply that leaves drafts running, one is sent ahead."""
        work, self._work = tuple(self._work), []
        with self._lock:
            pending = self._ahead + len(self._early)
            sent = not pending or bool(work) or self._unfinished or self._ahead_took_work
            if sent:
                self._send(Step(work))
                self._ahead += 1
            if self._early:
                reply = self._early.popleft()
            else:
                reply = self._recv(None)
                self._ahead -= 1
            # the step now ahead, if any, is the one just sent behind a pending one
            self._ahead_took_work = sent and bool(pending) and any(isinstance(w, Submit) for w in work)
            reply = _unwrapped(reply)
            self._unfinished = reply.unfinished
            if reply.unfinished and not (self._ahead or self._early):
                self._send(Step(()))  # the child steps on while this process reads the reply
                self._ahead += 1
        for handle, _ in reply.finished:  # done, or refused: no longer work of the child's
            self.running_work -= self._work_of.pop(handle, 0)
        self.child = reply.totals
        self.step_phases_s = reply.phases_s
        self.child_gc_s = reply.gc_s
        return reply.finished

    def has_unfinished(self) -> bool:
        return (self._unfinished or bool(self._ahead or self._early)
                or any(isinstance(w, Submit) for w in self._work))

    # ---- what the server asks besides drafts ----

    def count_prompt_tokens(self, request: DraftRequest) -> int:
        return self._call(Count(request=request)).tokens

    def count_text_tokens(self, text: str) -> int:
        return self._call(Count(text=text)).tokens

    def prompt_budget(self, limits: SessionLimits, draft_tokens: int) -> PromptBudget | None:
        """The child seam's token bounds, counted in the child (None: it cannot count)."""
        ready = self._ready
        if not ready.counts:
            return None
        return PromptBudget(limits, self.count_prompt_tokens, self.count_text_tokens, ready.positions,
                            draft_tokens, ready.template_tokens)

    def describe(self) -> dict | None:
        return self._call(Describe()).facts

    def acceptance_totals(self) -> dict | None:
        """The child seam's verification figures so far (None: it does not count them)."""
        return self._call(Totals()).totals

    def profile(self, path: str | None) -> Profiled:
        """Profile the child's thread from now on, to be written to `path`; None: stop and write it."""
        return self._call(Profile(path))

    def kernel_profile(self, path: str | None, steps: int = 0) -> Profiled:
        """Trace the kernels of the child's next `steps` steps; their anatomy is written to `path`
        (None: drop a window the child has not written yet)."""
        return self._call(KernelProfile(path, steps))

    def close(self, timeout_s: float = 120.0) -> None:
        """Close the child's seam and wait for the child; one that does not stop is killed."""
        if self._closed:
            return
        self._closed = True
        if self.alive:
            try:
                self._call(Close(), timeout_s=timeout_s)
            except (EngineDied, TimeoutError):
                pass
        self._stop()

    def _stop(self) -> None:
        if isinstance(self.process, _Sibling):  # not ours to end: the server that started it does
            self._conn.close()
            return
        with self._reap:
            self.process.join(5.0)
            if self.process.exitcode is None:
                self.process.kill()
                self.process.join(5.0)
        self._conn.close()
