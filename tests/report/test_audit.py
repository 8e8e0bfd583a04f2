"""The audit: clean on a consistent tree, and each kind of tampering is found (on copies)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from alignatt.report import page as report
from alignatt.report.audit import run_audit
from alignatt.cli import app
from tests.record.signing_keys import attest_tree, throwaway_key, trust
from tests.support.report_fixtures import bench_artifact, build_tree, write_run

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    """A trusted signer and one nobody trusts (throwaway keys, made once for this module)."""
    folder = tmp_path_factory.mktemp("keys")
    return throwaway_key(folder, "measuring-host"), throwaway_key(folder, "stranger")


@pytest.fixture
def tree(tmp_path, keys) -> Path:
    root = build_tree(tmp_path / "project")
    trust(root, keys[0])
    attest_tree(root, keys[0])
    report.write_report(root)
    return root


def _resign(tree: Path, key) -> None:
    """What a holder of the trusted key can do after an edit: sign the files as they now are."""
    attest_tree(tree, key)
    report.write_report(tree)


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


def test_a_row_is_never_combined_across_gpus_or_stacks(tree, keys):
    """A graphed run on another GPU and torch than the eager run: its row is not combined with the
    eager run's HF figures (so the audit finds no combined row), and says why."""
    other = bench_artifact("h200", "cudagraph", {"vllm_capture": 0.25}, True, True)
    other.provenance.gpus[0].name = "NVIDIA H100 80GB HBM3"
    other.provenance.torch = "2.10.0+cu128"
    write_run(tree, "h200", {"cudagraph": other})
    _resign(tree, keys[0])
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


def _dirty_env(tree: Path, key) -> Path:
    env = tree / "outputs/cpu/env.json"
    _edit_json(env, lambda d: d["provenance"].update(git_dirty=True))
    _resign(tree, key)
    return env


def test_an_explained_finding_can_be_accepted(tree, keys):
    env = _dirty_env(tree, keys[0])
    assert (env.name, "provenance") in _checks(_audit(tree))
    (tree / "outputs/accepted-findings.yaml").write_text(
        f"- path: {env.relative_to(tree)}\n  check: provenance\n  message: uncommitted changes\n  reason: examined\n")
    result = _audit(tree)
    assert result.ok, result.as_text()
    assert [(Path(f.path).name, why) for f, why in result.accepted] == [(env.name, "examined")]
    assert "ACCEPTED" not in result.as_text() and "1 accepted finding(s)" in result.as_text().splitlines()[0]
    assert "ACCEPTED" in result.as_text(show_accepted=True)


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


# ---- run records: a hand-edit cannot pass once the page is re-rendered ------------------------


def _record_findings(result) -> list[tuple[str, str]]:
    return [(Path(f.path).name, f.message) for f in result.findings if f.check == "record"]


def test_a_forged_headline_figure_fails_the_audit_after_the_page_is_re_rendered(tmp_path, keys):
    """The forgery of issue 42: the most speakers' p95 in a copy of outputs/h200/load.json edited
    (100 ms better), the page re-rendered; the page is fresh, yet the audit names the file."""
    root = build_tree(tmp_path / "project")
    load = root / "outputs/h200/load.json"
    shutil.copy(ROOT / "outputs/h200/load.json", load)
    trust(root, keys[0])
    attest_tree(root, keys[0])
    report.write_report(root)
    assert _record_findings(_audit(root)) == []

    def forge(d):  # the headline: the served configuration's p95 at its most speakers, 100 ms better
        from alignatt.measure.load_configurations import served_default_label

        served = [lv for lv in d["levels"] if lv["vllm_mode"] == served_default_label()]
        max(served, key=lambda lv: lv["speakers"])["partial_rtt_ms_p95"] -= 100
    _edit_json(load, forge)
    report.write_report(root)  # `dvc repro -s report`: the page now agrees with the forged file
    result = _audit(root)
    assert not [f for f in result.findings if f.check == "report"]
    assert not result.ok
    found = _record_findings(result)
    assert [(name, "changed after it was recorded" in m) for name, m in found] == [("load.json", True)]
    assert result.as_text().splitlines()[1].startswith(f"FAIL {load}: [record] SHA-256")


