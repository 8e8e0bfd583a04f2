"""The two transformers seams: same greedy drafts, same rows (≤ 1e-5 in fp32), faithful rebuild."""

import numpy as np
import pytest
import torch

from alignatt.core.draft import DraftRequest, Head
from alignatt.core.errors import AlignattError
from alignatt.capture.hf.eager import HFEagerSeam
from alignatt.capture.hf.qk_fast import HFQKFastSeam
from alignatt.checks.seam_parity import PARITY_TOLERANCE, compare_drafts, run_parity
from alignatt.capture.registry import SEAMS, make_seam
from tests.support.hf_cases import in_multimodal_wrapper, some_requests
from tests.gpu_marks import NEEDS_CUDA


# ---- a recording *eager* kernel: rebuild vs the weights of the very same forward ----


def _register_recording_eager():
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask
    from transformers.models.gemma4.modeling_gemma4 import eager_attention_forward

    import alignatt.capture.hf.qk_fast as hq

    def recording_eager(module, query, key, value, attention_mask, **kwargs):
        seam = hq._ACTIVE.get()
        if seam is not None:
            seam.record(module, query, key)
        return eager_attention_forward(module, query, key, value, attention_mask, **kwargs)

    AttentionInterface.register("alignatt_qk_eager_test", recording_eager)
    AttentionMaskInterface.register("alignatt_qk_eager_test", eager_mask)


class RebuildFromEagerForward(HFQKFastSeam):
    """hf_qk_fast's recorder + rebuild, but the forward runs eager: the q/k are the same tensors
    eager used for its weights, so any difference is the rebuild's own (positions, masks, GQA)."""

    name = "rebuild_on_eager"
    attn_implementation = "alignatt_qk_eager_test"

    def __init__(self, loaded, heads):
        _register_recording_eager()
        super().__init__(loaded, heads, decode="dynamic")  # eager wants additive masks, not the static path's


def max_row_diff(a, b):
    assert [t.token_id for t in a.tokens] == [t.token_id for t in b.tokens]
    return max(float(np.abs(x.rows - y.rows).max()) for x, y in zip(a.tokens, b.tokens))


# ---- tiny random Gemma-4: sliding, full and KV-shared layers; source longer than the window ----


def test_tiny_prompts_exercise_the_sliding_window(tiny_gemma4):
    window = tiny_gemma4.layout[0].sliding_window
    for _, request in some_requests():
        seam = HFQKFastSeam(tiny_gemma4, [Head(0, 0)])
        draft = seam.draft(request)
        assert len(draft.source_token_positions) > window


def test_tiny_parity_on_every_layer_kind(tiny_gemma4):
    report = run_parity("tiny-gemma4", requests=some_requests())
    assert set(report.layer_kinds) == {"sliding", "full", "sliding+shared", "full+shared"}
    assert len(report.heads) == 32
    assert report.rows_compared >= 4 * 32 * 5
    assert report.drafts_identical
    assert report.max_abs_row_diff <= PARITY_TOLERANCE
    assert report.max_abs_mass_diff <= PARITY_TOLERANCE
    assert report.passed


def test_rebuild_equals_eager_weights_of_the_same_forward(tiny_gemma4):
    heads = tiny_gemma4.layout.all_heads()
    for _, request in some_requests():
        eager = HFEagerSeam(tiny_gemma4, heads).draft(request)
        rebuilt = RebuildFromEagerForward(tiny_gemma4, heads).draft(request)
        assert max_row_diff(eager, rebuilt) <= PARITY_TOLERANCE


def test_parity_catches_a_wrong_cache_index_to_position_map(tiny_gemma4, monkeypatch):
    """Control: the check can fail. Treat the decode-time sliding keys as positions 0..n-1."""
    import alignatt.capture.hf.qk_fast as hq

    monkeypatch.setattr(hq, "key_positions", lambda qpos, n, device: torch.arange(n, device=device))
    sliding = [h for h in tiny_gemma4.layout.all_heads() if tiny_gemma4.layout[h.layer].kind == "sliding"]
    _, request = some_requests()[0]
    eager = HFEagerSeam(tiny_gemma4, sliding).draft(request)
    wrong = HFQKFastSeam(tiny_gemma4, sliding).draft(request)
    _, rows, _, _ = compare_drafts(eager, wrong)
    assert rows > 1e-2


