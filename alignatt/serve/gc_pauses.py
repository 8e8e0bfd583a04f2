"""Python's garbage collector in a serving process: its pauses counted, and the startup heap frozen.

A collection stops every thread of the process; in the engine's process that is time the GPU waits.
`process_pauses()` counts each collection's wall (a load level reports it per engine step, beside
the step's parts). `freeze_startup_heap()` moves every object alive once the engines have started
(the model runner, its graphs, the seam's plans) into the permanent generation, so that the full
collections a busy server still runs walk only what it allocated since. vLLM freezes its own heap
after warm-up; the seam and the server build more after that.
"""

from __future__ import annotations

import gc
import os
import time
from typing import Optional


class GcPauses:
    """The summed wall of this process's collections since `install`."""

    def __init__(self) -> None:
        self.pause_s = 0.0
        self._started: Optional[float] = None

    def _callback(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        elif self._started is not None:
            self.pause_s += time.perf_counter() - self._started
            self._started = None

    def install(self) -> "GcPauses":
        gc.callbacks.append(self._callback)
        return self

    def uninstall(self) -> None:
        if self._callback in gc.callbacks:
            gc.callbacks.remove(self._callback)


_of_process: dict[int, GcPauses] = {}  # by pid: a forked child counts its own


def process_pauses() -> GcPauses:
    """This process's counter, installed at the first call."""
    pid = os.getpid()
    if pid not in _of_process:
        _of_process[pid] = GcPauses().install()
    return _of_process[pid]


def freeze_startup_heap() -> None:
    """Collect, then freeze every object alive now (garbage left uncollected here would stay for good)."""
    gc.collect()
    gc.freeze()
