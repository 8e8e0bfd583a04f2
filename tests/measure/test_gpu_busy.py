"""How busy the GPU was over a load level, read from a streaming reader; stand-in readers on CPU."""

from __future__ import annotations

import sys
import time

import pytest

from alignatt.measure.gpu_busy import GpuBusy, nvidia_smi_command, route_gpu


def _reader(lines: list[str], then_sleep_s: float = 30.0) -> list[str]:
    """A process that prints `lines` at once, then stays up as `nvidia-smi --loop-ms` does."""
    script = f"import sys, time\nsys.stdout.write({''.join(l + chr(10) for l in lines)!r})\nsys.stdout.flush()\n" \
             f"time.sleep({then_sleep_s})\n"
    return [sys.executable, "-c", script]


def _wait_for(busy: GpuBusy, n: int) -> None:
    deadline = time.monotonic() + 20
    while len(busy.samples) < n and time.monotonic() < deadline:
        time.sleep(0.02)


def test_the_share_is_the_mean_of_the_samples_and_the_reader_is_stopped_on_exit():
    with GpuBusy(command=_reader(["50", "100", "0", "70"])) as busy:
        _wait_for(busy, 4)
        process = busy._process
    assert busy.samples == [50.0, 100.0, 0.0, 70.0]
    assert busy.share() == pytest.approx(0.55)
    assert process is not None and process.poll() is not None  # a still-running reader was terminated


def test_lines_that_are_not_a_percentage_are_skipped():
    with GpuBusy(command=_reader(["[N/A]", "40", "", "warning: x", "140", "-3", "60"])) as busy:
        _wait_for(busy, 2)
    assert busy.samples == [40.0, 60.0]
    assert busy.share() == pytest.approx(0.5)


def test_without_a_reader_nothing_is_sampled():
    with GpuBusy(command=["alignatt-no-such-reader", "--loop"]) as busy:
        pass
    assert busy.samples == [] and busy.share() is None


def test_a_reader_that_exits_at_once_gives_no_share():
    with GpuBusy(command=[sys.executable, "-c", "pass"]) as busy:
        time.sleep(0.2)
    assert busy.share() is None


def test_the_default_reader_streams_the_routes_gpu():
    assert route_gpu("cuda") == 0 and route_gpu("cuda:3") == 3 and route_gpu("cpu") is None
    command = nvidia_smi_command(route_gpu("cuda:1"))
    assert command[0] == "nvidia-smi" and "--id=1" in command and "--query-gpu=utilization.gpu" in command
    assert GpuBusy(gpu=2).command == nvidia_smi_command(2)
