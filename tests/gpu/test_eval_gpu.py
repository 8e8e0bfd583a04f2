"""`alignatt eval` on a GPU: the scored vLLM mode against eager on the same sentences (skipped without CUDA).

Run on the GPU host:  pytest tests/gpu/test_eval_gpu.py -m gpu -q -s
"""

import pytest

pytest.importorskip("torch")
from tests.gpu_marks import GPU_SERVER  # noqa: E402 - after the torch check

pytestmark = GPU_SERVER


def test_cudagraph_and_eager_give_the_same_hypotheses_and_websocket_the_same_emissions(tmp_path):
    pytest.importorskip("vllm")
    pytest.importorskip("omnisteval")
    from alignatt.evaluate.run import EvalOptions, run_eval

    options = EvalOptions(model="gemma4-e4b-synthetic", device="cuda", dtype="bfloat16", limit=2,
                          max_source_words=12, presets=["balanced"], drivers=["inprocess", "websocket"],
                          variants=["vllm_capture:cudagraph", "vllm_capture:eager"])
    a = run_eval(options, tmp_path / "eval.json")
    for c in a.checks:
        print(("ok  " if c.passed else "FAIL"), c.name, c.detail)
    assert a.synthetic_weights and all(r.label == "latency only" for r in a.rows)
    assert all(c.passed for c in a.checks)
    assert any("gives the same hypotheses" in c.name for c in a.checks)


def test_the_served_mode_sharded_over_two_replay_processes_scores_every_row(tmp_path, capfd):
    """`--engines 2` as the eval stage runs it (fullgraph, settled drafts, real weights): two replay
    processes, each with a vLLM engine process sharing the GPU, then one fresh engine under load."""
    pytest.importorskip("vllm")
    pytest.importorskip("omnisteval")
    from alignatt.evaluate.run import EvalOptions, run_eval

    options = EvalOptions(model="gemma3-270m", device="cuda", dtype="bfloat16", limit=6, presets=["balanced"],
                          tails=["gold", "asr"], asr_wers=[0.15], variants=["vllm_capture:fullgraph"],
                          settle_buffer_tokens="auto", concurrency=4, engines=2, load_levels=[2], load_sentences=2,
                          bootstrap=10)
    progress: list[str] = []
    a = run_eval(options, tmp_path / "eval.json", progress=progress.append)
    assert [(r.role, r.tail, r.driver) for r in a.rows] == [("quality", "gold", "inprocess"),
                                                             ("quality", "asr", "inprocess"),
                                                             ("quality", "none", "offline"),
                                                             ("under_load", "gold", "inprocess")]
    assert all(len(r.hypotheses) == (2 if r.role == "under_load" else 6) for r in a.rows)
    assert all(r.retractions == 0 for r in a.rows)
    assert "4 streams at once on 2 engines" in next(m for m in progress if "in-process streams" in m)
    assert (tmp_path / "eval.json").exists()
