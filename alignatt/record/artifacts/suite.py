"""The GPU suite's artifact (`alignatt test-gpu`), and which measurements must stand on it."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

from alignatt.record.artifacts.base import FingerprintArtifact, _Artifact, _Strict


class GpuTestCase(_Strict):
    nodeid: str  # as pytest names it: tests/gpu/test_x.py::test_y[param]
    outcome: Literal["passed", "failed", "error", "skipped"]
    duration_s: float  # setup + call + teardown
    message: str = ""  # a skip's reason, a failure's or an error's first line


class GpuTestsArtifact(_Artifact):
    """`alignatt test-gpu`: the GPU suite run whole in one command, every test's outcome and time.

    A GPU figure measured at a commit is honest only when this artifact says the suite passed at
    that commit: the audit compares the two, and the page names the commit and its date."""

    kind: Literal["gpu_tests"] = "gpu_tests"
    ran: bool  # False where the profile has no GPU (the reason says so); nothing was measured then
    reason: str = ""
    command: list[str]
    exit_code: int | None
    wall_s: float
    counts: dict[str, int]  # passed, failed, error, skipped
    tests: list[GpuTestCase]
    passed: bool  # it ran, nothing failed or errored, and at least one test passed
    lanes: int = 1  # test children run side by side (tests/gpu_isolation.py)


def measured_on_gpu(artifact: BaseModel) -> bool:
    """A measurement made on a GPU, which must stand on its folder's passing GPU suite (the suite
    itself and the fingerprint measure nothing). The audit and the page both ask this."""
    return not isinstance(artifact, (GpuTestsArtifact, FingerprintArtifact)) and artifact.provenance.gpu_count > 0
