"""Profiles of an engine process, on request: its own thread's (cProfile), and its steps'
kernels (`KernelWindow`, torch's profiler reduced by `alignatt.serve.step_anatomy`).

The load benchmark asks for one around a level (`alignatt load --engine-profile-dir`): the child
runs `cProfile` from `Profile(path)` to `Profile(None)`, then writes the statistics to `path` (for
`python -m pstats`) and the functions with the most time of their own to `path` + `.txt`. The
profiler's own overhead slows the child, so a profiled level's timings are not comparable with an
unprofiled one's: it says where the time goes, not how much there is.
"""

from __future__ import annotations

import cProfile
import io
import pstats
import time
from pathlib import Path
from typing import Optional

from alignatt.serve.engine_messages import Profiled

TOP = 40  # functions listed in the text summary


class StepProfiler:
    """The child's profile between two `Profile` messages."""

    def __init__(self) -> None:
        self._profile: Optional[cProfile.Profile] = None
        self._path: Optional[Path] = None

    def toggle(self, path: Optional[str]) -> Profiled:
        """Start a profile to be written to `path`, or (None) stop the running one and write it."""
        if path is not None:
            if self._profile is not None:
                raise RuntimeError(f"engine process: a profile to {self._path} is already running")
            self._path = Path(path)
            self._path.parent.mkdir(parents=True, exist_ok=True)
            self._profile = cProfile.Profile()
            self._profile.enable()
            return Profiled(None, "")
        if self._profile is None:
            raise RuntimeError("engine process: no profile is running")
        self._profile.disable()
        profile, written, self._profile = self._profile, self._path, None
        profile.dump_stats(str(written))
        text = io.StringIO()
        pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(TOP)
        written.with_name(written.name + ".txt").write_text(text.getvalue())
        return Profiled(str(written), text.getvalue())


class KernelWindow:
    """torch's profiler (CPU and CUDA) over the child's next `steps` steps, reduced to a step
    anatomy (`alignatt.serve.step_anatomy`) and written as JSON to `path` when the last one ends.

    The seam tells what it knows of itself: the tokens its steps computed so far and the bytes of
    weights a forward reads (`step_token_counts`, `weight_bytes`; absent on a seam that does not
    count them). The engine stops stepping while torch post-processes the trace and the anatomy
    is reduced (`write_s` records how long): a profiled level's latency is not capacity. Starting
    the profiler and writing the window out are summed apart (`overhead_s`, wall and CPU seconds),
    so that the engine process leaves them out of the steps they fall in."""

    def __init__(self, seam) -> None:  # noqa: ANN001
        self._seam = seam
        self._armed: Optional[tuple[Path, int]] = None
        self._profile = None
        self._left = 0
        self._tokens_before: dict[str, int] = {}
        self.overhead_s = (0.0, 0.0)  # wall and thread CPU seconds: profilers started, windows written

    def arm(self, path: Optional[str], steps: int) -> Profiled:
        """Trace the next `steps` steps into `path`; None: drop a window still armed or running."""
        if path is None:
            if self._profile is not None:
                self._profile.__exit__(None, None, None)
                self._host_scopes(False)
            self._profile = self._armed = None
            return Profiled(None, "")
        if self._armed is not None or self._profile is not None:
            raise RuntimeError("engine process: a kernel profile is already armed")
        if steps < 1:
            raise ValueError("a kernel profile needs at least one step")
        self._armed = (Path(path), steps)
        return Profiled(None, "")

    def _host_scopes(self, on: bool) -> None:
        """The seam's own host ranges in the trace while the window runs (a seam may have none)."""
        switch = getattr(self._seam, "host_scopes", None)
        if callable(switch):
            switch(on)

    def _tokens(self) -> dict[str, int]:
        counts = getattr(self._seam, "step_token_counts", None)
        return dict(counts) if counts is not None else {}

    def step(self, run):  # noqa: ANN001, ANN201
        """Run one step (`run()`), inside the profile while one is armed or running."""
        if self._armed is None and self._profile is None:
            return run()
        started, cpu = time.perf_counter(), time.thread_time()
        import torch
        from torch.profiler import ProfilerActivity, profile, record_function

        from alignatt.serve.step_anatomy import STEP_RANGE

        if self._profile is None:
            activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
            self._profile = profile(activities=activities, record_shapes=False)
            self._profile.__enter__()
            self._host_scopes(True)
            self._left = self._armed[1]
            self._tokens_before = self._tokens()
        self._overhead(started, cpu)
        with record_function(STEP_RANGE):
            result = run()
        self._left -= 1
        if self._left <= 0:
            self._write()
        return result

    def _write(self) -> None:
        import json
        import tempfile

        import torch

        from alignatt.serve.step_anatomy import anatomy, device_peaks

        started, cpu = time.perf_counter(), time.thread_time()  # the engine does not step meanwhile
        prof, (path, _), self._profile, self._armed = self._profile, self._armed, None, None
        self._host_scopes(False)
        prof.__exit__(None, None, None)
        after = self._tokens()
        tokens = {k: after[k] - self._tokens_before.get(k, 0) for k in after}
        with tempfile.TemporaryDirectory() as tmp:
            trace = Path(tmp) / "trace.json"
            prof.export_chrome_trace(str(trace))
            events = json.loads(trace.read_text()).get("traceEvents", [])
        weights = getattr(self._seam, "weight_bytes", None)
        weights = weights() if callable(weights) else {}
        name = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
        bandwidth, tflops = device_peaks(name)
        result = anatomy(events, tokens, weights.get("streamed"), bandwidth, tflops, weights.get("active_params"))
        result["device"] = name
        result["weights"] = weights
        result["write_s"] = round(time.perf_counter() - started, 3)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp_path = path.with_name(path.name + ".tmp")
        tmp_path.write_text(json.dumps(result, indent=1))
        tmp_path.replace(path)
        self._overhead(started, cpu)

    def _overhead(self, started: float, cpu: float) -> None:
        wall, cpu_s = self.overhead_s
        self.overhead_s = (wall + time.perf_counter() - started, cpu_s + time.thread_time() - cpu)
