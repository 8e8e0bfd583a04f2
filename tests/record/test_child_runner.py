"""The one child-process launcher (record/isolated.run_module) that the bench, the GPU checks and
run_in_child share: exit codes, the kept stderr tail, the timeout kill."""

from __future__ import annotations

import pytest

from alignatt.record.isolated import run_module


def test_the_tail_keeps_the_last_stderr_lines_and_the_exit_code():
    done = run_module("alignatt.record.isolated", keep=2)  # no arguments: usage on stderr, exit 2
    assert done.code == 2 and not done.timed_out
    assert done.tail and "usage: python -m alignatt.record.isolated" in done.tail[-1]


def test_a_child_past_its_timeout_is_killed_and_says_so():
    done = run_module("http.server", "0", "--bind", "127.0.0.1", timeout_s=1.0, stdout=False)
    assert done.timed_out and done.code is None


def test_a_timeout_with_a_piped_tail_is_refused():
    with pytest.raises(ValueError, match="timeout needs keep=0"):
        run_module("alignatt.record.isolated", keep=2, timeout_s=1.0)
