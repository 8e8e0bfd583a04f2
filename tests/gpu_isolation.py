"""GPU tests in one command: each GPU test runs in a child pytest process, children run side by
side in lanes, and none may leave GPU memory held behind it.

vLLM does not free all of an engine's memory when the engine object goes away, and `load_model`
keeps a loaded model for the life of its process; one test's leftovers then break the next
test's engine start ("Free memory on device ... is less than desired GPU memory utilization").
So, where CUDA is available, every `gpu` test runs in a fresh `python -m pytest NODEID` child
(its setup, call and teardown), and the parent replays the child's reports as its own: outcomes,
durations, skip reasons and failure texts are the child's. A module marked `gpu_module` shares
its engines' results between its tests (a module-level cache): its GPU tests form one unit and
run together in one child.

Lanes (`ALIGNATT_GPU_LANES`, default 1): with N > 1, N children run at once, longest first by the
durations of an earlier run (`ALIGNATT_GPU_DURATIONS`, a gpu_tests artifact), and each child's vLLM
engines ask vLLM's start-up check for 0.9/N of the device between them (`ALIGNATT_VLLM_GPU_MEMORY_SHARE`;
the engines set their KV cache size themselves, so the share only gates the start). Engine
starts are CPU-bound (graph capture, torch.compile), so lanes cut the suite's wall time.

Memory: with one lane, after every unit the device's used memory must return to within
`GPU_MEMORY_SLACK_MIB` of what it was before the first GPU test, else that unit's last test gets
an error naming the processes that still hold memory. With lanes, the same check runs once all
children have ended (a child's exit frees its own memory; what can leak is a process that
outlives it, such as an orphaned engine core), on the last GPU test.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

CHILD_ENV = "ALIGNATT_GPU_TEST_CHILD"  # set in the child: run the tests here, do not re-spawn
LANES_ENV = "ALIGNATT_GPU_LANES"
DURATIONS_ENV = "ALIGNATT_GPU_DURATIONS"
MEMORY_SHARE_ENV = "ALIGNATT_VLLM_GPU_MEMORY_SHARE"  # read by alignatt.capture.vllm.engine
GPU_MEMORY_SHARED = 0.9  # of the device, split between the lanes' engines
GPU_MEMORY_SLACK_MIB = 1024  # the driver's own bookkeeping moves by tens of MiB; an engine holds GiBs
# a child's exit frees its memory within a second or two; the wait before a leak is called one
MEMORY_SETTLE_S = float(os.environ.get("ALIGNATT_GPU_MEMORY_SETTLE_S", "20"))
CHILD_TIMEOUT_S = 1800.0  # the slowest unit (a module's shared engines) takes a few minutes
ROOT = Path(__file__).resolve().parents[1]

_baseline: dict[str, int | None] = {}
_config: list[pytest.Config] = []


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu_module: the module's GPU tests share engines and run in one child")
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


def memory_leak_message(after: str) -> str | None:
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
    return (f"GPU memory still held after {after}: {used} MiB used, {base} MiB before the first GPU test "
            f"(slack {GPU_MEMORY_SLACK_MIB} MiB). Holders:\n{gpu_holders()}")


def lanes() -> int:
    try:
        return max(1, int(os.environ.get(LANES_ENV, "1")))
    except ValueError:
        raise pytest.UsageError(f"{LANES_ENV} must be a whole number, not {os.environ[LANES_ENV]!r}") from None


def earlier_durations() -> dict[str, float]:
    """Test id -> seconds, from an earlier run's gpu_tests artifact (empty when there is none)."""
    path = os.environ.get(DURATIONS_ENV)
    try:
        tests = json.loads(Path(path).read_text(encoding="utf-8")).get("tests", []) if path else []
        return {t["nodeid"]: float(t.get("duration_s") or 0.0) for t in tests}
    except (OSError, ValueError, TypeError, KeyError):
        return {}


def _is_gpu(item: pytest.Item) -> bool:
    return item.get_closest_marker("gpu") is not None


def _cuda_here() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except ImportError:
        return False


def _unit_key(item: pytest.Item) -> str:
    return item.nodeid.split("::")[0] if item.get_closest_marker("gpu_module") else item.nodeid


def _child_failure(nodeid: str, location, code, out: str, err: str) -> dict:
    return {"$report_type": "TestReport", "nodeid": nodeid, "location": list(location), "keywords": {},
            "outcome": "failed", "when": "call", "sections": [], "duration": 0.0, "user_properties": [],
            "longrepr": f"the child pytest process exited {code} without reporting:\n{out[-6000:]}\n{err[-6000:]}"}


