"""The audit: clean on a consistent tree, and each kind of tampering is found (on copies)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from alignatt.report import page as report
from alignatt.report.audit import run_audit
from alignatt.cli import app
from tests.support.report_fixtures import bench_artifact, build_tree, write_run

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def tree(tmp_path) -> Path:
    root = build_tree(tmp_path / "project")
    report.write_report(root)
    return root


def _audit(root: Path):
    return run_audit(root=root)


def _checks(result) -> list[tuple[str, str]]:
    return [(Path(f.path).name, f.check) for f in result.findings]


def _edit_json(path: Path, edit) -> None:
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data, indent=1) + "\n")


def test_a_consistent_tree_passes(tree):
    result = _audit(tree)
    assert result.ok, result.as_text()
    names = {Path(p).name for p in result.checked}
    assert {"bench_eager.json", "bench_eager_metrics.json", "latency_eager.csv", "server_smoke.json",
            "env.json", "mt_server_smoke_a100_20260709.json", "BENCHMARKS.md"} <= names


def test_a_changed_historical_byte_is_a_hash_finding(tree):
    path = tree / "outputs/published/mt_capture_speed_benchmark_eager_20260702.json"
    path.write_bytes(path.read_bytes().replace(b"72.4", b"62.4", 1))
    assert ("mt_capture_speed_benchmark_eager_20260702.json", "hash") in _checks(_audit(tree))


def test_an_unlisted_or_missing_historical_file_is_found(tree):
    extra = tree / "outputs/published/mt_capture_speed_benchmark_extra_20260801.json"
    extra.write_text("{}\n")
    (tree / "outputs/published/mt_server_smoke_a100_20260709.json").unlink()
    checks = _checks(_audit(tree))
    assert (extra.name, "hash") in checks
    assert ("mt_server_smoke_a100_20260709.json", "hash") in checks


def test_a_deleted_manifest_is_found(tree):
    (tree / "outputs/published/SHA256SUMS").unlink()
    result = _audit(tree)
    assert ("published", "hash") in _checks(result)
    assert any("no SHA256SUMS" in f.message for f in result.findings)


def test_a_missing_provenance_field_is_a_schema_finding(tree):
    _edit_json(tree / "outputs/h200/bench_eager.json", lambda d: d["provenance"].pop("vllm"))
    result = _audit(tree)
    assert ("bench_eager.json", "schema") in _checks(result)
    assert any("provenance.vllm" in f.message for f in result.findings)


def test_provenance_gaps_are_flagged(tree):
    def no_vllm_no_torch(d):
        d["provenance"]["vllm"] = "not installed"  # yet vllm_capture ran
        d["provenance"]["torch"] = "not installed"
        d["provenance"]["driver"] = None
    _edit_json(tree / "outputs/h200/bench_eager.json", no_vllm_no_torch)
    _edit_json(tree / "outputs/cpu/env.json", lambda d: d["provenance"].update(git_dirty=True))
    result = _audit(tree)
    messages = [f.message for f in result.findings if f.check == "provenance"]
    assert any("vLLM seam ran but the vLLM version" in m for m in messages)
    assert any("torch not recorded" in m for m in messages)
    assert any("driver version is not recorded" in m for m in messages)
    assert any("uncommitted changes" in m for m in messages)


def test_a_row_is_never_combined_across_gpus_or_stacks(tree):
    """A graphed run on another GPU and torch than the eager run: its row is not combined with the
    eager run's HF figures (so the audit finds no combined row), and says why."""
    other = bench_artifact("h200", "cudagraph", {"vllm_capture": 0.25}, True, True)
    other.provenance.gpus[0].name = "NVIDIA H100 80GB HBM3"
    other.provenance.torch = "2.10.0+cu128"
    write_run(tree, "h200", {"cudagraph": other})
    report.write_report(tree)
    result = _audit(tree)
    assert not [f for f in result.findings if f.check == "combined-row"], result.as_text()
    assert "HF seams not shown" in (tree / "reports/BENCHMARKS.md").read_text()


def test_a_published_pair_that_disagrees_is_flagged_as_a_combined_row(tree):
    """The published artifacts of one day (a graphed run and its eager twin) are still combined: one
    whose GPU or torch differs from its twin's is a combined-row finding (manifest kept in step)."""
    import hashlib

    folder = tree / "outputs/published"
    name = "mt_capture_speed_benchmark_cudagraph_20260702.json"
    _edit_json(folder / name, lambda d: d["config"].update(gpu_name="NVIDIA H100 80GB HBM3",
                                                           torch_version="2.10.0+cu128"))
    digest = hashlib.sha256((folder / name).read_bytes()).hexdigest()
    sums = folder / "SHA256SUMS"
    sums.write_text("".join(f"{digest}  {name}\n" if line.endswith(f"  {name}") else line + "\n"
                            for line in sums.read_text().splitlines()))
    report.write_report(tree)
    combined = [f.message for f in _audit(tree).findings if f.check == "combined-row"]
    assert any("GPU" in m for m in combined) and any("torch" in m for m in combined), combined


