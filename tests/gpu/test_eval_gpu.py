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
