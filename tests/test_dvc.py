"""The DVC pipeline: stage graph, params, outputs, the profile switch, and a run on fake seams."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
DVC = Path(sys.executable).parent / "dvc"
pytestmark = pytest.mark.skipif(not DVC.exists(), reason="dvc not installed (alignatt[pipeline])")


def dvc(cwd: Path, *args: str, env: dict | None = None) -> str:
    done = subprocess.run([str(DVC), *args], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=600)
    assert done.returncode == 0, f"dvc {' '.join(args)}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def test_dvc_is_initialised_without_analytics():
    config = (ROOT / ".dvc" / "config").read_text()
    assert "analytics = false" in config
    assert (ROOT / ".dvcignore").exists()


def test_stage_graph_and_outputs():
    spec = yaml.safe_load((ROOT / "dvc.yaml").read_text())
    stages = dvc(ROOT, "stage", "list", "--names-only").split()
    assert stages == ["env", "bench@eager", "bench@cudagraph", "smoke", "eval", "report"]
    for name, stage in spec["stages"].items():
        body = stage.get("do", stage)
        assert body["cmd"].startswith("stages/run-stage "), f"{name} does not go through the wrapper"
        for section in ("outs", "metrics"):
            for entry in body.get(section, []):
                (path, opts), = entry.items()
                assert opts == {"cache": False} or opts.get("cache") is False, path
                assert not path.startswith("outputs/published"), "no stage may write the published artifacts"
    # env -> every measuring stage -> report (report depends on the whole outputs folder)
    edges = {line.strip().rstrip(";") for line in dvc(ROOT, "dag", "--dot", "report").splitlines()
             if "->" in line}
    for stage in ("bench@eager", "bench@cudagraph", "smoke", "eval"):
        assert f'"env" -> "{stage}"' in edges
        assert f'"{stage}" -> "report"' in edges
    assert spec["plots"] and "metrics" in spec["stages"]["bench"]["do"]


def test_smoke_stage_command_exists():
    from typer.testing import CliRunner

    from alignatt.cli import app

    assert CliRunner().invoke(app, ["smoke", "--help"]).exit_code == 0
    help_text = CliRunner().invoke(app, ["smoke", "--help"]).output
    for option in ("--model", "--device", "--dtype", "--speed", "--out", "--seam"):
        assert option in help_text, f"the smoke stage passes {option}"


def _project_copy(dest: Path) -> Path:
    for name in ("dvc.yaml", "params.yaml", "pyproject.toml", ".dvcignore"):
        shutil.copy(ROOT / name, dest / name)
    for name in ("stages", ".dvc", "alignatt"):
        shutil.copytree(ROOT / name, dest / name, ignore=shutil.ignore_patterns("__pycache__", "tmp", "cache"))
    (dest / "reports").mkdir()
    shutil.copy(ROOT / "reports" / "BENCHMARKS.md.j2", dest / "reports")
    shutil.copytree(ROOT / "outputs" / "published", dest / "outputs" / "published")
    subprocess.run(["git", "init", "-q"], cwd=dest, check=True)
    subprocess.run(["git", "add", "."], cwd=dest, check=True)
    subprocess.run(["git", "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "copy"],
                   cwd=dest, check=True)
    return dest


def test_profile_switch_is_one_line(tmp_path):
    project = _project_copy(tmp_path)
    params = project / "params.yaml"
    text = params.read_text()
    assert text.count("\nprofile: cpu\n") == 1
    params.write_text(text.replace("\nprofile: cpu\n", "\nprofile: h200\n"))
    listing = dvc(project, "stage", "list")
    assert "outputs/h200/bench_eager.json" in listing and "outputs/cpu/" not in listing
    from alignatt.pipeline.params import config_from_params, load_params

    cfg = config_from_params(load_params(params), "cudagraph")
    assert (cfg.model, cfg.device, cfg.vllm_mode) == ("gemma4-e4b-synthetic", "cuda", "cudagraph")


def test_pipeline_runs_end_to_end_on_fake_seams(tmp_path):
    """env -> bench@eager -> bench@cudagraph -> report through DVC and the wrapper, seams faked.

    (The smoke stage needs the real model; tests/test_smoke* cover it.) The audit must then flag
    exactly the fake seams, and nothing else."""
    project = _project_copy(tmp_path)
    env = {
        "ALIGNATT_BENCH_SEAM_FACTORY": "tests.bench_fakes:make_fake_seam",
        "PYTHONPATH": str(ROOT),
        "ALIGNATT_PYTHON": sys.executable,
    }
    for stage in ("env", "bench@eager", "bench@cudagraph", "report"):
        dvc(project, "repro", "--single-item", stage, env=env)
    out = project / "outputs" / "cpu"
    assert sorted(p.name for p in out.iterdir()) == [
        "bench_cudagraph.json", "bench_cudagraph_metrics.json", "bench_eager.json",
        "bench_eager_metrics.json", "env.json", "latency_cudagraph.csv", "latency_eager.csv",
    ]
    page = (project / "reports" / "BENCHMARKS.md").read_text()
    assert "| eager | gemma3-270m |" in page and "2026-07-02 (published)" in page
    assert "metrics" in dvc(project, "metrics", "show", "--json", env=env)

    from alignatt.pipeline.audit import run_audit

    result = run_audit(root=project)
    assert sorted((Path(f.path).name, f.check) for f in result.findings) == [
        ("bench_cudagraph.json", "provenance"), ("bench_eager.json", "provenance"),
    ], result.as_text()
    assert all("not alignatt's own seams" in f.message for f in result.findings)


def test_gpu_host_runner_writes_what_the_stages_write(tmp_path):
    """stages/gpu-run (no DVC, no typer on the H200 host) produces the dvc stage's files."""
    out = tmp_path / "h200"
    env = {**os.environ, "ALIGNATT_PYTHON": sys.executable, "PYTHONPATH": str(ROOT),
           "ALIGNATT_BENCH_SEAM_FACTORY": "tests.bench_fakes:make_fake_seam", "ALIGNATT_PROFILE": "cpu"}
    # the eager stage split in two calls, as on a host that limits a command's time
    for args in (["env"], ["cudagraph"], ["eager", "hf_qk_fast"], ["eager", "vllm_capture"]):
        done = subprocess.run([str(ROOT / "stages" / "gpu-run"), args[0], str(out), *args[1:]],
                              cwd=ROOT, capture_output=True, text=True, env=env, timeout=300)
        assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in out.iterdir()) == [
        "bench_cudagraph.json", "bench_cudagraph_metrics.json", "bench_eager.json",
        "bench_eager_metrics.json", "env.json", "latency_cudagraph.csv", "latency_eager.csv"]
    from alignatt.pipeline.artifacts import BenchArtifact, load_artifact

    art = load_artifact(out / "bench_cudagraph.json")
    assert isinstance(art, BenchArtifact) and art.config.vllm_mode == "cudagraph"
    assert art.seams[0].status == "skipped"  # the fake factory has no vLLM, like this machine
    eager = load_artifact(out / "bench_eager.json")
    assert [(s.seam, s.status) for s in eager.seams] == [("hf_qk_fast", "ok"), ("vllm_capture", "skipped")]
