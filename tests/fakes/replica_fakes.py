"""Stand-in seams for engines in their own processes: a picklable factory, and a record of which
process drafted what (one file per process that built a seam, one line per draft: the request's first
source word).

The route's `seam_options` configure it: `record_dir` (none: nothing is recorded), FakeSeam's `delay_s`, and
`fail_word` (a draft whose source holds that word raises ValueError), `hang_word` (a draft whose
source holds that word stops its process with SIGSTOP: an engine that answers nothing), or
`fail_build` (the seam cannot be built).
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import signal
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from alignatt.core.draft import Draft, DraftRequest, Head
from tests.fakes.batch_fakes import StandInBatchSeam
from tests.fakes.mt_fakes import FakeSeam


class RecordingSeam(FakeSeam):
    def __init__(self, heads: list[Head], record_dir: str | None = None, fail_word: str = "", hang_word: str = "",
                 slow_count_word: str = "", slow_count_s: float = 0.0, **options) -> None:
        super().__init__(heads=heads, **options)
        self.record = Path(record_dir) / f"{os.getpid()}.log" if record_dir else None
        if self.record is not None:
            self.record.touch()  # a process that built a seam is on record before it drafts (it may never)
        self.fail_word = fail_word
        self.hang_word = hang_word
        self.slow_count_word, self.slow_count_s = slow_count_word, slow_count_s

    def count_prompt_tokens(self, request: DraftRequest) -> int:
        if self.slow_count_word and self.slow_count_word in request.source_words:
            time.sleep(self.slow_count_s)  # an engine process slow to answer a token count
        return super().count_prompt_tokens(request)

    def draft(self, request: DraftRequest) -> Draft:
        if self.fail_word and self.fail_word in request.source_words:
            raise ValueError(f"stand-in refuses {self.fail_word!r}")
        if self.hang_word and self.hang_word in request.source_words:
            os.kill(os.getpid(), signal.SIGSTOP)  # mid-step: the server's call gets no answer
        draft = super().draft(request)
        if self.record is not None:
            with self.record.open("a") as f:
                f.write(request.source_words[0] + "\n")
        return replace(draft, seam=f"{self.name}@{os.getpid()}")


def recording_factory(route, heads: list[Head]) -> RecordingSeam:
    options = dict(route.seam_options)
    if options.pop("fail_build", False):
        raise RuntimeError("stand-in engine cannot load")
    return RecordingSeam(heads, **options)


def drafts_by_process(record_dir) -> dict[int, list[str]]:
    """pid -> the first source word of every draft that process made, in order."""
    return {int(p.stem): p.read_text().split() for p in Path(record_dir).glob("*.log")}


def process_of(record_dir, tag: str) -> set[int]:
    """The processes that drafted for words starting with `tag` (one session's words)."""
    return {pid for pid, words in drafts_by_process(record_dir).items() if any(w.startswith(tag) for w in words)}


@pytest.fixture(autouse=True)
def no_leaked_processes():
    """Autouse where imported: every engine process a test started has ended within 10 s of it."""
    before = {p.pid for p in multiprocessing.active_children()}
    yield
    deadline = time.monotonic() + 10
    while [p for p in multiprocessing.active_children() if p.pid not in before] and time.monotonic() < deadline:
        time.sleep(0.05)
    left = [p for p in multiprocessing.active_children() if p.pid not in before]
    assert not left, f"engine processes left running: {left}"


def vllm_route_factory(route, heads: list[Head]) -> RecordingSeam:
    """recording_factory for a vllm_capture route: the stand-in drafts as it always does, whatever
    engine options (mode, prefix caching, batch limit, memory share) the server gave the route."""
    from alignatt.capture.vllm.engine import VllmEngineConfig

    engine_options = set(VllmEngineConfig.model_fields)
    return recording_factory(route.model_copy(update={"seam_options": {
        k: v for k, v in route.seam_options.items() if k not in engine_options}}), heads)


class WithOptions:
    """A picklable factory: `factory` (a module-level one) on the route with `options` added to its
    seam options (the eval's routes carry only the variant's own), e.g. a `record_dir` or `fail_word`.
    `fail_first_build=DIR`: the first process to build in DIR cannot (the others can)."""

    def __init__(self, factory=recording_factory, **options) -> None:
        self.factory = factory
        self.options = options

    def __call__(self, route, heads: list[Head]):
        options = dict(self.options)
        first = options.pop("fail_first_build", None)
        if first is not None:
            try:
                os.close(os.open(Path(first) / "built", os.O_CREAT | os.O_EXCL))
                raise RuntimeError("stand-in engine cannot load (the first to build)")
            except FileExistsError:
                pass
        return self.factory(route.model_copy(update={"seam_options": {**route.seam_options, **options}}), heads)


class PreparedWhere:
    """A stand-in `preparer`: the prompt is the request's words, tagged with the process that built
    it. `unpicklable`: it holds a lock, so it cannot leave the process that made it."""

    def __init__(self, unpicklable: bool = False) -> None:
        self.lock = threading.Lock() if unpicklable else None

    def __call__(self, request: DraftRequest) -> tuple[int, tuple[str, ...]]:
        return os.getpid(), tuple(request.source_words)


class PreparingProcessSeam(StandInBatchSeam):
    """A batch stand-in with vllm_capture's `prepare` and `preparer`; each draft's `seam` names the
    process that prepared its prompt (`prepared@<pid>`). A draft takes `steps` steps; `refuse_word`:
    `submit` raises ValueError for a request whose source holds it; `collect`: each step runs a full
    garbage collection (a pause the child reports) and records how many objects its process froze."""

    def __init__(self, unpicklable: bool = False, steps: int = 1, refuse_word: str = "", collect: bool = False) -> None:
        super().__init__(max_batch=8, steps_for=lambda r: steps)
        self.preparer = PreparedWhere(unpicklable)
        self.prompts: dict[int, tuple] = {}
        self.refuse_word = refuse_word
        self.step_phases_s = {"stand_in": 0.0}
        self.finished = 0
        self.collect = collect

    def prepare(self, request: DraftRequest):
        return self.preparer(request)

    def submit(self, request: DraftRequest, prompt=None) -> int:
        if self.refuse_word and self.refuse_word in request.source_words:
            raise ValueError(f"stand-in refuses {self.refuse_word!r}")
        handle = super().submit(request)
        self.prompts[handle] = prompt if prompt is not None else self.prepare(request)
        return handle

    def step(self):
        started = time.perf_counter()
        self.step_phases_s["last_started_at"] = time.monotonic()  # one clock for all processes (Linux)
        out = [(h, replace(d, seam=f"prepared@{self.prompts.pop(h)[0]}")) for h, d in super().step()]
        self.step_phases_s["stand_in"] += time.perf_counter() - started  # as vllm_capture times its parts
        if self.collect:
            self.step_phases_s["frozen"] = gc.get_freeze_count()
            gc.collect()
        self.finished += len(out)
        return out

    def acceptance_totals(self) -> dict:
        return {"drafts": self.finished}  # as vllm_capture counts its verification figures


def preparing_factory(route, heads: list[Head]) -> PreparingProcessSeam:
    return PreparingProcessSeam(**route.seam_options)
