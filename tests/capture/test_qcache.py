"""The paged query cache on CPU: slot-addressed writes with pad slots, block-table addressing,
sliding windows, KV-shared donors, row reconstruction against brute force, a whole padded
multi-request decode replayed like a CUDA graph, and the naive-capture failure class."""

import json
import math
from importlib import resources

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from alignatt.capture.attention import attention_row
from alignatt.core.draft import Head
from alignatt.core.errors import AlignattError
from alignatt.checks.graph_replay import CpuReplayGraph, naive_vs_fixed
from alignatt.core.layout import AttentionLayout
from alignatt.capture.vllm.qcache import (
    QueryCache,
    gather_kv,
    head_order,
    kernel_block_ids,
    key_span,
    plan_capture,
    rebuild_output,
    rebuild_rows,
    slots_for_positions,
    split_rows,
    visible_range,
)


def e4b_layout() -> AttentionLayout:
    from transformers import AutoConfig

    path = resources.files("alignatt") / "data" / "models" / "gemma-4-E4B-it"
    return AttentionLayout.from_config(AutoConfig.from_pretrained(str(path), local_files_only=True))


# ---- buffer writes ----


def test_write_keeps_selected_heads_at_their_slots_and_dumps_pad_rows():
    T, H, D = 4, 8, 16
    cache = QueryCache(n_slots=40, n_heads=2, head_dim=D, dtype=torch.float32, device="cpu", head_index=[3, 6])
    q = torch.randn(T, H * D)
    slots = torch.tensor([7, 31, 0, -1])  # last row is batch padding
    cache.write(q, slots)
    per_head = q.view(T, H, D)
    for row, slot in enumerate([7, 31, 0]):
        assert torch.equal(cache.q[slot], per_head[row, [3, 6]])
    assert torch.equal(cache.q[cache.dump_slot], per_head[3, [3, 6]])
    untouched = [i for i in range(40) if i not in (7, 31, 0)]
    assert cache.q[untouched].abs().max() == 0
    assert torch.equal(cache.read(torch.tensor([31, 7])), per_head[[1, 0]][:, [3, 6]])


def test_write_uses_only_the_first_T_slots_and_refuses_a_short_mapping():
    cache = QueryCache(10, 1, 4, torch.float32, "cpu")
    cache.write(torch.ones(2, 4), torch.tensor([1, 2, 3, 4]))  # padded mapping longer than T
    assert cache.q[3].abs().max() == 0 and cache.q[1].sum() == 4
    with pytest.raises(RuntimeError, match="slot_mapping has 1 entries for 2 tokens"):
        cache.write(torch.ones(2, 4), torch.tensor([1]))


def test_output_buffer_round_trip_and_absence():
    cache = QueryCache(10, 2, 4, torch.float32, "cpu", head_index=[0, 2], out_dim=4)
    out = torch.randn(3, 3 * 4)
    cache.write_out(out, torch.tensor([5, -1, 9]))
    assert torch.equal(cache.read_out(torch.tensor([9])), out.view(3, 3, 4)[2:3, [0, 2]])
    with pytest.raises(RuntimeError, match="without an output buffer"):
        QueryCache(10, 1, 4, torch.float32, "cpu").write_out(out, torch.tensor([1, 2, 3]))


# ---- addressing ----


def test_kernel_block_ids_split_manager_blocks():
    assert kernel_block_ids([0, 5, 2], 1) == [0, 5, 2]
    assert kernel_block_ids([0, 5, 2], 2) == [0, 1, 10, 11, 4, 5]