def test_rows_and_masses_split_the_whole_attention(tiny_gemma4):
    heads = tiny_gemma4.layout.all_heads()
    for seam_cls in (HFEagerSeam, HFQKFastSeam):
        for _, request in some_requests(6):
            draft = seam_cls(tiny_gemma4, heads).draft(request)
            for t in draft.tokens:
                total = t.rows.sum(axis=1) + t.other_prompt_mass + t.generated_mass
                np.testing.assert_allclose(total, 1.0, atol=1e-5)
                assert t.rows.dtype == np.float32 and t.rows.shape == (32, len(draft.source_token_positions))
                mass = t.mass(draft.source_word_of_token, request.committed_words)
                assert abs(sum(mass.values()) - 1.0) < 1e-5
            if request.target_prefix:  # the accepted prefix counts as generated from the start
                assert all(t.generated_mass.max() > 0 for t in draft.tokens)


def test_sliding_rows_are_zero_outside_the_window(tiny_gemma4):
    layout = tiny_gemma4.layout
    heads = layout.all_heads()
    _, request = some_requests()[0]
    draft = HFQKFastSeam(tiny_gemma4, heads).draft(request)
    positions = np.array(draft.source_token_positions)
    checked = 0
    for i, t in enumerate(draft.tokens):
        query_position = draft.prompt_token_count - 1 + i
        for j, h in enumerate(heads):
            window = layout[h.layer].sliding_window
            if window is None:
                assert t.rows[j].sum() > 0
                continue
            outside = positions <= query_position - window
            assert np.all(t.rows[j][outside] == 0.0)
            checked += int(outside.sum())
    assert checked > 0


def test_drafts_are_greedy_deterministic_and_timed(tiny_gemma4):
    seam = HFQKFastSeam(tiny_gemma4, [Head(2, 1), Head(7, 0)])
    request = DraftRequest(source_words="we carefully keep only the useful rows".split(), committed_words=4,
                           max_new_tokens=7)
    a, b = seam.draft(request), seam.draft(request)
    assert [t.token_id for t in a.tokens] == [t.token_id for t in b.tokens]
    assert len(a.tokens) <= 7 and a.stop_reason in ("eos", "max_new_tokens")
    assert a.seam == "hf_qk_fast" and a.heads == [Head(2, 1), Head(7, 0)]
    assert a.timings.prefill_ms > 0 and a.timings.reconstruct_ms > 0
    if len(a.tokens) > 1:
        assert a.timings.decode_ms > 0
    assert a.text == tiny_gemma4.tokenizer.decode([t.token_id for t in a.tokens])


def test_a_stop_token_ends_the_draft(tiny_gemma4):
    seam = HFEagerSeam(tiny_gemma4, [Head(4, 0)])
    request = DraftRequest(source_words="the policy now rejects the risky word".split(), committed_words=3,
                           max_new_tokens=8)
    full = seam.draft(request)
    ids = [t.token_id for t in full.tokens]
    k = next(i for i, tok in enumerate(ids) if tok not in ids[:i])
    seam.stop_ids = {ids[k]}
    stopped = seam.draft(request)
    assert stopped.stop_reason == "eos"
    assert [t.token_id for t in stopped.tokens] == ids[:k]


def test_seams_run_on_the_multimodal_wrapper_of_it_checkpoints(tiny_gemma4):
    """google/gemma-4-E4B-it loads as Gemma4ForConditionalGeneration: same text model inside."""
    loaded = in_multimodal_wrapper(tiny_gemma4)
    heads = loaded.layout.all_heads()
    _, request = some_requests(6)[0]
    eager = HFEagerSeam(loaded, heads).draft(request)
    fast = HFQKFastSeam(loaded, heads).draft(request)
    plain = HFQKFastSeam(tiny_gemma4, heads).draft(request)
    compared, rows, _, same = compare_drafts(eager, fast)
    assert same and compared > 0 and rows <= PARITY_TOLERANCE
    assert [t.token_id for t in fast.tokens] == [t.token_id for t in plain.tokens]


