"""The GPU suite's isolation (tests/gpu_isolation.py), on CPU: a stand-in `torch` says CUDA is
there and a stand-in `nvidia-smi` reports the device's memory, so the parent really spawns a
child per GPU test and really checks the memory after it."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

TESTS = '''
import os
from pathlib import Path

import pytest

gpu = pytest.mark.gpu


@gpu
def test_runs_in_a_child():
    assert os.environ.get("ALIGNATT_GPU_TEST_CHILD")


@gpu
def test_skips_with_its_reason():
    pytest.skip("no vLLM in this child")


@gpu
def test_fails_with_its_text():
    assert 1 + 1 == 3, "arithmetic broke in the child"


@gpu
def test_leaves_memory_held():
    Path(os.environ["FAKE_GPU_USED"]).write_text("9000")  # as if an engine outlived its test


def test_not_gpu_runs_in_the_parent():
    assert not os.environ.get("ALIGNATT_GPU_TEST_CHILD")
'''


def _project(tmp_path: Path, tests: str, **extra_env: str) -> tuple[Path, dict]:
    """A project with the plugin, a stand-in `torch` that says CUDA is there and a stand-in
    `nvidia-smi` whose used memory is a file's content."""
    fake = tmp_path / "fake"
    (fake / "torch").mkdir(parents=True)
    (fake / "torch" / "__init__.py").write_text("class cuda:\n    is_available = staticmethod(lambda: True)\n")
    used = tmp_path / "used_mib"
    used.write_text("500")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text(f'#!/bin/sh\ncase "$1" in --query-gpu*) cat {used};; *) echo "123, python, 8500 MiB";; esac\n')
    smi.chmod(0o755)
    project = tmp_path / "project"
    project.mkdir()
    (project / "pytest.ini").write_text("[pytest]\nmarkers =\n    gpu: needs CUDA\n")
    (project / "conftest.py").write_text('pytest_plugins = ["tests.gpu_isolation"]\n')
    (project / "test_suite.py").write_text(textwrap.dedent(tests))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(fake), str(ROOT)]), FAKE_GPU_USED=str(used),
               PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", ALIGNATT_GPU_MEMORY_SETTLE_S="0.5", **extra_env)
    for name in ("ALIGNATT_GPU_TEST_CHILD", "ALIGNATT_VLLM_GPU_MEMORY_SHARE"):
        env.pop(name, None)
    return project, env


def _run(project: Path, env: dict, junit: Path) -> tuple[subprocess.CompletedProcess, dict]:
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}"],
                          cwd=project, env=env, capture_output=True, text=True, timeout=300)
    return done, {c.get("name"): c for c in ET.parse(junit).getroot().iter("testcase")}


def test_each_gpu_test_runs_in_a_child_and_a_leak_is_an_error(tmp_path):
    project, env = _project(tmp_path, TESTS)
    done, cases = _run(project, env, tmp_path / "junit.xml")
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    assert set(cases) == {"test_runs_in_a_child", "test_skips_with_its_reason", "test_fails_with_its_text",
                          "test_leaves_memory_held", "test_not_gpu_runs_in_the_parent"}
    outcome = {name: [child.tag for child in case] for name, case in cases.items()}
    assert outcome["test_runs_in_a_child"] == [] and outcome["test_not_gpu_runs_in_the_parent"] == []
    assert cases["test_skips_with_its_reason"].find("skipped").get("message").endswith("no vLLM in this child")
    assert "arithmetic broke in the child" in cases["test_fails_with_its_text"].find("failure").get("message")
    leak = cases["test_leaves_memory_held"].find("error")
    assert leak is not None and "GPU memory still held after test_suite.py::test_leaves_memory_held" in leak.get("message")
    assert "8500 MiB" in leak.text  # the holders are named
    assert "1 failed, 3 passed, 1 skipped, 1 error" in out


# Two tests that each wait for the other to start: they pass only when they run at the same time
# (one lane would time out the first). A gpu_module's tests share one child: the same process.
LANE_TESTS = '''
import os
import time
from pathlib import Path

import pytest

gpu = pytest.mark.gpu
HERE = Path(os.environ["FAKE_GPU_USED"]).parent


def meet(me, other):
    (HERE / me).write_text(os.environ.get("ALIGNATT_VLLM_GPU_MEMORY_SHARE", "unset"))
    deadline = time.monotonic() + 30
    while not (HERE / other).exists():
        assert time.monotonic() < deadline, f"{other} never ran beside {me}"
        time.sleep(0.05)


@gpu
def test_left():
    meet("left", "right")


@gpu
def test_right():
    meet("right", "left")


@gpu
@pytest.mark.gpu_module
class TestShared:
    pids = []

    def test_first(self):
        TestShared.pids.append(os.getpid())

    def test_second(self):
        assert TestShared.pids == [os.getpid()]  # the same child as test_first


@gpu
def test_ends_with_memory_held():
    time.sleep(1.0)
    Path(os.environ["FAKE_GPU_USED"]).write_text("9000")
'''


def test_lanes_run_children_side_by_side_and_the_last_test_checks_the_memory(tmp_path):
    project, env = _project(tmp_path, LANE_TESTS, ALIGNATT_GPU_LANES="3")
    done, cases = _run(project, env, tmp_path / "junit.xml")
    out = done.stdout + done.stderr
    outcome = {name: [child.tag for child in case] for name, case in cases.items()}
    assert outcome["test_left"] == outcome["test_right"] == [], out
    assert outcome["test_first"] == outcome["test_second"] == [], out
    assert (tmp_path / "left").read_text() == "0.300"  # each engine asks vLLM's start-up check for 0.9 / 3
    leak = cases["test_ends_with_memory_held"].find("error")
    assert leak is not None and "after all 4 GPU units (3 lanes)" in leak.get("message"), out
    assert done.returncode == 1


def test_one_lane_runs_a_test_that_waits_for_another_alone(tmp_path):
    """The control: with one lane the two meeting tests cannot both pass."""
    project, env = _project(tmp_path, LANE_TESTS.replace("time.monotonic() + 30", "time.monotonic() + 2"))
    done, cases = _run(project, env, tmp_path / "junit.xml")
    assert cases["test_left"].find("failure") is not None and "never ran beside" in done.stdout
    assert (tmp_path / "left").read_text() == "unset"


def test_units_start_longest_first_by_the_earlier_run():
    from tests.gpu_isolation import longest_first

    units = {"a.py::t": ["a.py::t"], "m.py": ["m.py::x", "m.py::y"], "b.py::t": ["b.py::t"]}
    assert longest_first(units, {"a.py::t": 5.0, "m.py::x": 4.0, "m.py::y": 3.0}) == ["m.py", "a.py::t", "b.py::t"]
    assert longest_first(units, {}) == list(units)  # nothing known: the collection order


def test_the_plugin_and_the_engine_name_the_same_memory_share_variable():
    from alignatt.capture.names import GPU_MEMORY_SHARE_ENV
    from tests.gpu_isolation import MEMORY_SHARE_ENV

    assert MEMORY_SHARE_ENV == GPU_MEMORY_SHARE_ENV
