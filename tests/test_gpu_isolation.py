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


def test_each_gpu_test_runs_in_a_child_and_a_leak_is_an_error(tmp_path):
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
    (project / "test_suite.py").write_text(textwrap.dedent(TESTS))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(fake), str(ROOT)]), FAKE_GPU_USED=str(used),
               PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", ALIGNATT_GPU_MEMORY_SETTLE_S="0.5")
    env.pop("ALIGNATT_GPU_TEST_CHILD", None)
    junit = tmp_path / "junit.xml"
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}"],
                          cwd=project, env=env, capture_output=True, text=True, timeout=300)
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    cases = {c.get("name"): c for c in ET.parse(junit).getroot().iter("testcase")}
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