def test_an_edited_instance_log_is_found(tmp_path, keys):
    root = build_tree(tmp_path / "project")
    logs = root / "outputs/h200/eval_instances"
    shutil.copytree(ROOT / "outputs/h200/eval_instances/vllm_capture-fullgraph.inprocess.balanced.gold", logs / "run")
    trust(root, keys[0])
    attest_tree(root, keys[0])
    report.write_report(root)
    assert _record_findings(_audit(root)) == []
    edited = next(p for p in sorted((logs / "run").rglob("*")) if p.is_file())
    edited.write_bytes(edited.read_bytes().replace(b"e", b"a", 1))
    assert [name for name, _ in _record_findings(_audit(root))] == [edited.name]


def test_an_unlisted_file_under_published_is_found(tree):
    extra = tree / "outputs/published/figures_extra.csv"
    extra.write_text("speakers,p95\n128,217\n")
    result = _audit(tree)
    assert (extra.name, "hash") in _checks(result)  # not in SHA256SUMS
    assert (extra.name, "record") in _checks(result)  # and no run record


def test_a_re_listed_published_file_is_found(tree):
    """A historical figure edited with its SHA256SUMS line updated: the manifest is itself recorded."""
    import hashlib

    folder = tree / "outputs/published"
    name = "mt_capture_speed_benchmark_eager_20260702.json"
    (folder / name).write_bytes((folder / name).read_bytes().replace(b"72.4", b"62.4", 1))
    digest = hashlib.sha256((folder / name).read_bytes()).hexdigest()
    sums = folder / "SHA256SUMS"
    sums.write_text("".join(f"{digest}  {name}\n" if line.endswith(f"  {name}") else line + "\n"
                            for line in sums.read_text().splitlines()))
    report.write_report(tree)
    assert {n for n, _ in _record_findings(_audit(tree))} == {name, "SHA256SUMS"}


def test_an_unsigned_run_record_is_found(tree):
    record = tree / "outputs/run-records/imported/cpu.intoto.jsonl"
    Path(str(record) + ".sig").unlink()
    found = _record_findings(_audit(tree))
    assert ("cpu.intoto.jsonl", "run record not accepted: unsigned (no .sig beside it)") in found
    assert any(name == "bench_eager.json" and "is not accepted: unsigned" in m for name, m in found)


def test_a_run_record_signed_by_an_unknown_key_is_found_unless_trusted_for_this_audit(tree, keys):
    stranger = keys[1]
    attest_tree(tree, stranger)  # a stranger signs every file as it is
    found = _record_findings(_audit(tree))
    assert any(name == "server_smoke.json" and "not trusted" in m for name, m in found), found
    # a CI run's ephemeral key, trusted for its own audit only
    pub = Path(str(stranger.path) + ".pub")
    assert _record_findings(run_audit(root=tree, trusted=[pub])) == []


def test_a_run_record_edited_after_signing_is_found(tree):
    record = tree / "outputs/run-records/imported/h200.intoto.jsonl"
    record.write_bytes(record.read_bytes().replace(b'"recorded":"at import"', b'"recorded":"at measurement"'))
    found = _record_findings(_audit(tree))
    assert ("h200.intoto.jsonl", "run record not accepted: the signature does not match the record "
            "(edited after signing)") in found