def test_make_seam_errors():
    assert SEAMS == ("hf_eager", "hf_qk_fast", "vllm_capture")
    with pytest.raises(AlignattError, match="unknown seam 'nope'"):
        make_seam("nope", model="tiny-gemma4")
    with pytest.raises(AlignattError, match="does not take vllm_mode"):
        make_seam("hf_eager", model="tiny-gemma4", heads=[Head(0, 0)], vllm_mode="eager")
    with pytest.raises(AlignattError, match="out of range"):
        make_seam("hf_qk_fast", model="tiny-gemma4", heads=[Head(0, 9)])
    if not torch.cuda.is_available():
        with pytest.raises(AlignattError, match="vllm_capture needs CUDA and vLLM 0.22.1"):
            make_seam("vllm_capture", model="tiny-gemma4", heads=[Head(0, 0)])


# ---- the embedded real model ----


@pytest.mark.slow
def test_embedded_gemma3_parity(gemma3_270m):
    report = run_parity("gemma3-270m", requests=some_requests(8))
    assert report.drafts_identical
    assert report.max_abs_row_diff <= PARITY_TOLERANCE, report.max_abs_row_diff
    assert report.passed


@pytest.mark.slow
def test_embedded_gemma3_rebuild_equals_eager_weights(gemma3_270m):
    heads = gemma3_270m.layout.all_heads()
    _, request = some_requests(6)[1]
    eager = HFEagerSeam(gemma3_270m, heads).draft(request)
    rebuilt = RebuildFromEagerForward(gemma3_270m, heads).draft(request)
    assert max_row_diff(eager, rebuilt) <= PARITY_TOLERANCE


@pytest.mark.slow
def test_embedded_gemma3_few_shot_draft_ends_at_the_line_break(gemma3_270m):
    seam = HFQKFastSeam(gemma3_270m, [Head(5, 0)])
    draft = seam.draft(DraftRequest(source_words="The house is small.".split(), committed_words=4,
                                    max_new_tokens=20))
    assert draft.stop_reason == "eos" and "\n" not in draft.text
    assert draft.text.strip()


# ---- GPU (the owner's H200 run) ----


@pytest.mark.gpu
@NEEDS_CUDA
def test_tiny_parity_on_cuda_fp32():
    report = run_parity("tiny-gemma4", device="cuda", dtype="float32", requests=some_requests())
    assert report.drafts_identical
    assert report.max_abs_row_diff <= PARITY_TOLERANCE, report.max_abs_row_diff


@pytest.mark.gpu
@NEEDS_CUDA
def test_e4b_architecture_rebuild_equals_eager_weights_on_cuda_fp32():
    """Full E4B geometry (head dims 256/512, GQA 8/2, KV-shared layers 24-41) in fp32 on CUDA."""
    from alignatt.models.presets import load_model

    loaded = load_model("gemma4-e4b-synthetic", device="cuda", dtype="float32")
    layout = loaded.layout
    heads = [Head(layer, h) for layer in (0, 5, 22, 23, 24, 29, 40, 41) for h in (0, 7)]
    assert {layout[h.layer].kv_shared for h in heads} == {True, False}
    _, request = some_requests(6)[-1]
    eager = HFEagerSeam(loaded, heads).draft(request)
    rebuilt = RebuildFromEagerForward(loaded, heads).draft(request)
    fast = HFQKFastSeam(loaded, heads).draft(request)
    assert max_row_diff(eager, rebuilt) <= 1e-5
    _, rows, _, _ = compare_drafts(eager, fast)
    print(f"E4B-synthetic fp32 cuda: eager vs qk_fast max |row diff| {rows:.3g}")


@pytest.mark.gpu
@NEEDS_CUDA
def test_e4b_architecture_bf16_seams_draft_on_cuda():
    from alignatt.models.presets import load_model

    loaded = load_model("gemma4-e4b-synthetic", device="cuda", dtype="bfloat16")
    heads = [Head(22, 3), Head(23, 1), Head(29, 4), Head(41, 6)]
    _, request = some_requests(8)[1]
    for seam_cls in (HFEagerSeam, HFQKFastSeam):
        draft = seam_cls(loaded, heads).draft(request)
        assert len(draft.tokens) >= 1
        for t in draft.tokens:
            np.testing.assert_allclose(t.rows.sum(1) + t.other_prompt_mass + t.generated_mass, 1.0, atol=2e-2)
