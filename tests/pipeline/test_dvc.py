"""The DVC pipeline: stage graph, params, code deps, incremental repro, experiments, fake seams."""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DVC = Path(sys.executable).parent / "dvc"
pytestmark = pytest.mark.skipif(not DVC.exists(), reason="dvc not installed (alignatt[pipeline])")


def dvc(cwd: Path, *args: str, env: dict | None = None, ok: bool = True) -> str:
    done = subprocess.run([str(DVC), *args], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=600)
    assert (done.returncode == 0) == ok, f"dvc {' '.join(args)}:\n{done.stdout}\n{done.stderr}"
    return done.stdout + done.stderr


def ran_stages(log: str) -> list[str]:
    """The stages `dvc repro` / `dvc exp run` executed (not the ones it skipped as unchanged)."""
    return re.findall(r"Running stage '([^']+)'", log)


def test_dvc_is_initialised_without_analytics():
    config = (ROOT / ".dvc" / "config").read_text()
    assert "analytics = false" in config
    assert (ROOT / ".dvcignore").exists()


def test_stage_graph_and_outputs():
    spec = yaml.safe_load((ROOT / "dvc.yaml").read_text())
    stages = dvc(ROOT, "stage", "list", "--names-only").split()
    assert stages == ["env", "gpu-tests", "bench@eager", "bench@cudagraph", "bench@fullgraph", "smoke",
                      "speech-smoke@two_cities", "speech-smoke@phone_call", "speech-e2e", "load", "load-speech",
                      "load-anatomy", "eval", "eval-direction@cs-en", "eval-direction@en-zh", "eval-direction@en-it", "report"]
    for name, stage in spec["stages"].items():
        body = stage.get("do", stage)
        cmds = body["cmd"] if isinstance(body["cmd"], list) else [body["cmd"]]
        assert all(c.startswith("stages/run-stage ") for c in cmds), f"{name} does not go through the wrapper"
        for section in ("outs", "metrics"):
            for entry in body.get(section, []):
                (path, opts), = entry.items()
                assert opts == {"cache": False} or opts.get("cache") is False, path
                assert not path.startswith("outputs/published"), "no stage may write the published artifacts"
        # only the env stage looks at the machine on every run; the others follow its fingerprint
        assert body.get("always_changed", False) == (name == "env"), name
    assert spec["stages"]["env"]["outs"] == [{"outputs/${profile}/fingerprint.json": {"cache": False}}]
    assert "alignatt doctor" in spec["stages"]["env"]["cmd"][0]  # fails fast, before any long stage
    # env -> every measuring stage -> report (report depends on the whole outputs folder)
    edges = {line.strip().rstrip(";") for line in dvc(ROOT, "dag", "--dot", "report").splitlines()
             if "->" in line}
    for stage in ("bench@eager", "bench@cudagraph", "bench@fullgraph", "smoke", "speech-smoke@two_cities",
                  "speech-smoke@phone_call", "speech-e2e", "load", "load-speech", "load-anatomy", "eval",
                  *(f"eval-direction@{d}" for d in ("en-it", "en-zh", "cs-en"))):
        assert f'"env" -> "{stage}"' in edges
        assert f'"gpu-tests" -> "{stage}"' in edges  # no measurement before the GPU suite's verdict
        assert f'"{stage}" -> "report"' in edges
    assert spec["plots"] and "metrics" in spec["stages"]["bench"]["do"]


# ---- code deps: a stage re-runs when the code it runs changes, and only then --------------------