def _run_child(items: list[pytest.Item], share: float | None) -> dict[str, list[dict]]:
    """Node id -> the child's serialized reports (setup, call, teardown) of each of `items`."""
    with tempfile.TemporaryDirectory(prefix="alignatt-gpu-test-") as tmp:
        reports = Path(tmp) / "reports.jsonl"
        env = dict(os.environ, **{CHILD_ENV: str(reports)})
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
        if share is not None:
            env[MEMORY_SHARE_ENV] = f"{share:.3f}"
        cmd = [sys.executable, "-m", "pytest", *[i.nodeid for i in items], "-q", "-p", "no:cacheprovider"]
        try:  # the child runs from the parent's rootdir, where the node ids mean the same tests
            done = subprocess.run(cmd, cwd=items[0].config.rootpath, env=env, capture_output=True, text=True,
                                  timeout=CHILD_TIMEOUT_S)
            code, out, err = done.returncode, done.stdout, done.stderr
        except subprocess.TimeoutExpired as e:
            code, out, err = f"nothing: killed after {CHILD_TIMEOUT_S:.0f} s", str(e.stdout or ""), str(e.stderr or "")
        except OSError as e:  # it could not start: every test of the unit fails with the reason
            code, out, err = f"nothing: it did not start ({e})", "", ""
        found: dict[str, list[dict]] = {}
        lines = reports.read_text().splitlines() if reports.exists() else []
        for data in map(json.loads, lines):
            found.setdefault(data["nodeid"], []).append(data)
        for item in items:  # a test the child never reported (a crash, a kill): say so with its output
            if item.nodeid not in found:
                found[item.nodeid] = [_child_failure(item.nodeid, item.location, code, out, err)]
        return found


def longest_first(units: dict[str, list[str]], seconds: dict[str, float]) -> list[str]:
    """Unit keys by their tests' earlier total duration, longest first (unknown: 0 s; ties keep order)."""
    return sorted(units, key=lambda k: -sum(seconds.get(nodeid, 0.0) for nodeid in units[k]))


class _Lanes:
    """The session's GPU units, run in a pool of `n` lanes, longest first; each test waits for its unit."""

    def __init__(self, items: list[pytest.Item], n: int):
        self.units: dict[str, list[pytest.Item]] = {}
        for item in items:
            self.units.setdefault(_unit_key(item), []).append(item)
        self.last_nodeid = items[-1].nodeid
        order = longest_first({k: [i.nodeid for i in v] for k, v in self.units.items()}, earlier_durations())
        self.pool = ThreadPoolExecutor(max_workers=n, thread_name_prefix="gpu-lane")
        share = round(GPU_MEMORY_SHARED / n, 3)
        self.futures: dict[str, Future] = {k: self.pool.submit(_run_child, self.units[k], share) for k in order}

    def reports(self, item: pytest.Item) -> list[dict]:
        return self.futures[_unit_key(item)].result()[item.nodeid]

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)


_state: dict[str, object] = {}


def _gpu_items(session: pytest.Session) -> list[pytest.Item]:
    return [i for i in session.items if _is_gpu(i)]


def _replay(item: pytest.Item, reports: list[dict]) -> None:
    for data in reports:
        report = item.config.hook.pytest_report_from_serializable(config=item.config, data=data)
        if isinstance(report.longrepr, list):  # a skip's (path, line, reason): JSON made the tuple a list
            report.longrepr = tuple(report.longrepr)
        item.ihook.pytest_runtest_logreport(report=report)


def _report_leak(item: pytest.Item, after: str) -> None:
    leak = memory_leak_message(after)
    if leak:
        item.ihook.pytest_runtest_logreport(report=pytest.TestReport(
            item.nodeid, item.location, {}, "failed", leak, "teardown", [], 0.0))


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem):
    if os.environ.get(CHILD_ENV) or not _is_gpu(item) or not _cuda_here():
        return None  # the default protocol (skips without CUDA stay ordinary skips)
    if "mib" not in _baseline:
        _baseline["mib"] = gpu_memory_used_mib()
    n = lanes()
    item.ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
    if n > 1:
        if "lanes" not in _state:
            _state["lanes"] = _Lanes(_gpu_items(item.session), n)
        pool: _Lanes = _state["lanes"]  # type: ignore[assignment]
        _replay(item, pool.reports(item))
        if item.nodeid == pool.last_nodeid:
            pool.close()
            _report_leak(item, f"all {len(pool.units)} GPU units ({n} lanes)")
    else:
        key = _unit_key(item)
        if _state.get("unit") != key:  # one lane: run the unit when its first test comes up
            unit = [i for i in _gpu_items(item.session) if _unit_key(i) == key]
            _state.update(unit=key, reports=_run_child(unit, None), last=unit[-1].nodeid)
        _replay(item, _state["reports"][item.nodeid])  # type: ignore[index]
        if item.nodeid == _state["last"]:
            _report_leak(item, key)
    item.ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
    return True


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """In the child: hand every report of its tests to the parent, serialized the way xdist does."""
    path = os.environ.get(CHILD_ENV)
    if path and _config:
        data = _config[0].hook.pytest_report_to_serializable(config=_config[0], report=report)
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(data) + "\n")
