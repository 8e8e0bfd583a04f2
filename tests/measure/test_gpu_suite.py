"""`alignatt test-gpu`: the GPU suite in one command, recorded as an artifact the audit and the page read."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from typer.testing import CliRunner

from alignatt.cli import app
from alignatt.record.artifacts import GpuTestCase, GpuTestsArtifact, load_artifact, measurement_artifact, write_artifact
from alignatt.report.audit import run_audit
from alignatt.measure.gpu_suite import parse_junit, record_gpu_suite

JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" errors="1" failures="1"
 skipped="1" tests="4" time="12.0">
<testcase classname="tests.gpu.test_a" name="test_ok" file="tests/gpu/test_a.py" line="3" time="4.25"/>
<testcase classname="tests.gpu.test_a" name="test_skip[vllm]" file="tests/gpu/test_a.py" line="9" time="0.01">
 <skipped type="pytest.skip" message="could not import 'omnisteval': No module named 'omnisteval'">x</skipped></testcase>
<testcase classname="tests.test_b.TestC" name="test_fails" file="tests/test_b.py" line="1" time="2.0">
 <failure message="AssertionError: assert 1 == 2&#10;more">trace</failure></testcase>
<testcase classname="tests.test_b" name="test_dump" file="tests/test_b.py" line="3" time="1.0">
 <failure message="AssertionError: {&#10;  &quot;0&quot;: 1">def test_dump():
&gt;       assert result["ok"], json.dumps(result)
E       AssertionError: {</failure></testcase>
<testcase classname="tests.test_b" name="test_leak" file="tests/test_b.py" line="5" time="5.0">
 <error message="GPU memory still held after tests/test_b.py::test_leak: 9000 MiB used">holders</error></testcase>
</testsuite></testsuites>"""


def test_the_junit_report_becomes_test_cases_with_node_ids_outcomes_and_reasons(tmp_path):
    path = tmp_path / "junit.xml"
    path.write_text(JUNIT)
    cases = {c.nodeid: c for c in parse_junit(path)}
    assert list(cases) == ["tests/gpu/test_a.py::test_ok", "tests/gpu/test_a.py::test_skip[vllm]",
                           "tests/test_b.py::TestC::test_fails", "tests/test_b.py::test_dump", "tests/test_b.py::test_leak"]
    assert [c.outcome for c in cases.values()] == ["passed", "skipped", "failed", "failed", "error"]
    assert cases["tests/test_b.py::test_dump"].message == 'AssertionError at `assert result["ok"], json.dumps(result)`'
    assert cases["tests/gpu/test_a.py::test_skip[vllm]"].message.startswith("could not import 'omnisteval'")
    assert cases["tests/test_b.py::TestC::test_fails"].message == "AssertionError: assert 1 == 2"
    assert cases["tests/gpu/test_a.py::test_ok"].duration_s == 4.25


def test_a_profile_without_cuda_records_not_run_and_a_stable_verdict(tmp_path):
    out, verdict = tmp_path / "gpu_tests.json", tmp_path / "gpu_tests_verdict.json"
    a = record_gpu_suite(out, verdict, "cpu", "cpu")
    assert isinstance(load_artifact(out), GpuTestsArtifact) and not a.ran and "runs on cpu" in a.reason
    first = verdict.read_text()
    record_gpu_suite(out, verdict, "cpu", "cpu")
    assert verdict.read_text() == first  # nothing downstream re-runs because the stage re-ran
    assert json.loads(first) == {"profile": "cpu", "gpu_suite": "not run", "reason": a.reason}


def test_the_suite_run_here_without_cuda_fails_loudly_and_leaves_no_verdict(tmp_path):
    """The real command on this CPU machine: every GPU test is collected, each skips ("needs
    CUDA"), so nothing passed; the artifact says so, exit 1, and no verdict is left behind."""
    out, verdict = tmp_path / "gpu_tests.json", tmp_path / "v.json"
    verdict.write_text("stale")
    result = CliRunner().invoke(app, ["test-gpu", "--out", str(out), "--verdict", str(verdict), "--lanes", "2",
                                      "--", "-k", "budget"])
    assert result.exit_code == 1, result.output
    a = load_artifact(out)
    assert a.ran and not a.passed and a.reason == "no GPU test passed: is CUDA visible here?"
    assert a.lanes == 2 and "(2 lanes)" in result.output
    assert a.counts["skipped"] == len(a.tests) >= 2 and all("needs CUDA" in t.message for t in a.tests)
    assert not verdict.exists()
    assert "GPU suite FAILED" in result.output


def _suite(tmp_path: Path, commit: str, passed: bool) -> GpuTestsArtifact:
    out = tmp_path / "suite.json"
    record_gpu_suite(out, None, "cpu", "cpu")
    a = load_artifact(out)
    counts = {"passed": 20, "failed": 0 if passed else 1, "error": 0, "skipped": 1}
    return a.model_copy(update={"ran": True, "passed": passed, "counts": counts, "exit_code": 0 if passed else 1,
                                "provenance": a.provenance.model_copy(update={"git_commit": commit, "git_dirty": False,
                                                                              "gpu_count": 1}),
                                "reason": "" if passed else "pytest exited 1"})


