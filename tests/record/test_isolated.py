"""A pipeline step in a child process of its own: its JSON result comes back, and a failing or
misnamed step fails loudly, without a result."""

import pytest

from alignatt.core.errors import AlignattError
from alignatt.record.isolated import run_in_child


def doubled(payload: dict) -> dict:
    import os

    return {"value": payload["value"] * 2, "pid": os.getpid()}


def fails(payload: dict) -> dict:
    raise RuntimeError("the engine did not start")


def test_the_step_runs_in_another_process_and_its_result_comes_back():
    import os

    got = run_in_child("tests.record.test_isolated:doubled", {"value": 21}, "doubling")
    assert got["value"] == 42 and got["pid"] != os.getpid()


def test_a_failing_step_raises_with_its_name_exit_code_and_cause():
    # The cause travels in the error itself: the artifact that records the failure keeps it.
    with pytest.raises(AlignattError, match=r"load \(cudagraph\) failed in its own process \(exit 1.*"
                                            r"RuntimeError: the engine did not start$"):
        run_in_child("tests.record.test_isolated:fails", {}, "load (cudagraph)")


def test_a_misnamed_step_fails_before_a_child_starts():
    with pytest.raises(AlignattError, match="no such function"):
        run_in_child("tests.record.test_isolated:absent", {}, "x")
    with pytest.raises(AlignattError, match="MODULE:FUNCTION"):
        run_in_child("tests.record.test_isolated", {}, "x")
