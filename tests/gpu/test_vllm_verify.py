"""GPU: verified re-drafts in vllm_capture (vLLM's speculative decoding, the previous draft as the
proposer) on the reduced Gemma-4 in fp32: tokens identical to from-scratch drafts, rows within the
fp32 bound, and the proposal actually accepted (fewer forward steps). Each engine runs in its own
process (tests/gpu/verify_worker.py) and its results serve every test of its mode, so the module's
tests run together in one child (`gpu_module`): three engine starts, not nine.
`pytest -m gpu tests/gpu/test_vllm_verify.py -x -q`."""

import json
from pathlib import Path

import numpy as np
import pytest

from alignatt.checks.cross_engine import FP32_ROW_MAX_ABS
from alignatt.checks.messages import ALIGN_AGREEMENT_MIN
from tests.gpu.worker_run import run_worker
from tests.gpu_marks import GPU_MODULE

pytestmark = GPU_MODULE

HEADS = [(0, 1), (1, 2), (2, 5), (3, 4), (5, 6), (8, 0), (10, 6), (11, 3)]  # sliding, full and KV-shared layers
TOKENS = 12
# A verified token's rows come from a multi-token verifying step, the from-scratch one's from a
# one-token decode step: other GEMM shapes, so fp32 rounding differs as with prefix caching, and
# the bound is the one the cross-engine fp32 parity (and the prefix-caching test) holds.
ROW_TOL = FP32_ROW_MAX_ABS


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    pytest.importorskip("vllm", reason="needs vLLM 0.22.1")
    return tmp_path_factory.mktemp("vllm_verify")


_RUNS: dict = {}


def run(workdir: Path, mode: str, verify: bool = True) -> dict:
    key = (mode, verify)
    if key in _RUNS:
        return _RUNS[key]
    name = f"{mode}_{'verify' if verify else 'scratch'}"
    spec = {"checkpoint": str(workdir / "reduced-gemma4"), "dtype": "float32", "mode": mode, "heads": HEADS,
            "tokens": TOKENS, "kv_cache_memory_gib": 0.5, "verify": verify}
    _RUNS[key] = run_worker("tests.gpu.verify_worker", workdir, name, spec, fp32=True)
    return _RUNS[key]


def pairs(result: dict, kind: str):
    n = sum(1 for k in result if k.startswith("scratch_") and k.endswith("_tokens"))
    for i in range(n):
        if f"{kind}_{i}_tokens" in result:
            yield i, result[f"scratch_{i}_tokens"], result[f"scratch_{i}_rows"], result[f"{kind}_{i}_tokens"], \
                result[f"{kind}_{i}_rows"], result[f"{kind}_{i}_acceptance"], result[f"scratch_{i}_acceptance"]


@pytest.mark.parametrize("mode", ["eager", "fullgraph"])
@pytest.mark.parametrize("kind", ["whole", "first", "partial", "previous"])
def test_verified_drafts_equal_from_scratch_drafts(workdir, mode, kind):
    result = run(workdir, mode)
    seen = 0
    for i, t_s, r_s, t_v, r_v, acc, acc_s in pairs(result, kind):
        assert np.array_equal(t_s, t_v), (kind, i)
        assert float(np.abs(r_s - r_v).max()) <= ROW_TOL, (kind, i)
        assert float((r_s.argmax(-1) == r_v.argmax(-1)).mean()) >= ALIGN_AGREEMENT_MIN
        proposed, accepted, _, steps = acc.tolist()
        assert proposed == TOKENS - 1
        if kind == "whole":
            assert accepted == proposed and steps <= 3 < int(acc_s[3]), "the proposal was not verified in one step"
        elif kind == "first":
            assert accepted == 0
        elif kind == "partial":
            assert accepted == 2
        seen += 1
    assert seen >= 3


def test_verification_off_drafts_from_scratch(workdir):
    result = run(workdir, "fullgraph", verify=False)
    for i, t_s, r_s, t_v, r_v, acc, acc_s in pairs(result, "whole"):
        assert np.array_equal(t_s, t_v) and np.array_equal(r_s, r_v)  # the proposal is ignored: same engine path
        assert int(acc[0]) == 0 and int(acc[3]) == int(acc_s[3])  # nothing proposed to the engine


@pytest.mark.parametrize("mode,verify", [("eager", True), ("fullgraph", True), ("fullgraph", False)])
def test_a_settled_draft_is_the_whole_draft_cut_at_its_answer(workdir, mode, verify):
    """Stopped in the engine at the first held token plus the buffer: the same tokens as the whole
    draft cut there, rows within the fp32 bound, and fewer forward steps than the whole draft."""
    result = run(workdir, mode, verify)
    n = sum(1 for k in result if k.startswith("settled_") and k.endswith("_tokens"))
    stopped = 0
    for i in range(n):
        expected, settled = result[f"expected_{i}_tokens"], result[f"settled_{i}_tokens"]
        assert np.array_equal(settled, expected), i
        assert str(result[f"settled_{i}_stop"]) == str(result[f"expected_{i}_stop"]), i
        rows_e, rows_s = result[f"expected_{i}_rows"], result[f"settled_{i}_rows"]
        assert float(np.abs(rows_e - rows_s).max()) <= ROW_TOL, i
        if str(result[f"settled_{i}_stop"]) == "settled":
            assert len(settled) == 3
            assert int(result[f"settled_{i}_acceptance"][3]) < int(result[f"unsettled_{i}_acceptance"][3])
            stopped += 1
    assert n >= 3 and stopped >= 1


@pytest.mark.parametrize("mode", ["eager", "fullgraph"])
def test_the_load_stages_verified_against_scratch_count_finds_nothing_in_fp32(workdir, mode):
    """`measure/verify_equality.py`, which the load stage runs for a +verify configuration: in fp32
    no draft, emitted text or decision differs, the whole proposal is kept, rows within the bound."""
    got = json.loads(str(run(workdir, mode)["equality"]))
    assert got["prompts"] >= 3 and got["tokens_differ"] == got["texts_differ"] == got["decisions_differ"] == 0
    assert got["accepted"] == got["proposed"] > 0 and got["row_max_abs_diff"] <= ROW_TOL