def test_stale_report_and_derived_files_are_found(tree):
    page = tree / "reports/BENCHMARKS.md"
    page.write_text(page.read_text().replace("| 2026-12-01 |", "| 2026-12-02 |", 1))
    metrics = tree / "outputs/cpu/bench_eager_metrics.json"
    _edit_json(metrics, lambda d: d["hf_eager"].update(median_per_token_ms=1.0))
    checks = _checks(_audit(tree))
    assert ("BENCHMARKS.md", "report") in checks
    assert ("bench_eager_metrics.json", "derived") in checks


def test_not_an_artifact_and_a_fake_seam_factory_are_found(tree):
    (tree / "outputs/cpu/notes.json").write_text('{"hello": 1}\n')
    _edit_json(tree / "outputs/cpu/bench_eager.json",
               lambda d: d.update(seam_factory="tests.fakes.bench_fakes:make_fake_seam"))
    result = _audit(tree)
    checks = _checks(result)
    assert ("notes.json", "schema") in checks
    assert any("not alignatt's own seams" in f.message for f in result.findings)


def test_cli_json_output_and_exit_codes(tree, monkeypatch):
    monkeypatch.chdir(tree)
    runner = CliRunner()
    ok = runner.invoke(app, ["audit", "--json"])
    assert ok.exit_code == 0, ok.output
    assert json.loads(ok.output)["ok"] is True
    (tree / "outputs/cpu/server_smoke.json").write_text("not json")
    bad = runner.invoke(app, ["audit", "--json", "outputs/cpu"])
    assert bad.exit_code == 1
    findings = json.loads(bad.output)["findings"]
    assert any(f["check"] == "schema" and "not valid JSON" in f["message"] for f in findings)
    missing = runner.invoke(app, ["audit", "no/such/dir"])
    assert missing.exit_code == 2 and "no such file or directory" in missing.output


def test_the_repository_passes_its_own_audit():
    result = run_audit(root=ROOT)
    assert result.ok, result.as_text()


def _dirty_env(tree: Path) -> Path:
    env = tree / "outputs/cpu/env.json"
    _edit_json(env, lambda d: d["provenance"].update(git_dirty=True))
    report.write_report(tree)
    return env


def test_an_explained_finding_can_be_accepted(tree):
    env = _dirty_env(tree)
    assert (env.name, "provenance") in _checks(_audit(tree))
    (tree / "outputs/accepted-findings.yaml").write_text(
        f"- path: {env.relative_to(tree)}\n  check: provenance\n  message: uncommitted changes\n  reason: examined\n")
    result = _audit(tree)
    assert result.ok, result.as_text()
    assert [(Path(f.path).name, why) for f, why in result.accepted] == [(env.name, "examined")]
    assert "ACCEPTED" in result.as_text()


def test_an_acceptance_that_explains_nothing_is_a_finding(tree):
    (tree / "outputs/accepted-findings.yaml").write_text(
        "- path: outputs/cpu/env.json\n  check: provenance\n  message: x\n  reason: stale\n")
    assert ("accepted-findings.yaml", "accepted") in _checks(_audit(tree))
    (tree / "outputs/accepted-findings.yaml").write_text("- path: only-a-path\n")
    with pytest.raises(Exception, match="needs path, check, message and reason"):
        _audit(tree)


def test_an_artifact_measured_on_another_stack_than_its_fingerprint_is_found(tree):
    _edit_json(tree / "outputs/cpu/fingerprint.json", lambda d: d["fingerprint"].update(torch="9.9.9"))
    result = _audit(tree)
    found = [(name, check) for name, check in _checks(result) if check == "fingerprint"]
    assert sorted(found) == [("bench_cudagraph.json", "fingerprint"), ("bench_eager.json", "fingerprint"),
                             ("server_smoke.json", "fingerprint")]
    assert all("torch" in f.message for f in result.findings if f.check == "fingerprint")


def test_a_fingerprint_with_a_timestamp_is_a_schema_finding(tree):
    _edit_json(tree / "outputs/cpu/fingerprint.json", lambda d: d["fingerprint"].update(timestamp_utc="x"))
    assert ("fingerprint.json", "schema") in _checks(_audit(tree))


def _eval_beside_the_fingerprint(tree: Path, **provenance) -> None:
    """The CPU eval artifact, measured (by its provenance) on the tree's fingerprint, with changes."""
    fingerprint = json.loads((tree / "outputs/cpu/fingerprint.json").read_text())["fingerprint"]
    data = json.loads((ROOT / "outputs/cpu/eval.json").read_text())
    data["provenance"].update({k: fingerprint[k] for k in fingerprint if k in data["provenance"]}, **provenance)
    data["instance_logs"] = None
    (tree / "outputs/cpu/eval.json").write_text(json.dumps(data, indent=1) + "\n")


def test_an_eval_may_score_another_model_than_the_fingerprint_but_not_on_another_stack(tree):
    # the h200 eval scores real Gemma-3 weights beside the profile's synthetic E4B
    _eval_beside_the_fingerprint(tree, model_id="google/gemma-3-270m", model_revision="r")
    assert [c for c in _checks(_audit(tree)) if c[1] == "fingerprint"] == []
    _eval_beside_the_fingerprint(tree, model_id="google/gemma-3-270m", model_revision="r", torch="9.9.9")
    assert [c for c in _checks(_audit(tree)) if c[1] == "fingerprint"] == [("eval.json", "fingerprint")]
