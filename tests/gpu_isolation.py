"""GPU tests in one command: each GPU test runs in a child pytest process, and none may leave
GPU memory held behind it.

vLLM does not free all of an engine's memory when the engine object goes away, and `load_model`
keeps a loaded model for the life of its process; one test's leftovers then break the next
test's engine start ("Free memory on device ... is less than desired GPU memory utilization").
So, where CUDA is available, every `gpu` test runs in a fresh `python -m pytest NODEID` child
(its setup, call and teardown), and the parent replays the child's reports as its own: outcomes,
durations, skip reasons and failure texts are the child's. Tests marked `gpu_workers` start
their engines in worker processes of their own and share results across a module, so they run
in the parent.

After every GPU test the parent checks the device: its used memory must return to within
`GPU_MEMORY_SLACK_MIB` of what it was before the first GPU test. If not, that test gets an error
naming the processes that still hold memory, so a leak fails where it happens, loudly.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

CHILD_ENV = "ALIGNATT_GPU_TEST_CHILD"  # set in the child: run the test here, do not re-spawn
GPU_MEMORY_SLACK_MIB = 1024  # the driver's own bookkeeping moves by tens of MiB; an engine holds GiBs
# a child's exit frees its memory within a second or two; the wait before a leak is called one
MEMORY_SETTLE_S = float(os.environ.get("ALIGNATT_GPU_MEMORY_SETTLE_S", "20"))
CHILD_TIMEOUT_S = 1800.0  # the slowest GPU test (the eval, two engines) takes a few minutes
ROOT = Path(__file__).resolve().parents[1]

_baseline: dict[str, int | None] = {}
_config: list[pytest.Config] = []


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu_workers: a GPU test whose engines run in worker processes of its own")
    _config.append(config)


def gpu_memory_used_mib() -> int | None:
    """Used memory of GPU 0 from nvidia-smi (None where there is none): no CUDA context is made here."""
    try:
        done = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", "0"],
                              capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    try:
        return int(done.stdout.strip().splitlines()[0])
    except (IndexError, ValueError):
        return None


def gpu_holders() -> str:
    try:
        done = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,process_name,used_memory", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=30)
        return done.stdout.strip() or "(nvidia-smi lists no compute process)"
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"(nvidia-smi failed: {e})"


def memory_leak_message(nodeid: str) -> str | None:
    """None when the device's memory is back to its baseline, else what still holds it."""
    base = _baseline.get("mib")
    if base is None:
        return None
    deadline = time.monotonic() + MEMORY_SETTLE_S
    used = gpu_memory_used_mib()
    while used is not None and used > base + GPU_MEMORY_SLACK_MIB and time.monotonic() < deadline:
        time.sleep(1.0)
        used = gpu_memory_used_mib()
    if used is None or used <= base + GPU_MEMORY_SLACK_MIB:
        return None
    return (f"GPU memory still held after {nodeid}: {used} MiB used, {base} MiB before the first GPU test "
            f"(slack {GPU_MEMORY_SLACK_MIB} MiB). Holders:\n{gpu_holders()}")


def _is_gpu(item: pytest.Item) -> bool:
    return item.get_closest_marker("gpu") is not None


def _cuda_here() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except ImportError:
        return False


def _run_child(item: pytest.Item) -> list[dict]:
    """The child's serialized reports of `item` (setup, call, teardown)."""
    with tempfile.TemporaryDirectory(prefix="alignatt-gpu-test-") as tmp:
        reports = Path(tmp) / "reports.jsonl"
        env = dict(os.environ, **{CHILD_ENV: str(reports)})
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
        cmd = [sys.executable, "-m", "pytest", item.nodeid, "-q", "-p", "no:cacheprovider"]
        try:  # the child runs from the parent's rootdir, where the node id means the same test
            done = subprocess.run(cmd, cwd=item.config.rootpath, env=env, capture_output=True, text=True,
                                  timeout=CHILD_TIMEOUT_S)
            code, out, err = done.returncode, done.stdout, done.stderr
        except subprocess.TimeoutExpired as e:
            code, out, err = f"nothing: killed after {CHILD_TIMEOUT_S:.0f} s", str(e.stdout or ""), str(e.stderr or "")
        found = [json.loads(line) for line in reports.read_text().splitlines()] if reports.exists() else []
        if not found:  # the child died before reporting (a crash, a kill): say so with its output
            found = [{"$report_type": "TestReport", "nodeid": item.nodeid, "location": list(item.location),
                      "keywords": {}, "outcome": "failed", "when": "call", "sections": [], "duration": 0.0,
                      "user_properties": [],
                      "longrepr": f"the child pytest process exited {code} without reporting:\n"
                                  f"{out[-6000:]}\n{err[-6000:]}"}]
        return found


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem):
    if os.environ.get(CHILD_ENV) or not _is_gpu(item) or not _cuda_here():
        return None  # the default protocol (skips without CUDA stay ordinary skips)
    if "mib" not in _baseline:
        _baseline["mib"] = gpu_memory_used_mib()
    if item.get_closest_marker("gpu_workers") is not None:
        return None  # its engines are in worker processes; the fixture below checks the memory
    hook = item.ihook
    hook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
    for data in _run_child(item):
        report = item.config.hook.pytest_report_from_serializable(config=item.config, data=data)
        if isinstance(report.longrepr, list):  # a skip's (path, line, reason): JSON made the tuple a list
            report.longrepr = tuple(report.longrepr)
        hook.pytest_runtest_logreport(report=report)
    leak = memory_leak_message(item.nodeid)
    if leak:
        hook.pytest_runtest_logreport(report=pytest.TestReport(
            item.nodeid, item.location, {}, "failed", leak, "teardown", [], 0.0))
    hook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
    return True


@pytest.fixture(autouse=True)
def _gpu_memory_returned(request):
    """For GPU tests that run in this process (`gpu_workers`): the same check as for a child."""
    yield
    if os.environ.get(CHILD_ENV) or not _is_gpu(request.node) or "mib" not in _baseline:
        return
    leak = memory_leak_message(request.node.nodeid)
    if leak:
        pytest.fail(leak, pytrace=False)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """In the child: hand every report of the test to the parent, serialized the way xdist does."""
    path = os.environ.get(CHILD_ENV)
    if path and _config:
        data = _config[0].hook.pytest_report_to_serializable(config=_config[0], report=report)
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(data) + "\n")
