"""How busy the GPU was over a load level: NVIDIA's utilization counter (the share of each sample
period in which a kernel ran), read from one `nvidia-smi` process that streams it.

One long-lived reader rather than a query per sample: the engine it watches is host-bound
(docs/batching.md), and a process started every 200 ms would take CPU from it. Without
`nvidia-smi` (CPU hosts) nothing is sampled and the share is None.
"""

from __future__ import annotations

import subprocess
import threading
from typing import Optional, Sequence

PERIOD_MS = 200


def nvidia_smi_command(gpu: int, period_ms: int = PERIOD_MS) -> list[str]:
    """`nvidia-smi` printing one GPU's utilization (percent, a bare number) every `period_ms`."""
    return ["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits",
            f"--loop-ms={period_ms}", f"--id={gpu}"]


class GpuBusy:
    """A context: samples the GPU's utilization while it is open; `share()` after it closed.

    `command` is the reader (any process that prints one percentage per line); by default
    `nvidia_smi_command(gpu)`. Lines that are not numbers (`[N/A]`, warnings) are skipped."""

    def __init__(self, gpu: int = 0, command: Optional[Sequence[str]] = None) -> None:
        self.command = list(command) if command is not None else nvidia_smi_command(gpu)
        self.samples: list[float] = []
        self._process: Optional[subprocess.Popen] = None
        self._reader: Optional[threading.Thread] = None

    def __enter__(self) -> "GpuBusy":
        try:
            self._process = subprocess.Popen(self.command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                             text=True)
        except OSError:
            return self  # no such reader here (a CPU host), or not runnable: nothing sampled
        self._reader = threading.Thread(target=self._read, name="gpu-busy", daemon=True)
        self._reader.start()
        return self

    def _read(self) -> None:
        assert self._process is not None and self._process.stdout is not None
        for line in self._process.stdout:
            try:
                value = float(line.strip())
            except ValueError:
                continue
            if 0.0 <= value <= 100.0:
                self.samples.append(value)

    def __exit__(self, *exc) -> None:
        if self._process is None:
            return
        if self._process.poll() is None:
            self._process.terminate()
        try:
            self._process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        if self._reader is not None:
            self._reader.join(timeout=5)

    def share(self) -> Optional[float]:
        """The mean utilization over the samples, as a fraction (None: nothing sampled)."""
        if not self.samples:
            return None
        return round(sum(self.samples) / len(self.samples) / 100.0, 4)


def route_gpu(device: str) -> Optional[int]:
    """The GPU index a route's device names (`cuda` is the first one); None for a CPU route."""
    kind, _, index = device.partition(":")
    if kind != "cuda":
        return None
    return int(index) if index else 0
