"""The vllm_capture seam's fetch + reconstruct path on CPU, with stand-ins for the engine objects
it reads (KV caches, KV-cache groups with different block sizes, a KV-shared layer reading its
donor's cache, recorded block ids): rows must equal dense attention over the request's own
sequence, and the mass split must match the prompt layout."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch

import alignatt.capture.vllm.seam as vc
import alignatt.capture.vllm.hooks as vh
from alignatt.core.draft import Head, attention_row
from alignatt.core.layout import AttentionLayout, LayerAttention
from alignatt.capture.vllm.qcache import QueryCache, head_order, kernel_block_ids, plan_capture, slots_for_positions


def layout() -> AttentionLayout:
    def la(i, kind, dim, window, src):
        return LayerAttention(layer=i, kind=kind, head_dim=dim, n_heads=4, n_kv_heads=2, scaling=0.5,
                              sliding_window=window, kv_source_layer=src)

    # 0: sliding (window 8), 1: full (dim 16), 2: KV-shared sliding layer reading layer 0's cache
    return AttentionLayout(family="gemma4_text", layers=[la(0, "sliding", 8, 8, 0), la(1, "full", 16, None, 1),
                                                         la(2, "sliding", 8, 8, 0)])


@pytest.fixture
def engine(monkeypatch):
    torch.manual_seed(0)
    lay = layout()
    heads = [Head(0, 1), Head(1, 3), Head(2, 2), Head(0, 3)]
    plans = plan_capture(lay, heads)
    n_prompt, n = 14, 5
    T = n_prompt + n - 1  # the last drafted token is never fed back
    # group 0 (sliding layers): 16-token kernel blocks; group 1 (full): manager blocks of 16 split in 2x8
    groups = {0: SimpleNamespace(block_size=16, blocks_per_kv_block=1),
              1: SimpleNamespace(block_size=8, blocks_per_kv_block=2)}
    block_ids = ([3, 0], [5, 1])  # manager block ids per group for this request
    kv = {0: torch.zeros(6, 2, 16, 2, 8), 1: torch.zeros(12, 2, 8, 2, 16)}
    seq_keys = {0: torch.randn(T, 2, 8), 1: torch.randn(T, 2, 16)}
    seq_q = {0: torch.randn(T, 4, 8), 1: torch.randn(T, 4, 16), 2: torch.randn(T, 4, 8)}
    group_of = {0: 0, 1: 1, 2: 0}
    caches = {}
    for layer, plan in plans.items():
        g = group_of[layer]
        blocks = kernel_block_ids(block_ids[g], groups[g].blocks_per_kv_block)
        slots = slots_for_positions(blocks, groups[g].block_size, torch.arange(T))
        cache = QueryCache(kv[g].shape[0] * kv[g].shape[2], len(plan.heads), plan.head_dim, torch.float32, "cpu",
                           plan.heads)
        cache.write(seq_q[layer].reshape(T, -1), slots)
        caches[layer] = cache
        if layer != 2:  # the shared layer writes no keys of its own
            src = seq_keys[g]
            kv[g][slots // groups[g].block_size, 0, slots % groups[g].block_size] = src
    attn = {0: SimpleNamespace(kv_cache=kv[0]), 1: SimpleNamespace(kv_cache=kv[1]), 2: SimpleNamespace(kv_cache=kv[0])}
    runner = SimpleNamespace(input_batch=SimpleNamespace(block_table=[groups[0], groups[1]]))
    hooks = vh.Hooks(plans=plans, capture_output=False, runner=runner, attn=attn, group=group_of, caches=caches,
                      block_ids={"req-1": block_ids})
    monkeypatch.setattr(vh, "_HOOKS", hooks)
    from alignatt.models.presets import tiny_tokenizer

    seam = object.__new__(vc.VllmCaptureSeam)
    seam.plans, seam.order, seam.heads = plans, head_order(plans, heads), heads
    seam.tokenizer, seam.capture, seam.capture_output = tiny_tokenizer(), True, False
    seam.keep_raw, seam.reconstruct, seam.raw, seam.hooks = True, "batched", {}, hooks
    source = [3, 4, 5, 7, 9, 10]
    prompt = SimpleNamespace(input_ids=list(range(100, 100 + n_prompt)), source_token_positions=source,
                             prefix_start=12)
    return dict(seam=seam, prompt=prompt, n=n, n_prompt=n_prompt, seq_keys=seq_keys, seq_q=seq_q, plans=plans,
                heads=heads, hooks=hooks)


def test_fetch_rebuilds_each_heads_rows_through_block_tables_and_donor_caches(engine):
    from alignatt.core.draft import Timings

    seam, prompt, n, n_prompt = engine["seam"], engine["prompt"], engine["n"], engine["n_prompt"]
    tokens = [ord(c) for c in "hallo"][:n]
    timings = Timings()
    caps = seam._captures("req-1", prompt, tokens, timings)
    assert len(caps) == n and "req-1" not in engine["hooks"].block_ids  # consumed
    assert timings.capture_ms > 0 and timings.reconstruct_ms > 0
    key_group = {0: 0, 1: 1, 2: 0}  # layer 2 reads layer 0's (group 0) keys
    for t in range(n):
        p = n_prompt - 1 + t
        for i, h in enumerate(engine["heads"]):
            plan = engine["plans"][h.layer]
            keys = engine["seq_keys"][key_group[h.layer]][: p + 1, plan.kv_heads[plan.heads.index(h.head)]]
            want = attention_row(engine["seq_q"][h.layer][p, h.head][None], keys[None], torch.arange(p + 1), p,
                                 plan.scaling, plan.sliding_window)[0]
            got = caps[t].rows[i]
            np.testing.assert_allclose(got, want[prompt.source_token_positions].numpy(), atol=1e-6)
            gen = float(want[prompt.prefix_start:].sum())
            other = float(want.sum()) - gen - float(want[prompt.source_token_positions].sum())
            assert abs(caps[t].generated_mass[i] - gen) < 1e-6
            assert abs(caps[t].other_prompt_mass[i] - other) < 1e-6
    # sliding layers see at most 8 keys: the earliest source tokens are invisible to late tokens
    assert caps[-1].rows[0][0] == 0.0 and caps[-1].rows[1][0] > 0.0  # head 0 sliding, head 1 full
    raw = seam.raw["req-1"]
    assert raw.query_positions.tolist() == list(range(n_prompt - 1, n_prompt - 1 + n))


def test_fetch_without_a_recorded_block_table_fails_loudly(engine):
    from alignatt.core.draft import Timings

    engine["hooks"].block_ids.clear()
    with pytest.raises(RuntimeError, match="no block table was recorded"):
        engine["seam"]._captures("req-1", engine["prompt"], [104, 105], Timings())