# What each stage's command calls (alignatt.cli is the thin front end every command shares; a
# command's `--profile` reads its options with alignatt.pipeline.params).
STAGE_ENTRY_MODULES = {
    "env": ["alignatt.pipeline.doctor", "alignatt.record.provenance", "alignatt.record.artifacts"],
    "bench": ["alignatt.measure.bench", "alignatt.pipeline.params"],
    "smoke": ["alignatt.measure.smoke", "alignatt.pipeline.params"],
    "speech-smoke": ["alignatt.measure.smoke", "alignatt.pipeline.params"],
    "speech-e2e": ["alignatt.measure.speech_e2e", "alignatt.pipeline.params"],
    "eval": ["alignatt.evaluate.run", "alignatt.evaluate.outputs", "alignatt.pipeline.params"],
    "eval-direction": ["alignatt.evaluate.run", "alignatt.evaluate.outputs", "alignatt.pipeline.params"],
    "load": ["alignatt.measure.capacity", "alignatt.pipeline.params"],
    "load-speech": ["alignatt.measure.capacity", "alignatt.pipeline.params"],
    "load-anatomy": ["alignatt.measure.capacity", "alignatt.pipeline.params"],
    "report": ["alignatt.report.page", "alignatt.report.figures"],
}


def _module_file(name: str) -> Path | None:
    base = ROOT / Path(*name.split("."))
    for candidate in (base / "__init__.py", base.with_suffix(".py")):
        if candidate.exists():
            return candidate
    return None


