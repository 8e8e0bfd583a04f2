"""`alignatt test-gpu` (and `make test-gpu`, the `gpu-tests` stage): the GPU suite in one command.

It runs `python -m pytest -m gpu tests` with the interpreter that runs alignatt (so a console
script that names another Python cannot pick the wrong packages), where every GPU test gets a
child process of its own, `lanes` of them at a time, and must leave no GPU memory behind
(tests/gpu_isolation.py). pytest's
JUnit report becomes a `gpu_tests` artifact: every test id, its outcome, its duration and a
skip's reason. The verdict file is what the measuring stages depend on: byte-identical while the
suite keeps passing, so a re-run suite does not force the benchmarks to re-run, and absent when
it fails, so no benchmark of the h200 profile runs on code whose GPU tests failed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

from alignatt.core.errors import AlignattError
from alignatt.record.artifacts import ARTIFACT_SCHEMA_VERSION, GpuTestCase, GpuTestsArtifact, write_artifact

OUTCOMES = ("passed", "failed", "error", "skipped")


def repo_root() -> Path:
    """The checkout whose tests/ the suite runs (an editable install: the package's parent)."""
    root = Path(__file__).resolve().parents[2]
    if not (root / "tests" / "gpu_isolation.py").exists():
        raise AlignattError(f"no test suite beside the installed package ({root / 'tests'}): "
                            "run the GPU suite from a checkout (pip install -e .)")
    return root


def _nodeid(case: ET.Element) -> str:
    """pytest's node id from a JUnit (xunit1) test case: file, then class if any, then name."""
    file, classname, name = case.get("file", ""), case.get("classname", ""), case.get("name", "")
    module = file[:-3].replace("/", ".") if file.endswith(".py") else ""
    cls = classname[len(module) + 1:] if module and classname.startswith(module + ".") else ""
    return "::".join(p for p in (file or classname, cls, name) if p)


def _first_line(text: str | None) -> str:
    line = (text or "").strip().splitlines()
    return line[0][:500] if line else ""


def _reason(element: ET.Element) -> str:
    """A failure's one line: its message's first line, or, where that only opens a dumped
    structure ("AssertionError: {"), the failing statement from the traceback as well."""
    first = _first_line(element.get("message") or element.text)
    if first.endswith(("{", "[", "(")):
        failing = [ln[1:].strip() for ln in (element.text or "").splitlines() if ln.startswith(">")]
        if failing:
            return f"{first.split(':')[0]} at `{failing[-1][:300]}`"
    return first


def parse_junit(path: Path) -> list[GpuTestCase]:
    """Every test case of a pytest JUnit report; a teardown error after a pass counts as an error."""
    cases = []
    for case in ET.parse(path).getroot().iter("testcase"):
        tags = {child.tag: child for child in case}
        outcome, message = "passed", ""
        for tag, name in (("error", "error"), ("failure", "failed"), ("skipped", "skipped")):
            if tag in tags:
                outcome, message = name, _reason(tags[tag])
                break
        cases.append(GpuTestCase(nodeid=_nodeid(case), outcome=outcome, duration_s=round(float(case.get("time") or 0), 3),
                                 message=message))
    return cases


def counts_of(tests: list[GpuTestCase]) -> dict[str, int]:
    return {o: sum(t.outcome == o for t in tests) for o in OUTCOMES}


def not_run(reason: str) -> GpuTestsArtifact:
    from alignatt.record.provenance import collect_provenance

    return GpuTestsArtifact(schema_version=ARTIFACT_SCHEMA_VERSION, provenance=collect_provenance(), ran=False,
                            reason=reason, command=[], exit_code=None, wall_s=0.0, counts=counts_of([]), tests=[],
                            passed=False)


LANES_ENV, DURATIONS_ENV = "ALIGNATT_GPU_LANES", "ALIGNATT_GPU_DURATIONS"  # read by tests/gpu_isolation.py


def run_gpu_suite(pytest_args: list[str] | None = None, lanes: int = 1,
                  earlier: Path | None = None) -> GpuTestsArtifact:
    """Run every GPU test in one pytest session here, `lanes` test children at a time (longest
    first by the durations in `earlier`, a gpu_tests artifact); its artifact (passed or not)."""
    from alignatt.record.provenance import collect_provenance

    if lanes < 1:
        raise AlignattError(f"the GPU suite needs at least one lane, not {lanes}")
    root = repo_root()
    env = dict(os.environ, **{LANES_ENV: str(lanes)})
    if earlier is not None and earlier.exists():
        env[DURATIONS_ENV] = str(earlier.resolve())
    with tempfile.TemporaryDirectory(prefix="alignatt-gpu-suite-") as tmp:
        junit = Path(tmp) / "junit.xml"
        # -v: a suite of twenty minutes names each test as it ends, so a watcher sees where it is
        command = [sys.executable, "-m", "pytest", "-m", "gpu", "tests", "-v", "-rs", "--durations=0", "-p", "no:cacheprovider",
                   "-o", "junit_family=xunit1", *(pytest_args or [])]
        start = time.monotonic()
        code = subprocess.run([*command, f"--junitxml={junit}"], cwd=root, env=env).returncode
        wall = time.monotonic() - start
        tests = parse_junit(junit) if junit.exists() else []
    counts = counts_of(tests)
    passed = code == 0 and counts["passed"] > 0 and not counts["failed"] and not counts["error"]
    reason = "" if passed else ("no GPU test passed: is CUDA visible here?" if code == 0 else f"pytest exited {code}")
    return GpuTestsArtifact(schema_version=ARTIFACT_SCHEMA_VERSION, provenance=collect_provenance(), ran=True,
                            reason=reason, command=["python", *command[1:]], exit_code=code, wall_s=round(wall, 1),
                            counts=counts, tests=tests, passed=passed, lanes=lanes)


def verdict_json(artifact: GpuTestsArtifact, profile: str) -> str:
    """The stable part: what the measuring stages need to know, with nothing that changes per run."""
    state = "passed" if artifact.passed else ("not run" if not artifact.ran else "failed")
    return json.dumps({"profile": profile, "gpu_suite": state, "reason": artifact.reason if not artifact.ran else ""},
                      indent=1) + "\n"


def record_gpu_suite(out: Path, verdict: Path | None, profile: str | None, device: str | None,
                     pytest_args: list[str] | None = None, lanes: int = 1) -> GpuTestsArtifact:
    """Run (or, on a profile without a GPU, record that it did not run) and write both files."""
    if verdict is not None and verdict.exists():
        verdict.unlink()  # a failed suite leaves no verdict for a measuring stage to stand on
    if device is not None and not device.startswith("cuda"):
        artifact = not_run(f"profile {profile} runs on {device}: its GPU suite runs on a CUDA profile")
    else:
        artifact = run_gpu_suite(pytest_args, lanes, earlier=out)  # the last run's durations order this one
    write_artifact(out, artifact)
    if verdict is not None and (artifact.passed or not artifact.ran):
        verdict.parent.mkdir(parents=True, exist_ok=True)
        verdict.write_text(verdict_json(artifact, profile or "none"), encoding="utf-8")
    return artifact


def summary_line(a: GpuTestsArtifact) -> str:
    if not a.ran:
        return f"GPU suite not run: {a.reason}"
    c = a.counts
    state = "passed" if a.passed else f"FAILED ({a.reason})"
    return (f"GPU suite {state}: {c['passed']} passed, {c['failed']} failed, {c['error']} errors, "
            f"{c['skipped']} skipped in {a.wall_s:.0f} s ({a.lanes} lanes) at {a.provenance.git_commit or 'an unknown commit'}")