def test_the_audit_holds_gpu_figures_to_the_commit_whose_suite_passed(tmp_path):
    folder = tmp_path / "outputs" / "h200"
    folder.mkdir(parents=True)
    suite = _suite(tmp_path, "a" * 40, passed=True)
    write_artifact(folder / "gpu_tests.json", suite)
    measured = measurement_artifact("m", "a GPU measurement", {}, {})
    same = measured.model_copy(update={"provenance": suite.provenance})  # the suite's commit: fine
    write_artifact(folder / "other_same.json", same)
    older = measured.model_copy(update={"provenance": suite.provenance.model_copy(update={"git_commit": "b" * 40})})
    write_artifact(folder / "other_old.json", older)
    findings = [f for f in run_audit([str(folder)], tmp_path, report=False).findings if f.check == "gpu-suite"]
    assert [(Path(f.path).name, f.message.split(";")[0]) for f in findings] == [
        ("other_old.json", "measured at bbbbbbbbbbbb")]
    speech = folder / "speech"  # a folder of its own stages: it stands on its profile's suite
    speech.mkdir()
    write_artifact(speech / "load_clip.json", same)
    write_artifact(speech / "smoke_clip.json", older)
    findings = [f for f in run_audit([str(folder)], tmp_path, report=False).findings if f.check == "gpu-suite"]
    assert sorted((Path(f.path).name, f.message.split(";")[0]) for f in findings) == [
        ("other_old.json", "measured at bbbbbbbbbbbb"), ("smoke_clip.json", "measured at bbbbbbbbbbbb")]
    (speech / "smoke_clip.json").unlink()
    write_artifact(folder / "gpu_tests.json", _suite(tmp_path, "a" * 40, passed=False))
    messages = [f.message for f in run_audit([str(folder)], tmp_path, report=False).findings if f.check == "gpu-suite"]
    assert any(m.startswith("the GPU suite failed at aaaaaaaaaaaa: 1 failed") for m in messages)
    assert any(m.startswith("no passing GPU suite in h200/") for m in messages)


def test_the_page_names_the_commit_and_date_whose_gpu_suite_passed(tmp_path):
    from alignatt.report.page import render_report

    root = Path(__file__).resolve().parents[2]
    for name in ("params.yaml", "reports"):
        (shutil.copytree if (root / name).is_dir() else shutil.copy)(root / name, tmp_path / name)
    (tmp_path / "outputs" / "published").mkdir(parents=True)
    suite = _suite(tmp_path, "c0ffee" + "0" * 34, passed=True)
    suite = suite.model_copy(update={"tests": [
        *suite.tests,
        GpuTestCase(nodeid="tests/gpu/test_eval_gpu.py::test_x", outcome="skipped", duration_s=0.0,
                    message="could not import 'omnisteval'")]})
    write_artifact(tmp_path / "outputs" / "h200" / "gpu_tests.json", suite)
    page = render_report(tmp_path)
    assert f"passed at commit `c0ffee000000` on {suite.provenance.date}" in page
    assert "skipped: `tests/gpu/test_eval_gpu.py::test_x`: could not import 'omnisteval'" in page
    failed = _suite(tmp_path, "c0ffee" + "0" * 34, passed=False).model_copy(update={"tests": [
        GpuTestCase(nodeid="tests/test_a.py::test_y", outcome="failed", duration_s=1.0, message="AssertionError")]})
    write_artifact(tmp_path / "outputs" / "h200" / "gpu_tests.json", failed)
    lines = render_report(tmp_path).splitlines()
    said = lines.index("  pytest exited 1: no GPU figure on this page stands on a passing suite from this machine.")
    assert lines[said + 1] == "  - failed: `tests/test_a.py::test_y`: AssertionError"  # a line of its own


def test_the_h200_profile_runs_its_gpu_tests_in_lanes():
    from alignatt.pipeline.params import load_params, profile_of

    assert profile_of(load_params("params.yaml"), "h200")[1].gpu_lanes == 4
    assert profile_of(load_params("params.yaml"), "cpu")[1].gpu_lanes == 1


def test_the_page_says_which_gpu_figures_stand_on_the_passing_suite(tmp_path):
    from alignatt.report.page import render_report

    root = Path(__file__).resolve().parents[2]
    for name in ("params.yaml", "reports"):
        (shutil.copytree if (root / name).is_dir() else shutil.copy)(root / name, tmp_path / name)
    (tmp_path / "outputs" / "published").mkdir(parents=True)
    folder = tmp_path / "outputs" / "h200"
    suite = _suite(tmp_path, "a" * 40, passed=True)
    write_artifact(folder / "gpu_tests.json", suite)
    measured = measurement_artifact("m", "a GPU measurement", {}, {})
    write_artifact(folder / "same.json", measured.model_copy(update={"provenance": suite.provenance}))
    older = suite.provenance.model_copy(update={"git_commit": "b" * 40})
    write_artifact(folder / "old.json", measured.model_copy(update={"provenance": older}))
    page = render_report(tmp_path)
    assert "  - Stand on it (measured at `aaaaaaaaaaaa`): same.json." in page
    assert f"its commit): old.json (bbbbbbb, {older.date})." in " ".join(page.split())