def import_closure(modules: list[str]) -> set[Path]:
    """Every alignatt source file the modules import, at module level or inside functions."""
    seen: set[Path] = set()
    todo = list(modules)
    while todo:
        name = todo.pop()
        path = _module_file(name)
        if path is None or path in seen:
            continue
        seen.add(path)
        parts = name.split(".")
        todo += [".".join(parts[:i]) for i in range(1, len(parts))]  # parent packages run too
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("alignatt"):
                todo += [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                todo += [a.name for a in node.names if a.name.startswith("alignatt")]
    return seen


def _inert_init(path: Path) -> bool:
    # a package __init__ holding only a docstring / version string runs no code worth a dep
    body = ast.parse(path.read_text(encoding="utf-8")).body
    return path.name == "__init__.py" and all(isinstance(n, (ast.Expr, ast.Assign)) for n in body)


def test_stage_code_deps_cover_every_module_the_stage_imports():
    spec = yaml.safe_load((ROOT / "dvc.yaml").read_text())
    for stage, modules in STAGE_ENTRY_MODULES.items():
        body = spec["stages"][stage].get("do", spec["stages"][stage])
        deps = [ROOT / d for d in body["deps"]]
        for path in sorted(import_closure(modules)):
            if _inert_init(path):
                continue
            assert any(path == d or d in path.parents for d in deps), (
                f"stage {stage} runs {path.relative_to(ROOT)} but does not depend on it")
        # the record, the replay clients and the report are taken whole: a folder, not a list of modules to keep in step
        assert not [d for d in body["deps"] if d.startswith(("alignatt/record/", "alignatt/replay/", "alignatt/report/"))], stage
        if stage in ("bench", "smoke", "speech-smoke", "eval", "report"):
            assert ROOT / "alignatt" / "data" in deps, f"{stage} reads the packaged prompts / heads"
            assert any(d.name == "fingerprint.json" for d in deps) or stage == "report"
    # the front end and modules no stage runs are not deps: editing them re-runs nothing
    bench_deps = spec["stages"]["bench"]["do"]["deps"]
    assert "alignatt" not in bench_deps and not any(d.startswith("alignatt/cli") for d in bench_deps)
    assert not any(d.startswith("alignatt/report") for d in bench_deps)


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
    for name in ("stages", ".dvc", "alignatt", "tests"):  # tests: the gpu-tests stage's code
        shutil.copytree(ROOT / name, dest / name, ignore=shutil.ignore_patterns("__pycache__", "tmp", "cache"))
    (dest / "reports").mkdir()
    shutil.copy(ROOT / "reports" / "BENCHMARKS.md.j2", dest / "reports")
    shutil.copytree(ROOT / "outputs" / "published", dest / "outputs" / "published")
    # the published files' signed import record, and the trusted keys it verifies with (alignatt.record)
    shutil.copytree(ROOT / "keys", dest / "keys", ignore=shutil.ignore_patterns("private"))
    (dest / "outputs/run-records/imported").mkdir(parents=True)
    for name in ("published.intoto.jsonl", "published.intoto.jsonl.sig"):
        shutil.copy(ROOT / "outputs/run-records/imported" / name, dest / "outputs/run-records/imported" / name)
    (dest / ".gitignore").write_text("__pycache__/\n/.dvc/tmp\n/.dvc/cache\n")
    subprocess.run(["git", "init", "-q"], cwd=dest, check=True)
    _commit(dest, "copy")
    return dest


def _commit(dest: Path, message: str) -> None:
    subprocess.run(["git", "add", "."], cwd=dest, check=True)
    subprocess.run(["git", "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", message],
                   cwd=dest, check=True)


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


FAKE_ENV = {
    "ALIGNATT_BENCH_SEAM_FACTORY": "tests.fakes.bench_fakes:make_fake_seam",
    "PYTHONPATH": str(ROOT),
    "ALIGNATT_PYTHON": sys.executable,
}


SERVER_STAGES = ("smoke", "speech-smoke", "speech-e2e", "load", "load-speech", "load-anatomy", "eval",
                 "eval-direction")


def _bench_and_report_only(project: Path) -> None:
    """The server stages need the real model (minutes on 2 cores; tests/test_smoke*, test_load*,
    test_eval* and tests/speech/test_wlk_server.py cover them): the incremental behaviour is shown
    on bench and report."""
    spec = yaml.safe_load((project / "dvc.yaml").read_text())
    for stage in SERVER_STAGES:
        del spec["stages"][stage]
    (project / "dvc.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    _commit(project, "no server stages in the test pipeline")


def test_repro_is_incremental(tmp_path):
    """A full repro; a second one runs only the fingerprint check and rewrites nothing; a
    template edit re-renders only the page; a changed machine fingerprint re-measures."""
    project = _project_copy(tmp_path)
    _bench_and_report_only(project)
    from tests.record.signing_keys import throwaway_key

    # a CI run's own key (outside the project: not its code), trusted for its own audit only
    key = throwaway_key(tmp_path.with_name(tmp_path.name + "-keys"), "ci-ephemeral")
    env = {**FAKE_ENV, "ALIGNATT_SIGNING_KEY": str(key.path)}
    first = dvc(project, "repro", env=env)
    assert ran_stages(first) == ["env", "gpu-tests", "bench@eager", "bench@cudagraph", "bench@fullgraph", "report"], first
    out = project / "outputs" / "cpu"
    assert sorted(p.name for p in out.iterdir()) == [
        "bench_cudagraph.json", "bench_cudagraph_metrics.json", "bench_eager.json",
        "bench_eager_metrics.json", "bench_fullgraph.json", "bench_fullgraph_metrics.json", "fingerprint.json",
        "gpu_tests.json", "gpu_tests_verdict.json", "latency_cudagraph.csv", "latency_eager.csv",
        "latency_fullgraph.csv",
    ]
    assert json.loads((out / "gpu_tests_verdict.json").read_text())["gpu_suite"] == "not run"  # a CPU profile
    fingerprint = json.loads((out / "fingerprint.json").read_text())
    assert fingerprint["kind"] == "fingerprint"
    assert not {"timestamp_utc", "load_average", "git_commit"} & set(fingerprint["fingerprint"])
    measured = json.loads((out / "bench_eager.json").read_text())["provenance"]["timestamp_utc"]
    assert measured.endswith("Z")  # when it was measured stays in the artifact itself
    page = (project / "reports" / "BENCHMARKS.md").read_text()
    assert "| eager | gemma3-270m |" in page and "2026-07-02 (published)" in page
    assert "](figures/latency_by_prompt_length_cpu.svg)" in page
    assert (project / "reports" / "figures" / "latency_by_prompt_length_cpu.svg").exists()
    assert "metrics" in dvc(project, "metrics", "show", "--json", env=env)
    from alignatt.report.audit import run_audit

    result = run_audit(root=project, trusted=[Path(f"{key.path}.pub")])  # exactly the fake seams are flagged
    assert sorted((Path(f.path).name, f.check) for f in result.findings) == [
        ("bench_cudagraph.json", "provenance"), ("bench_eager.json", "provenance"),
        ("bench_fullgraph.json", "provenance"),
    ], result.as_text()
    assert all("not alignatt's own seams" in f.message for f in result.findings)
    lock = (project / "dvc.lock").read_text()
    snapshot = {p: p.read_bytes() for p in out.iterdir()}

    second = dvc(project, "repro", env=env)
    assert ran_stages(second) == ["env"], second  # the always-changed machine check, nothing else
    assert {p: p.read_bytes() for p in out.iterdir()} == snapshot
    assert (project / "dvc.lock").read_text() == lock
    assert "bench@eager" not in dvc(project, "status", env=env)

    template = project / "reports" / "BENCHMARKS.md.j2"
    template.write_text(template.read_text() + "\nEdited.\n")
    third = dvc(project, "repro", env=env)
    assert ran_stages(third) == ["env", "report"], third
    assert (project / "reports" / "BENCHMARKS.md").read_text().endswith("Edited.\n")
    assert {p: p.read_bytes() for p in out.iterdir()} == snapshot

    # another library version (here: a triton distribution appearing on the path) is another
    # fingerprint: measure again
    site = tmp_path / "site" / "triton-9.9.0.dist-info"
    site.mkdir(parents=True)
    (site / "METADATA").write_text("Metadata-Version: 2.1\nName: triton\nVersion: 9.9.0\n")
    upgraded = {**env, "PYTHONPATH": f"{ROOT}{os.pathsep}{site.parent}"}
    fourth = dvc(project, "repro", env=upgraded)
    assert ran_stages(fourth) == ["env", "gpu-tests", "bench@eager", "bench@cudagraph", "bench@fullgraph",
                                  "report"], fourth
    assert json.loads((out / "fingerprint.json").read_text())["fingerprint"]["triton"] == "9.9.0"


def test_experiment_sets_the_profile_and_provenance_records_it(tmp_path):
    """`dvc exp run -S profile=...`: params recorded by DVC, the code not called uncommitted."""
    project = _project_copy(tmp_path)
    params = yaml.safe_load((project / "params.yaml").read_text())
    params["profiles"]["cpu2"] = params["profiles"]["cpu"]  # a second CPU profile to switch to
    (project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    _commit(project, "second cpu profile")
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=project, capture_output=True, text=True).stdout.strip()
    log = dvc(project, "exp", "run", "-S", "profile=cpu2", "bench@cudagraph", env=FAKE_ENV)
    assert ran_stages(log) == ["env", "gpu-tests", "bench@cudagraph"], log
    from alignatt.record.artifacts import load_artifact
    from alignatt.report.audit import run_audit

    art = load_artifact(project / "outputs" / "cpu2" / "bench_cudagraph.json")
    p = art.provenance
    assert (p.git_commit, p.git_dirty) == (head, False)  # params.yaml edited by DVC: not code
    assert p.params_changed == {"profile": "cpu2"} and p.dvc_experiment
    assert art.config.profile == "cpu2"
    result = run_audit([str(project / "outputs" / "cpu2")], root=project, report=False)
    assert not [f for f in result.findings if "uncommitted" in f.message], result.as_text()


def test_a_profile_this_machine_cannot_run_fails_in_the_env_stage(tmp_path):
    """The h200 profile on a CPU machine: doctor stops the pipeline before any bench stage."""
    if __import__("torch").cuda.is_available():
        pytest.skip("this machine has CUDA")
    project = _project_copy(tmp_path)
    log = dvc(project, "exp", "run", "-S", "profile=h200", env=FAKE_ENV, ok=False)
    assert "doctor: cannot run" in log and "CUDA: not available here" in log
    assert ran_stages(log) == ["env"]
    assert not (project / "outputs" / "h200").exists() or not any((project / "outputs" / "h200").glob("bench_*"))