def test_an_older_record_does_not_vouch_for_a_newer_file(tree, keys):
    """Once a file is re-recorded, its earlier signed version no longer passes (no rollback)."""
    import time

    smoke = tree / "outputs/cpu/server_smoke.json"
    old = smoke.read_bytes()
    old_record = (tree / "outputs/run-records/imported/cpu.intoto.jsonl")
    kept = tree / "outputs/run-records/kept/cpu-old.intoto.jsonl"
    kept.parent.mkdir(parents=True)
    shutil.copy(old_record, kept)
    shutil.copy(str(old_record) + ".sig", str(kept) + ".sig")
    time.sleep(1.1)  # records order by their finishing second
    _edit_json(smoke, lambda d: d.update(updates=43))
    _resign(tree, keys[0])
    assert _record_findings(_audit(tree)) == []
    smoke.write_bytes(old)  # back to the version the older record lists
    report.write_report(tree)
    assert [n for n, _ in _record_findings(_audit(tree))] == ["server_smoke.json"]


def test_audit_output_leads_with_its_verdict(tree, monkeypatch, keys):
    _dirty_env(tree, keys[0])
    (tree / "outputs/accepted-findings.yaml").write_text(
        "- path: outputs/cpu/env.json\n  check: provenance\n  message: uncommitted changes\n  reason: examined\n")
    (tree / "outputs/cpu/notes.csv").write_text("a\n")
    monkeypatch.chdir(tree)
    runner = CliRunner()
    out = runner.invoke(app, ["audit"])
    lines = out.output.splitlines()
    assert out.exit_code == 1
    assert lines[0].startswith("audit: FAILED, 1 finding(s), 1 accepted finding(s)")
    assert lines[1:] == [f"FAIL outputs/cpu/notes.csv: [record] {_record_findings(_audit(tree))[0][1]}"]
    shown = runner.invoke(app, ["audit", "--show-accepted"]).output
    assert "ACCEPTED outputs/cpu/env.json: [provenance]" in shown
    data = json.loads(runner.invoke(app, ["audit", "--json"]).output)
    assert data["verdict"] == lines[0] and len(data["accepted"]) == 1
    assert {r["recorded"] for r in data["records"]} == {"at import"} and all(r["accepted"] for r in data["records"])
    bad = runner.invoke(app, ["audit", "--trust", "no/such.pub"])
    assert bad.exit_code == 2 and "no/such.pub" in bad.output and len(bad.output.strip().splitlines()) == 1


def test_the_page_says_who_signed_which_run(tree):
    page = (tree / "reports/BENCHMARKS.md").read_text()
    assert "## Who signed which run" in page
    assert "| `outputs/run-records/imported/cpu.intoto.jsonl` | at import | measuring-host (`SHA256:" in page


def test_load_metrics_and_plot_data_must_re_derive_from_the_load_artifact(tmp_path, keys):
    root = build_tree(tmp_path / "project")
    for name in ("load.json", "load_metrics.json", "load_rtt.csv"):
        shutil.copy(ROOT / "outputs/h200" / name, root / "outputs/h200" / name)
    assert not [f for f in run_audit(root=root, report=False).findings if f.check == "derived"]
    plot = root / "outputs/h200/load_rtt.csv"
    header, first, *rest = plot.read_text().splitlines()
    cells = first.split(",")
    cells[-1] = str(float(cells[-1]) + 100)  # one plotted value moved
    plot.write_text("\n".join([header, ",".join(cells), *rest]) + "\n")
    _edit_json(root / "outputs/h200/load_metrics.json", lambda d: d.update(extra=1))
    derived = [Path(f.path).name for f in run_audit(root=root, report=False).findings if f.check == "derived"]
    assert sorted(derived) == ["load_metrics.json", "load_rtt.csv"]


def test_a_recorded_config_of_the_wrong_type_is_one_schema_finding(tree):
    def bad(d):
        d["config"]["replay_speed"] = "fast"
        d["config"]["summaries"] = "none"
    _edit_json(tree / "outputs/cpu/server_smoke.json", bad)
    findings = [f for f in _audit(tree).findings if f.check == "schema"]
    assert [(Path(f.path).name, "\n" in f.message) for f in findings] == [("server_smoke.json", False)]
    assert "config.replay_speed" in findings[0].message and "config.summaries" in findings[0].message
