"""GPU: the embedded Gemma-3-270M, real weights, under vllm_capture: the same tokens as
transformers' eager seam and rows within the fp32 cross-engine bound, in eager and under full
decode CUDA graphs. Gemma-3 differs from Gemma-4 where the capture looks: no KV-shared layers,
one KV head, scores scaled by query_pre_attn_scalar, and vLLM would pick FLASH_ATTN for it (the
seam asks for TRITON_ATTN, whose KV cache the capture reads). Skipped without CUDA, vLLM or the
embedded weights (the package, or the converted checkpoint under ALIGNATT_CACHE)."""

import pytest

from alignatt.checks.cross_engine import FP32_ROW_MAX_ABS
from alignatt.checks.messages import ALIGN_AGREEMENT_MIN
from alignatt.core.draft import DraftRequest
from tests.gpu_marks import GPU

pytestmark = GPU

SOURCES = ["The house is small and the garden is large .",
           "We will meet at the station tomorrow morning before the train leaves .",
           "Our small team wrote the report in three weeks ."]


def _requests() -> list[DraftRequest]:
    out = []
    for text in SOURCES:
        words = text.split()
        out.append(DraftRequest(source_words=words, committed_words=len(words) - 2, max_new_tokens=12))
        out.append(DraftRequest(source_words=words, committed_words=len(words), max_new_tokens=24, final=True))
    return out


@pytest.fixture
def embedded_weights():
    from alignatt.models.embedded import EMBEDDED_PACKAGE, embedded_model_dir

    pytest.importorskip("vllm", reason="needs vLLM 0.22.1")
    try:
        __import__(EMBEDDED_PACKAGE)
    except ImportError:
        if not (embedded_model_dir() / "config.json").exists():
            pytest.skip("needs the embedded Gemma-3-270M (alignatt[embedded], or its converted checkpoint)")


@pytest.mark.parametrize("mode", ["eager", "cudagraph"])
def test_gemma3_under_vllm_drafts_what_transformers_drafts_in_fp32(embedded_weights, mode, tmp_path, monkeypatch):
    from alignatt.capture.registry import make_seam
    from alignatt.checks.seam_parity import compare_drafts
    from alignatt.heads.sets import default_heads

    # IEEE fp32 in vLLM's Triton attention too (a fresh kernel cache, so no TF32 kernel is reused)
    monkeypatch.setenv("TRITON_F32_DEFAULT", "ieee")
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    heads = default_heads("gemma3-270m", 8)
    requests = _requests()
    vllm_seam = make_seam("vllm_capture", "gemma3-270m", heads, device="cuda", dtype="float32", vllm_mode=mode,
                          kv_cache_memory_gib=1.0)
    try:
        assert vllm_seam.describe()["attention_backend"] == ["TRITON_ATTN"]
        got = [vllm_seam.draft(r) for r in requests]
    finally:
        vllm_seam.close()
    hf = make_seam("hf_eager", "gemma3-270m", heads, device="cuda", dtype="float32")
    agree = total = 0
    for request, v in zip(requests, got):
        h = hf.draft(request)
        n, rows, _, identical = compare_drafts(h, v)
        assert identical, (request.source_words, h.text, v.text)
        assert n and rows <= FP32_ROW_MAX_ABS, (request.source_words, rows)
        for a, b in zip(h.tokens, v.tokens):
            agree += int((a.rows.argmax(-1) == b.rows.argmax(-1)).sum())
            total += a.rows.shape[0]
    assert agree / total >= ALIGN_AGREEMENT_MIN
    assert any(d.text.strip() for d in got)  # real weights translate something
