"""The benchmark's protocol and bookkeeping, on a fake seam with known drafts and timings."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from alignatt.measure import bench

from alignatt.pipeline import params
from alignatt.record.artifacts import BenchArtifact, BenchConfig, load_artifact, write_artifact
from alignatt.core.errors import AlignattError
from tests.fakes.bench_fakes import make_fake_seam

ROOT = Path(__file__).resolve().parents[2]
FACTORY = "tests.fakes.bench_fakes:make_fake_seam"


def config(**kw) -> BenchConfig:
    base = dict(model="gemma3-270m", seams=["hf_eager", "hf_qk_fast", "vllm_capture"], repeats=3)
    return BenchConfig(**{**base, **kw})


def test_packaged_prompts_are_the_published_sixteen():
    prompts = bench.load_prompts()
    assert len(prompts) == 16
    assert {p.length_bin for p in prompts} == {"short", "medium", "long"}
    assert sum(p.assistant_prefill != "" for p in prompts) == 8
    for p in prompts:
        assert 0 < p.accessible_units <= len(p.source_text.split())


def test_run_bench_protocol_rows_medians_and_skips():
    art = bench.run_bench(config(), runner=bench.InProcessRunner(make_fake_seam))
    assert [s.seam for s in art.seams] == ["hf_eager", "hf_qk_fast", "vllm_capture"]
    eager, fast, vllm = art.seams
    # 16 prompts x 3 measured repeats; the warm-up pass is not recorded
    assert len(eager.rows) == 48 and len(fast.rows) == 48
    assert sorted({r.repeat for r in eager.rows}) == [0, 1, 2]
    # the one timing definition: (prefill + decode + capture + reconstruct) / drafted tokens
    for r in eager.rows:
        n = r.generated_tokens
        assert r.total_ms == pytest.approx(10.0 + 2.0 * n + 0.5)
        assert r.per_token_ms == pytest.approx(r.total_ms / n)
    assert eager.median_per_token_ms == pytest.approx(statistics.median(r.per_token_ms for r in eager.rows))
    assert fast.median_per_token_ms < eager.median_per_token_ms
    # per-bin and per-prompt medians cover every row
    assert sum(b.rows for b in eager.by_length_bin.values()) == 48
    assert set(eager.by_length_bin) == {"short", "medium", "long"}
    assert len(eager.by_prompt) == 16 and all(p.rows == 3 for p in eager.by_prompt.values())
    assert eager.median_timings_ms["prefill_ms"] == pytest.approx(10.0)
    # the seam that cannot run is kept, with its reason
    assert vllm.status == "skipped" and "vLLM is not installed" in vllm.skip_reason
    assert vllm.rows == [] and vllm.median_per_token_ms is None
    assert eager.heads == [(1, 0), (2, 1)]
    assert art.divergences == []  # the two fake HF seams agree
    assert art.prompt_count == 16 and art.synthetic_weights is False


def test_rows_carry_policy_decisions():
    art = bench.run_bench(config(seams=["hf_eager"], repeats=1), runner=bench.InProcessRunner(make_fake_seam))
    row = next(r for r in art.seams[0].rows if r.id == "short_01")
    # source has 9 words, 6 committed, border 1: tokens aligned to words 0..4 are emitted
    assert row.generated_tokens == 9
    assert row.emit_count == 5 and row.emitted_text == " W0 W1 W2 W3 W4"
    assert row.policy_stop_reason == "alignatt:source_frontier"
    assert row.draft_stop_reason == "eos"
    assert row.aligned_words == list(range(9))
    assert row.prompt_tokens == 59 and row.length_bin == "short"


def test_divergences_name_the_prompt_and_the_kind():
    cfg = config(repeats=1)
    results = [
        bench.run_seam(name, cfg, make_fake_seam, progress=False)
        for name in ("hf_eager", "diverging_seam")
    ]
    div = bench.find_divergences(results)
    assert [d.id for d in div] == ["short_01"]
    assert div[0].kinds == ["decision"]  # same text drafted, a different part emitted
    assert div[0].emitted_by_seam == {"hf_eager": " W0 W1 W2 W3 W4", "diverging_seam": " W0 W1"}


def test_unknown_seam_and_bad_prompts_file_are_clear_errors(tmp_path):
    with pytest.raises(AlignattError, match="unknown seam"):
        bench.run_bench(config(seams=["hf_eagerr"]), runner=bench.InProcessRunner(make_fake_seam))
    bad = tmp_path / "prompts.json"
    bad.write_text('{"prompts": [{"id": "x"}]}')
    with pytest.raises(AlignattError, match="prompts file"):
        bench.run_bench(config(prompts_file=str(bad)), runner=bench.InProcessRunner(make_fake_seam))


def test_subprocess_worker_measures_and_records_a_crash(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)  # the worker imports the fake factory from tests/
    runner = bench.SubprocessRunner(factory=FACTORY, progress=False)
    cfg = config(repeats=1, warmup=1)
    ok = runner("hf_qk_fast", cfg)
    assert ok.status == "ok" and len(ok.rows) == 16
    skipped = runner("vllm_capture", cfg)
    assert skipped.status == "skipped" and "vLLM is not installed" in skipped.skip_reason
    crashed = runner("crash_seam", cfg)
    assert crashed.status == "skipped"
    assert "worker exited with code 3" in crashed.skip_reason


def test_artifact_round_trip_metrics_and_plot(tmp_path):
    art = bench.run_bench(config(repeats=1), runner=bench.InProcessRunner(make_fake_seam))
    path = write_artifact(tmp_path / "bench.json", art)
    again = load_artifact(path)
    assert isinstance(again, BenchArtifact) and again == art
    assert path.read_text() == write_artifact(tmp_path / "b2.json", again).read_text()
    metrics = bench.bench_metrics(art)
    assert metrics["vllm_capture"] == {"median_per_token_ms": None, "rows": 0, "status": "skipped"}
    lines = bench.latency_csv(art).splitlines()
    assert lines[0] == "prompt_no,prompt,hf_eager_ms,hf_qk_fast_ms,vllm_capture_ms"
    assert len(lines) == 17 and lines[1].startswith("1,short_01,") and lines[1].endswith(",")
    json.dumps(metrics)


PARAMS = {
    "profile": "cpu",
    "profiles": {
        "cpu": {"model": "gemma3-270m", "device": "cpu", "dtype": "float32", "bench": {"repeats": 1}},
        "h200": {"model": "gemma4-e4b-synthetic", "device": "cuda", "dtype": "bfloat16"},
    },
    "bench": {
        "max_new_tokens": 20, "heads_k": 8, "warmup": 1, "repeats": 3,
        "modes": {"eager": ["hf_eager", "hf_qk_fast", "vllm_capture"], "cudagraph": ["vllm_capture"]},
    },
}


def test_config_from_params_profiles_and_modes():
    cpu = params.config_from_params(PARAMS, "eager")
    assert (cpu.model, cpu.device, cpu.repeats, cpu.profile) == ("gemma3-270m", "cpu", 1, "cpu")
    assert cpu.seams == ["hf_eager", "hf_qk_fast", "vllm_capture"] and cpu.vllm_mode == "eager"
    gpu = params.config_from_params(PARAMS, "cudagraph", profile="h200", repeats=2)
    assert (gpu.model, gpu.dtype, gpu.repeats, gpu.seams) == ("gemma4-e4b-synthetic", "bfloat16", 2, ["vllm_capture"])
    with pytest.raises(AlignattError, match="unknown profile"):
        params.config_from_params(PARAMS, "eager", profile="tpu")
    with pytest.raises(AlignattError, match="unknown bench mode"):
        params.config_from_params(PARAMS, "graphs")


def test_repo_params_give_a_valid_config_for_every_stage():
    repo_params = params.load_params(ROOT / "params.yaml")
    for profile in repo_params["profiles"]:
        for mode in repo_params["bench"]["modes"]:
            cfg = params.config_from_params(repo_params, mode, profile=profile)
            assert cfg.seams and set(cfg.seams) <= set(bench.KNOWN_SEAMS)


def test_a_stage_measured_in_parts_merges_into_one_artifact(tmp_path):
    runner = bench.InProcessRunner(make_fake_seam)
    out = tmp_path / "bench_eager.json"
    first = bench.run_bench(config(seams=["hf_eager"], repeats=1), runner=runner)
    bench.write_bench_outputs(first, out)
    second = bench.run_bench(config(seams=["hf_qk_fast", "vllm_capture"], repeats=1), runner=runner)
    merged = bench.write_bench_outputs(second, out, plot=tmp_path / "latency.csv", add=True)
    assert [s.seam for s in merged.seams] == ["hf_eager", "hf_qk_fast", "vllm_capture"]
    assert merged.config.seams == ["hf_eager", "hf_qk_fast", "vllm_capture"]
    assert merged.provenance == first.provenance and load_artifact(out) == merged
    assert (tmp_path / "latency.csv").read_text().splitlines()[0].endswith("hf_qk_fast_ms,vllm_capture_ms")
    other = bench.run_bench(config(seams=["hf_qk_fast"], repeats=2), runner=runner)
    with pytest.raises(AlignattError, match="another session: repeats"):
        bench.write_bench_outputs(other, out, add=True)


def test_every_expected_seam_skipped_fails_and_an_expected_skip_passes(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from alignatt.cli import app

    # the CPU profile expects vllm_capture to skip: a cudagraph stage of only that seam is green
    cpu_graph = params.config_from_params(params.load_params(ROOT / "params.yaml"), "cudagraph", "cpu")
    assert cpu_graph.expect_skipped == ["vllm_capture"]
    bench.check_expected_seams(bench.run_bench(cpu_graph, bench.InProcessRunner(make_fake_seam)))
    # a profile that expects every seam to run, on a machine where none can: one line, no artifact
    gpu_graph = cpu_graph.model_copy(update={"expect_skipped": [], "profile": "h200"})
    art = bench.run_bench(gpu_graph, bench.InProcessRunner(make_fake_seam))
    with pytest.raises(AlignattError, match=r"every seam expected to run was skipped.*vllm_capture: "):
        bench.check_expected_seams(art)
    # one of several expected seams running is a (partial) result, not a failure
    eager = params.config_from_params(params.load_params(ROOT / "params.yaml"), "eager", "cpu")
    bench.check_expected_seams(bench.run_bench(eager.model_copy(update={"expect_skipped": []}),
                                               bench.InProcessRunner(make_fake_seam)))
    # through the CLI, as the DVC stage runs it
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv(bench.FACTORY_ENV, FACTORY)
    doc = params.load_params(ROOT / "params.yaml")
    doc["profiles"]["cpu"]["expect_skipped"] = []
    import yaml

    (tmp_path / "params.yaml").write_text(yaml.safe_dump(doc))
    out = tmp_path / "bench_cudagraph.json"
    r = CliRunner().invoke(app, ["bench", "--mode", "cudagraph", "--params", str(tmp_path / "params.yaml"),
                                 "--out", str(out), "--no-progress"])
    assert r.exit_code == 2, r.output
    errors = [line for line in r.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "every seam expected to run was skipped" in errors[0]
    assert not out.exists()
