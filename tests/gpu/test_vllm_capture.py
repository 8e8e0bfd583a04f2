"""GPU: the naive-vs-fixed capture under real CUDA-graph replay (plain torch), and the vLLM
capture checks of issue 3 (full graphs vs eager bit-exact, batch, cross-engine parity in fp32 and
bf16, compiled and FP8 self-consistency, on E4B and on the reduced checkpoint). Skipped without CUDA; the
vLLM ones also without vLLM 0.22.1.

The vLLM checks are the same functions `alignatt check-vllm` runs, each in a child of its own
(tests/gpu_isolation.py) that starts the check's engines in worker processes; each check has its
own work dir, so the compiled checks' optional comparison with eager drafts says "unavailable"."""

import json

import pytest

from alignatt.checks.graph_replay import naive_vs_fixed
from alignatt.checks.vllm_checks import ChecksOptions
from tests.gpu_marks import GPU

pytestmark = GPU


def test_cuda_graph_replay_breaks_the_naive_capture_and_not_the_slot_addressed_one():
    eager = naive_vs_fixed("cuda", replay=False)
    graph = naive_vs_fixed("cuda", replay=True)
    assert eager["naive_list"]["ok"] and eager["fixed"]["ok"]
    assert not graph["naive_list"]["ok"], json.dumps(graph["naive_list"])
    assert graph["naive_list"]["last_entry_holds_last_step"]  # its pool tensor was overwritten
    assert graph["fixed"]["ok"] and graph["fixed"]["stray_writes_max_abs"] == 0.0
    assert not graph["naive_position_scatter"]["ok"]


@pytest.fixture(scope="module")
def check_args(tmp_path_factory):
    pytest.importorskip("vllm", reason="needs vLLM 0.22.1")
    workdir = tmp_path_factory.mktemp("vllm_checks")
    return ChecksOptions(workdir=str(workdir), tokens=20, repeats=3, tokenizer="auto", budget_s=1e9,
                              worker_timeout=600.0, worker_timeout_compiled=600.0)


def _run(name, check_args):
    from pathlib import Path

    from alignatt.checks.vllm_checks import run_checks

    out = Path(check_args.workdir) / f"{name}.json"
    artifact = run_checks([name], out, check_args)
    return artifact["checks"][name]


def _assert_self_consistent(result):
    # A worker that failed leaves no self_consistency: show its error and traceback, not a KeyError.
    assert "self_consistency" in result, json.dumps(result, indent=1)
    assert result["self_consistency"]["status"] == "passed", json.dumps(result["self_consistency"], indent=1)


def test_full_decode_graphs_match_eager_bit_for_bit_and_batches_keep_their_rows(check_args):
    result = _run("exact", check_args)
    cmp = result["cudagraph_vs_eager"]
    assert not result["draft_variety"]["degenerate"], result["draft_variety"]  # real activations
    assert cmp["rows"] == 48 and cmp["bit_identical_rows"] == 48, cmp["differing"]
    assert cmp["identical_drafts"] == cmp["identical_decisions"] == 48
    assert result["passed_batch"], json.dumps(result["batch"], indent=1)
    for mode, sc in result["self_consistency"].items():
        assert sc["status"] == "passed", (mode, json.dumps(sc, indent=1))


def test_vllm_agrees_with_transformers_in_fp32_and_bf16_is_reported_against_its_noise(check_args):
    result = _run("parity", check_args)
    assert result["passed_self_consistency"], json.dumps([result["vllm_bf16"], result["vllm_fp32"]], indent=1)
    assert result["vllm_fp32"]["triton_f32_default"] == "ieee"
    layers = result["fp32"]["layers"]
    assert result["passed_fp32_strict"], json.dumps(layers, indent=1)
    assert all(s["aligned_agreement"] >= 0.95 for s in layers.values())
    assert result["bf16"]["no_capture_fault"], json.dumps(result["bf16"]["layers"], indent=1)


def test_compiled_mode_is_self_consistent(check_args):
    result = _run("compiled", check_args)
    _assert_self_consistent(result)
    assert not result["draft_variety"]["degenerate"]


def test_fp8_weights_are_self_consistent_in_the_served_mode(check_args):
    result = _run("fp8", check_args)
    _assert_self_consistent(result)
    assert not result["draft_variety"]["degenerate"]
    assert result["fp8"]["describe"]["quantization"] == "fp8"
    assert result["fp8"]["describe"]["synthetic_init_unknown"] == []  # every FP8 weight drawn, with its scale


def test_compiled_mode_is_self_consistent_on_the_reduced_checkpoint(check_args):
    result = _run("compiled_reduced", check_args)
    _assert_self_consistent(result)
