"""The CPU-runnable parts of the vLLM capture checks: the reduced Gemma-4 checkpoint (with the
k_norm vLLM needs), the transformers teacher-forced q/k recorder (checked against the real
`hf_qk_fast` seam), draft comparisons, and clean refusals where CUDA or vLLM is missing."""

import json

import numpy as np
import pytest
import torch
from safetensors import safe_open

from alignatt.capture import Head
from alignatt.errors import AlignattError
from alignatt.vllm_checks import (
    PARITY_HEADS,
    build_reduced_checkpoint,
    compare_batch,
    compare_drafts,
    draft_record,
    main,
    teacher_forced_qk,
    timing_summary,
)
from tests.drafts import make_draft

TINY_SIZES = {"hidden_size": 64, "intermediate_size": 128, "hidden_size_per_layer_input": 8,
              "vocab_size": 512, "vocab_size_per_layer_input": 512}


@pytest.fixture(scope="module")
def reduced(tmp_path_factory):
    from alignatt.models import tiny_tokenizer

    target = tmp_path_factory.mktemp("reduced") / "ckpt"
    info = build_reduced_checkpoint(target, tiny_tokenizer(), sizes=TINY_SIZES, device="cpu")
    return target, info


def test_reduced_checkpoint_has_every_layer_kind_and_k_norm_on_shared_layers(reduced):
    target, info = reduced
    config = json.loads((target / "config.json").read_text())
    assert config["architectures"] == ["Gemma4ForCausalLM"] and config["model_type"] == "gemma4_text"
    kinds = config["layer_types"]
    assert kinds == ["sliding_attention"] * 5 + ["full_attention"] + ["sliding_attention"] * 5 + ["full_attention"]
    assert info["kv_shared"] == [8, 9, 10, 11] and info["k_norm_added_on"] == [8, 9, 10, 11]
    keys = set()
    for f in target.glob("*.safetensors"):
        with safe_open(str(f), "pt") as st:
            keys |= set(st.keys())
    for layer in range(12):
        assert f"model.layers.{layer}.self_attn.k_norm.weight" in keys
    assert "model.layers.9.self_attn.k_proj.weight" not in keys  # shared layers own no keys
    with safe_open(str(next(target.glob("*.safetensors"))), "pt") as st:
        if "model.layers.10.self_attn.k_norm.weight" in st.keys():
            assert torch.equal(st.get_tensor("model.layers.10.self_attn.k_norm.weight").float(), torch.ones(256))


@pytest.mark.slow
def test_teacher_forced_recorder_rebuilds_the_hf_qk_fast_seam_rows(reduced):
    """The transformers side of the parity check, on CPU: recording q/k over prompt + the seam's
    own drafted tokens and rebuilding rows reproduces what `hf_qk_fast` returned."""
    from alignatt.capture import DraftRequest
    from alignatt.prompt import build_prompt
    from alignatt.qcache import plan_capture, rebuild_rows, split_rows
    from alignatt.seams import make_seam

    target, _ = reduced
    heads = [Head(l, h) for l, h in PARITY_HEADS]
    seam = make_seam("hf_qk_fast", model=str(target), heads=heads, device="cpu", dtype="float32")
    req = DraftRequest(source_words="the model gives itself more context".split(), committed_words=4,
                       max_new_tokens=6)
    draft = seam.draft(req)
    assert draft.tokens, "the random model stopped at once; pick another prompt"
    plans = plan_capture(seam.loaded.layout, heads)
    prompt = build_prompt(seam.loaded.tokenizer, req)
    qk = teacher_forced_qk(seam.loaded.model, plans, prompt.input_ids, [t.token_id for t in draft.tokens])
    order = [(h.layer, plans[h.layer].heads.index(h.head)) for h in heads]
    rebuilt = {}
    for layer, plan in plans.items():
        q, k, qpos = qk[layer]
        probs = rebuild_rows(plan, q, qpos, k, torch.arange(k.shape[0]))
        rebuilt[layer] = split_rows(probs, 0, prompt.source_token_positions, prompt.prefix_start)
    rows = torch.stack([rebuilt[l].rows[:, i] for l, i in order], dim=1).numpy()
    want = np.stack([t.rows for t in draft.tokens])
    assert rows.shape == want.shape
    # one full-sequence forward vs the seam's incremental decode: fp32 GEMMs of other shapes
    assert np.abs(rows - want).max() <= 1e-4
    assert np.array_equal(rows.argmax(-1), want.argmax(-1))


