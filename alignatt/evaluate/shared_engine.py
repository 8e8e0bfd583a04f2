"""Many in-process streams at once through the variant's engines: `alignatt eval --concurrency N`.

At concurrency 1 a row's streams (sentences, talks, offline sentences) are replayed one after
another on the calling thread, each drafting through the variant's seam itself: the eval as it
always was. At N > 1, N streams run at once, a thread each, and every stream's `Session` drafts
through one `DraftScheduler` over the variant's seam, as `alignatt serve` drafts for its sessions:
a seam with a batch interface (vllm_capture) takes the streams' drafts into one running batch, one
without runs them one at a time (`OneAtATime`). Each stream stays lockstep (its next update after
its reply), and the outputs come back in the streams' order, whichever finishes first. With several
engines (`--engines`), each replay process runs its share of the streams so, over its own engine
(`alignatt.evaluate.shards`).

bf16 batching can change a draft (a batch runs other kernels than a lone request), so the rows
record the concurrency they ran at.
"""

from __future__ import annotations

import collections
import itertools
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Sequence, TypeVar

from alignatt.core.draft import DraftRequest, Seam
from alignatt.core.errors import AlignattError
from alignatt.serve.batch_seam import as_batch_seam
from alignatt.serve.scheduler import DraftScheduler, SchedulerConfig, SessionSeam

Item = TypeVar("Item")
Output = TypeVar("Output")
ReplayOne = Callable[[Seam, Item], Output]  # replays one stream, drafting through the seam it is given


class LentBatchSeam:
    """The variant's seam as a scheduler's engine (batched when the seam batches, else a batch of
    one). Closing the scheduler leaves the seam open: the variant closes it after its last row."""

    def __init__(self, seam: Seam) -> None:
        self._engine = as_batch_seam(seam)
        self.name = getattr(seam, "name", "seam")
        if hasattr(self._engine, "prepare"):  # the scheduler prepares drafts on the streams' threads
            self.prepare = self._engine.prepare

    @property
    def max_batch(self) -> int:
        return getattr(self._engine, "max_batch", 1)

    def submit(self, request: DraftRequest, prepared=None):
        return self._engine.submit(request) if prepared is None else self._engine.submit(request, prepared)

    def abort(self, handle) -> None:
        self._engine.abort(handle)

    def step(self):
        return self._engine.step()

    def has_unfinished(self) -> bool:
        return self._engine.has_unfinished()

    def close(self) -> None:
        pass


class SequentialStreams:
    """Concurrency 1: each stream in turn on this thread, drafting through the seam itself."""

    concurrency = 1

    def __init__(self, seam: Seam) -> None:
        self.seam = seam

    def map(self, replay_one: ReplayOne, items: Sequence[Item], names: Sequence[str]) -> list[Output]:
        return [replay_one(self.seam, item) for item in items]

    def close(self) -> None:
        pass


class ConcurrentStreams:
    """Concurrency N > 1: N streams at once, their drafts batched by one draft scheduler over the
    seam (a seam or a batch seam; the scheduler leaves it open)."""

    def __init__(self, seam: Seam, concurrency: int, name: str = "eval") -> None:
        self.concurrency = concurrency
        # Every stream may be in flight at once: the scheduler admits them all.
        self.scheduler = DraftScheduler(lambda: LentBatchSeam(seam), SchedulerConfig(capacity=concurrency),
                                        name=name)
        self._calls = itertools.count()

    def map(self, replay_one: ReplayOne, items: Sequence[Item], names: Sequence[str], stop=None) -> list[Output]:
        """Every item replayed, up to N at once; the outputs in the items' order. The first stream
        to fail fails the whole map (AlignattError naming it) once the running ones have ended;
        no stream starts after a failure, nor once `stop` (an Event: another process's failure) is set."""
        call = next(self._calls)
        outputs: list[Any] = [None] * len(items)
        failures: list[tuple[str, BaseException]] = []
        lock = threading.Lock()

        def run(i: int) -> None:
            if failures or (stop is not None and stop.is_set()):
                return
            key = (call, i)  # a scheduler session per stream, closed when the stream ends
            self.scheduler.open_session(key)
            try:
                outputs[i] = replay_one(SessionSeam(self.scheduler, key), items[i])
            except BaseException as e:  # noqa: BLE001 - reported below, for the whole eval
                with lock:
                    failures.append((names[i], e))
            finally:
                self.scheduler.close_session(key)

        workers = max(min(self.concurrency, len(items)), 1)
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="eval-stream") as pool:
            list(pool.map(run, range(len(items))))
        if failures:
            name, error = failures[0]
            detail = (str(error).splitlines() or [""])[0]
            raise AlignattError(f"stream {name} failed ({len(failures)} of {len(items)} streams failed, "
                                f"{self.concurrency} at once): {type(error).__name__}: {detail}") from error
        if stop is not None and stop.is_set():
            raise AlignattError(f"stopped after {sum(o is not None for o in outputs)} of {len(items)} streams")
        return outputs

    def batch_sizes(self) -> collections.Counter:
        """How many engine steps ran each batch size."""
        return collections.Counter(self.scheduler.stats.batch_sizes)

    def describe(self) -> str:
        """Engine steps and batch sizes."""
        return describe_batches([self.batch_sizes()], self.concurrency, self.scheduler.max_batch)

    def close(self) -> None:
        """Stop the scheduler (the seam stays open)."""
        self.scheduler.close()


def describe_batches(sizes: Sequence[collections.Counter], concurrency: int, engine_limit: int) -> str:
    """`sizes`: per engine, the steps of each batch size; the line the eval prints and records."""
    total = sum(sizes, collections.Counter())
    steps = sum(total.values())
    engines = len(sizes)
    at_once = f"{concurrency} streams at once" + (f" on {engines} engines" if engines > 1 else "")
    if not steps:
        return f"{at_once}: no engine steps"
    mean = sum(k * v for k, v in total.items()) / steps
    each = f" ({'/'.join(str(sum(s.values())) for s in sizes)} per engine)" if engines > 1 else ""
    return (f"{at_once}: {steps} engine steps{each}, batch mean {mean:.1f}, max {max(total)} "
            f"(engine limit {engine_limit})")


def stream_runner(seam: Seam, concurrency: int) -> SequentialStreams | ConcurrentStreams:
    """The variant's seam as a row's stream runner."""
    return SequentialStreams(seam) if concurrency == 1 else ConcurrentStreams(seam, concurrency)


def streams_note(concurrency: int, engines: int) -> str:
    """The artifact config's note on the in-process streams at once."""
    where = ("one draft scheduler on the variant's engine" if engines == 1
             else f"a draft scheduler on each of the variant's {engines} engines")
    return (f"{concurrency} in-process streams at once, their drafts batched by {where} (vllm_capture: "
            f"at most the served route's max_num_seqs a step); a round trip includes the wait for the batch; protocol "
            "drivers replay one stream at a time")