@settings(max_examples=50, deadline=None)
@given(
    blocks=st.lists(st.integers(0, 500), min_size=1, max_size=12, unique=True),
    block_size=st.sampled_from([16, 32, 64]),
    data=st.data(),
)
def test_slots_for_positions_matches_the_block_table_arithmetic(blocks, block_size, data):
    n = len(blocks) * block_size
    positions = data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=30))
    got = slots_for_positions(blocks, block_size, torch.tensor(positions)).tolist()
    assert got == [blocks[p // block_size] * block_size + p % block_size for p in positions]


def test_slots_past_the_block_table_are_refused():
    with pytest.raises(AlignattError, match="past the request's 2 blocks"):
        slots_for_positions([3, 4], 16, torch.tensor([31, 32]))


def test_visible_range_full_and_sliding():
    assert visible_range(10, None) == (0, 10)
    assert visible_range(10, 4) == (7, 10)  # 4 keys including the query's own position
    assert visible_range(2, 512) == (0, 2)
    assert key_span([600, 601, 605], 512) == (89, 605)


def test_plan_maps_kv_shared_layers_to_their_donors_and_gqa_heads():
    layout = e4b_layout()
    heads = [Head(29, 2), Head(26, 5), Head(11, 3), Head(11, 2), Head(5, 0)]
    plans = plan_capture(layout, heads)
    assert list(plans) == [5, 11, 26, 29]
    assert plans[29].kv_source_layer == 23 and plans[29].sliding_window is None
    assert plans[29].head_dim == 512
    assert plans[26].kv_source_layer == 22 and plans[26].sliding_window == 512
    assert plans[11].heads == (2, 3) and plans[11].kv_heads == (0, 0)  # 8 q heads over 2 KV heads
    assert plans[26].kv_heads == (1,)
    assert plans[5].kv_source_layer == 5
    assert head_order(plans, heads) == [(29, 0), (26, 0), (11, 1), (11, 0), (5, 0)]
    for layer in range(24, 42):
        assert layout[layer].kv_source_layer in (22, 23)


def test_plan_rejects_duplicates_and_bad_heads():
    layout = e4b_layout()
    with pytest.raises(AlignattError, match="twice"):
        plan_capture(layout, [Head(3, 1), Head(3, 1)])
    with pytest.raises(AlignattError, match="out of range"):
        plan_capture(layout, [Head(42, 0)])


# ---- a paged KV cache and reconstruction ----


def paged_cache(num_blocks, block_size, kv_heads, dim, hnd=False):
    """A zeroed [blocks, 2, block_size, kv_heads, dim] cache; `hnd` gives it vLLM's HND strides."""
    if hnd:
        raw = torch.zeros(num_blocks, 2, kv_heads, block_size, dim)
        return raw.permute(0, 1, 3, 2, 4)
    return torch.zeros(num_blocks, 2, block_size, kv_heads, dim)


@pytest.mark.parametrize("hnd", [False, True])
def test_gather_kv_reads_back_what_the_slots_wrote(hnd):
    kv = paged_cache(12, 16, 2, 8, hnd=hnd)
    blocks = [7, 2, 9]
    keys, values = torch.randn(40, 2, 8), torch.randn(40, 2, 8)
    slots = slots_for_positions(blocks, 16, torch.arange(40))
    kv[slots // 16, 0, slots % 16] = keys
    kv[slots // 16, 1, slots % 16] = values
    assert torch.equal(gather_kv(kv, slots, 0), keys)
    assert torch.equal(gather_kv(kv, slots[5:9], 1), values[5:9])
    with pytest.raises(RuntimeError, match="unexpected KV cache shape"):
        gather_kv(torch.zeros(3, 16, 2, 8), slots, 0)


def brute_force_row(q, k, query_pos, window, scaling, softcap):
    """Dense reference written independently of attention_row: loops, Python math."""
    out = []
    for h in range(q.shape[0]):
        scores = []
        for p in range(k.shape[1]):
            visible = p <= query_pos and (window is None or p > query_pos - window)
            if not visible:
                scores.append(-math.inf)
                continue
            s = float((q[h].double() * k[h, p].double()).sum()) * scaling
            if softcap:
                s = math.tanh(s / softcap) * softcap
            scores.append(s)
        m = max(scores)
        e = [math.exp(s - m) if s != -math.inf else 0.0 for s in scores]
        z = sum(e)
        out.append([x / z for x in e])
    return torch.tensor(out, dtype=torch.float64)


@pytest.mark.parametrize("window,softcap", [(None, None), (6, None), (None, 5.0), (6, 5.0)])
def test_rebuild_rows_batched_and_reference_match_brute_force(window, softcap):
    from alignatt.capture.vllm.qcache import LayerPlan

    torch.manual_seed(0)
    plan = LayerPlan(layer=0, heads=(1, 2, 7), kv_heads=(0, 1, 3), n_heads=8, n_kv_heads=4, head_dim=8,
                     scaling=0.35, sliding_window=window, softcap=softcap, kv_source_layer=0)
    L, T = 20, 5
    keys = torch.randn(L, 4, 8)
    q = torch.randn(T, 3, 8)
    qpos = torch.arange(L - T, L)
    kpos = torch.arange(L)
    batched = rebuild_rows(plan, q, qpos, keys, kpos)
    reference = rebuild_rows(plan, q, qpos, keys, kpos, method="reference")
    assert batched.shape == (T, 3, L) and batched.dtype == torch.float32
    assert torch.allclose(batched, reference, atol=1e-6, rtol=0)
    assert torch.equal(batched == 0, reference == 0)  # identical masks: exact zeros in both
    for t in range(T):
        want = brute_force_row(q[t], keys[:, [0, 1, 3]].permute(1, 0, 2), int(qpos[t]), window, 0.35, softcap)
        assert torch.allclose(batched[t].double(), want, atol=1e-5)
    with pytest.raises(ValueError, match="unknown reconstruction method"):
        rebuild_rows(plan, q, qpos, keys, kpos, method="fast")


def test_rebuild_output_is_probs_times_values_of_the_mapped_kv_head():
    from alignatt.capture.vllm.qcache import LayerPlan

    plan = LayerPlan(layer=0, heads=(0, 5), kv_heads=(0, 1), n_heads=6, n_kv_heads=2, head_dim=4,
                     scaling=1.0, sliding_window=None, softcap=None, kv_source_layer=0)
    probs = torch.softmax(torch.randn(3, 2, 7), -1)
    values = torch.randn(7, 2, 4)
    out = rebuild_output(plan, probs, values)
    for t in range(3):
        assert torch.allclose(out[t, 1], probs[t, 1] @ values[:, 1], atol=1e-6)
        assert torch.allclose(out[t, 0], probs[t, 0] @ values[:, 0], atol=1e-6)


def test_split_rows_masses_add_up_and_window_hides_old_source():
    full = torch.softmax(torch.randn(2, 3, 10), -1)  # keys at positions 4..13
    split = split_rows(full, key_lo=4, source_positions=[2, 3, 5, 6], generated_start=11)
    assert split.rows.shape == (2, 3, 4)
    assert split.rows[:, :, :2].abs().max() == 0  # positions 2, 3 fell out of the window
    assert torch.equal(split.rows[:, :, 2], full[:, :, 1])
    total = split.rows.sum(-1) + split.other_prompt + split.generated
    assert torch.allclose(total, torch.ones(2, 3), atol=1e-6)
    assert torch.allclose(split.generated, full[:, :, 7:].sum(-1))


# ---- a whole padded multi-request decode, replayed like a CUDA graph ----


def test_replayed_padded_batch_rebuilds_every_requests_own_rows():
    """Three requests decode together in a batch padded to 4 rows. One function (the 'forward')
    is captured once and replayed per step; it writes K/V into a paged cache and q into the
    query cache by the step's slot mapping. Afterwards each request's rows, rebuilt through its
    own block table, equal dense attention over that request's own sequence."""
    torch.manual_seed(1)
    block_size, kv_heads, n_heads, dim, steps = 16, 2, 4, 8, 6
    plan = plan_capture(e4b_like_layout(n_heads, kv_heads, dim), [Head(0, 1), Head(0, 3)])[0]
    kv = paged_cache(32, block_size, kv_heads, dim, hnd=True)
    cache = QueryCache(32 * block_size, 2, dim, torch.float32, "cpu", head_index=plan.heads)
    block_tables = {0: [5, 9], 1: [2, 30], 2: [17, 4]}
    start = {0: 11, 1: 20, 2: 3}  # tokens already in the cache before these steps
    seqs = {r: (torch.randn(start[r] + steps, kv_heads, dim), torch.randn(start[r] + steps, n_heads, dim))
            for r in block_tables}  # per request: keys and queries of every position
    for r, (k, _) in seqs.items():  # the prompt's keys (prefill, not replayed here)
        s = slots_for_positions(block_tables[r], block_size, torch.arange(start[r]))
        kv[s // block_size, 0, s % block_size] = k[: start[r]]

    static_q = torch.zeros(4, n_heads * dim)
    static_k = torch.zeros(4, kv_heads, dim)
    static_slots = torch.full((4,), -1)

    def forward():
        cache.write(static_q, static_slots)
        ok = static_slots >= 0
        tgt = torch.where(ok, static_slots, torch.zeros_like(static_slots))
        # the KV write of a real engine skips pad slots the same way
        kv[tgt // block_size, 0, tgt % block_size] = torch.where(
            ok[:, None, None], static_k, kv[tgt // block_size, 0, tgt % block_size])

    graph = CpuReplayGraph()
    graph.capture(forward)
    for step in range(steps):
        for r in range(3):
            pos = start[r] + step
            static_q[r] = seqs[r][1][pos].reshape(-1)
            static_k[r] = seqs[r][0][pos]
            static_slots[r] = slots_for_positions(block_tables[r], block_size, torch.tensor([pos]))[0]
        static_q[3] = torch.randn(n_heads * dim) * 100  # the pad row carries garbage
        static_slots[3] = -1
        graph.replay()

    for r in range(3):
        qpos = torch.arange(start[r], start[r] + steps)
        q_rows = cache.read(slots_for_positions(block_tables[r], block_size, qpos))
        lo, hi = key_span(qpos.tolist(), plan.sliding_window)
        kpos = torch.arange(lo, hi + 1)
        keys = gather_kv(kv, slots_for_positions(block_tables[r], block_size, kpos), 0)
        rows = rebuild_rows(plan, q_rows, qpos, keys, kpos)
        k_all, q_all = seqs[r]
        for t, p in enumerate(qpos.tolist()):
            for i, h in enumerate(plan.heads):
                want = attention_row(q_all[p, h][None], k_all[: p + 1, plan.kv_heads[i]][None],
                                     torch.arange(p + 1), p, plan.scaling, None)[0]
                assert torch.allclose(rows[t, i, : p + 1 - lo], want[lo:], atol=1e-6)


def e4b_like_layout(n_heads, kv_heads, dim) -> AttentionLayout:
    from alignatt.core.layout import LayerAttention

    return AttentionLayout(family="gemma4_text", layers=[LayerAttention(
        layer=0, kind="full", head_dim=dim, n_heads=n_heads, n_kv_heads=kv_heads, scaling=1.0,
        sliding_window=None, kv_source_layer=0)])


# ---- the failure class ----


def test_naive_list_capture_is_right_eagerly_and_wrong_replayed_the_fixed_one_always_right():
    eager = naive_vs_fixed("cpu", replay=False)
    replayed = naive_vs_fixed("cpu", replay=True)
    assert eager["naive_list"]["ok"] and eager["naive_list"]["entries"] == 5
    assert not replayed["naive_list"]["ok"]
    assert replayed["naive_list"]["entries"] == 1  # Python ran once, at capture
    assert replayed["naive_list"]["last_entry_holds_last_step"]  # its tensor was overwritten
    assert replayed["naive_list"]["rows_correct"] == 0
    for report in (eager, replayed):
        assert not report["naive_position_scatter"]["ok"]  # pad rows / collisions corrupt rows
        assert report["fixed"]["ok"], json.dumps(report["fixed"])
        assert report["fixed"]["rows_correct"] == report["rows_expected"] == 15


def test_cpu_replay_graph_reruns_tensor_ops_into_captured_memory_only():
    x = torch.zeros(3)
    seen = []

    def fn():
        seen.append(1)
        y = x + 1  # a fresh tensor at capture: replays overwrite it in place
        x.copy_(y)

    g = CpuReplayGraph()
    g.capture(fn)
    g.replay()
    g.replay()
    assert seen == [1] and torch.equal(x, torch.full((3,), 3.0))


# ---- self-consistency: the layer's own output vs softmax(q K) V from the capture ----


def test_consistency_stats_are_norm_relative_and_skip_dead_rows():
    from alignatt.capture.vllm.qcache import TINY_OUTPUT_RMS, consistency_stats, judge_consistency

    g = torch.Generator().manual_seed(1)
    rebuilt = torch.randn(30, 2, 64, generator=g)
    own = rebuilt.to(torch.bfloat16).float()  # what a bf16 kernel writes
    s = consistency_stats(own, rebuilt)
    assert s["rows"] == 60 and s["live_rows"] == 60
    assert 0 < s["max_rel_err"] < 0.01 and s["min_cos"] > 0.9999
    assert judge_consistency(s, 0.02, 0.999) == "passed"

    # a few dead rows (e.g. a head attending to ~nothing) are left out of the cosine...
    dead = rebuilt.clone()
    dead[:3] = 0
    s = consistency_stats(dead.clone(), dead)
    assert s["live_rows"] == 54 and s["min_cos"] == pytest.approx(1.0)
    assert judge_consistency(s, 0.02, 0.999) == "passed"
    # ...but a layer of dead rows says so instead of passing or failing on meaningless numbers
    tiny = TINY_OUTPUT_RMS * 1e-6
    s = consistency_stats(rebuilt * tiny, rebuilt * tiny * 1.5)
    assert s["live_rows"] == 0 and s["min_cos"] is None and s["max_rel_err"] < 1e-5
    assert judge_consistency(s, 0.02, 0.999) == "degenerate activations"

    # a wrong capture (other rows) fails on both measures
    s = consistency_stats(rebuilt.flip(0), rebuilt)
    assert s["max_rel_err"] > 0.5 and judge_consistency(s, 0.02, 0.999) == "failed"
    with pytest.raises(ValueError):
        consistency_stats(rebuilt[:2], rebuilt)