def _record(pid, draft, repeat=0):
    return draft_record(pid, repeat, draft, decision_heads=2)


def test_compare_drafts_counts_identical_rows_and_names_differences():
    words = "a b c d".split()
    d1 = make_draft(words, [" x", " y", " z"], [0, 1, 2], committed_words=2)
    d2 = make_draft(words, [" x", " y", " z"], [0, 1, 2], committed_words=2)
    d3 = make_draft(words, [" x", " y", " z"], [0, 3, 2], committed_words=2)  # attends to the tail
    a = [_record("p1", d1), _record("p2", d2)]
    b = [_record("p1", d2), _record("p2", d3)]
    cmp = compare_drafts(a, b)
    assert cmp["rows"] == 2 and cmp["identical_drafts"] == 2
    assert cmp["bit_identical_rows"] == 1 and cmp["identical_decisions"] == 1
    assert cmp["differing"] == ["p2#0: decision"]
    assert cmp["max_abs_row_diff"] > 0


def test_compare_batch_wants_each_requests_own_rows():
    words = "a b c d".split()
    alone = [_record("p1", make_draft(words, [" x", " y"], [0, 1])),
             _record("p2", make_draft(words, [" u", " v"], [2, 3]))]
    ok = compare_batch([_record("p1", make_draft(words, [" x", " y"], [0, 1]), -1)], alone)
    assert ok["passed"] and ok["requests"][0]["aligned_agreement"] == 1.0
    swapped = [_record("p1", make_draft(words, [" x", " y"], [2, 3]), -1)]  # p2's attention
    assert not compare_batch(swapped, alone)["passed"]


def test_timing_summary_defines_per_token_once():
    d = make_draft("a b".split(), [" x", " y", " z"], [0, 1, 1])
    d.timings.prefill_ms, d.timings.decode_ms, d.timings.capture_ms, d.timings.reconstruct_ms = 30, 20, 3, 7
    s = timing_summary([_record("p", d)])
    assert s["per_token_ms"] == 20.0 and s["decode_ms_per_token"] == 10.0
    assert s["fetch_ms"] == 3 and s["reconstruct_ms"] == 7


def test_demo_check_writes_its_artifact_without_cuda(tmp_path):
    out = tmp_path / "checks.json"
    rc = main(["demo", "--out", str(out), "--workdir", str(tmp_path / "w")])
    data = json.loads(out.read_text())
    demo = data["checks"]["demo"]
    assert demo["cpu_replayed"]["fixed"]["ok"] and not demo["cpu_replayed"]["naive_list"]["ok"]
    if not torch.cuda.is_available():
        assert rc == 1 and data["summary"]["demo"] == "failed" and "no CUDA" in demo["note"]
    assert "provenance" in data


def test_unknown_check_names_are_refused(tmp_path):
    with pytest.raises(SystemExit) as e:
        main(["all", "--out", str(tmp_path / "x.json"), "--only", "demo,bogus"])
    assert e.value.code == 2


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_vllm_seam_refuses_cleanly_without_cuda():
    from alignatt.seams import make_seam
    from alignatt.vllm_capture import VllmCaptureSeam

    with pytest.raises(AlignattError, match="CUDA"):
        make_seam("vllm_capture", model="gemma4-e4b-synthetic", heads=[Head(11, 3)], vllm_mode="cudagraph")
    with pytest.raises(AlignattError, match="CUDA"):
        VllmCaptureSeam("gemma4-e4b-synthetic", [Head(11, 3)])
    with pytest.raises(AlignattError, match="unknown vllm_mode"):
        VllmCaptureSeam("gemma4-e4b-synthetic", [Head(11, 3)], vllm_mode="turbo")
