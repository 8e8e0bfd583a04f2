"""The vllm_capture fetch + rebuild on CPU, with stand-ins for the engine objects it reads (KV
caches, KV-cache groups with different block sizes, a KV-shared layer reading its donor's cache,
recorded block ids), all built through public constructors (`EngineView`, `LayerSource`,
`BatchFetcher`): rows must equal dense attention over each request's own sequence, the mass split
must match the prompt layout, and one batched step of several requests must give each request the
rows the per-request reference gives it."""

import numpy as np
import pytest
import torch

from alignatt.capture.vllm.batched import Packer
from alignatt.capture.vllm.fetch import BatchFetcher, EngineView, FetchItem, LayerSource
from alignatt.capture.vllm.qcache import QueryCache, head_order, kernel_block_ids, plan_capture, slots_for_positions
from alignatt.capture.attention import attention_row
from alignatt.core.draft import Head
from alignatt.core.layout import AttentionLayout, LayerAttention

HEADS = [Head(0, 1), Head(1, 3), Head(2, 2), Head(0, 3)]
KEY_GROUP = {0: 0, 1: 1, 2: 0}  # layer 2 is KV-shared: it reads layer 0's (group 0) keys
# group 0 (sliding layers): 16-token kernel blocks; group 1 (full): manager blocks of 16 split in 2x8
BLOCK = {0: (16, 1), 1: (8, 2)}


def layout() -> AttentionLayout:
    def la(i, kind, dim, window, src):
        return LayerAttention(layer=i, kind=kind, head_dim=dim, n_heads=4, n_kv_heads=2, scaling=0.5,
                              sliding_window=window, kv_source_layer=src)

    # 0: sliding (window 8), 1: full (dim 16), 2: KV-shared sliding layer reading layer 0's cache
    return AttentionLayout(family="gemma4_text", layers=[la(0, "sliding", 8, 8, 0), la(1, "full", 16, None, 1),
                                                         la(2, "sliding", 8, 8, 0)])


class StandInEngine:
    """KV caches and query caches of a few requests, written where vLLM would write them."""

    def __init__(self, n_blocks=(10, 20), keep_raw=False, padded=None, device="cpu"):
        self.plans = plan_capture(layout(), HEADS)
        self.kv = {0: torch.zeros(n_blocks[0], 2, 16, 2, 8, device=device),
                   1: torch.zeros(n_blocks[1], 2, 8, 2, 16, device=device)}
        self.caches = {
            layer: QueryCache(self.kv[KEY_GROUP[layer]].shape[0] * self.kv[KEY_GROUP[layer]].shape[2],
                              len(plan.heads), plan.head_dim, torch.float32, device, plan.heads)
            for layer, plan in self.plans.items()
        }
        self.block_ids: dict = {}
        self.sequences: dict = {}
        layers = {layer: LayerSource(self.caches[layer], self.kv[KEY_GROUP[layer]], *BLOCK[KEY_GROUP[layer]],
                                     KEY_GROUP[layer]) for layer in self.plans}
        self.view = EngineView(layers, self.block_ids)
        self.fetcher = BatchFetcher(self.view, self.plans, head_order(self.plans, HEADS), keep_raw=keep_raw,
                                    padded=padded)

    def add(self, rid, block_ids, n_prompt, n, source, prefix_start):
        T = n_prompt + n - 1  # the last drafted token is never fed back
        gen = torch.Generator().manual_seed(sum(map(ord, rid)))  # the same sequence in every engine
        device = self.kv[0].device
        keys = {0: torch.randn(T, 2, 8, generator=gen), 1: torch.randn(T, 2, 16, generator=gen)}
        qs = {0: torch.randn(T, 4, 8, generator=gen), 1: torch.randn(T, 4, 16, generator=gen),
              2: torch.randn(T, 4, 8, generator=gen)}
        keys, qs = ({k: v.to(device) for k, v in d.items()} for d in (keys, qs))
        for layer in self.plans:
            g = KEY_GROUP[layer]
            bs, per = BLOCK[g]
            slots = slots_for_positions(kernel_block_ids(block_ids[g], per), bs, torch.arange(T, device=device))
            self.caches[layer].write(qs[layer].reshape(T, -1), slots)
            if layer != 2:  # the shared layer writes no keys of its own
                self.kv[g][slots // bs, 0, slots % bs] = keys[g]
        self.block_ids[rid] = block_ids
        self.sequences[rid] = (keys, qs)
        return FetchItem(rid, n_prompt, n, tuple(source), prefix_start)

    def dense(self, rid, item, t, head_index):
        """Dense attention of token t's query over the request's own keys (the truth)."""
        keys, qs = self.sequences[rid]
        h = HEADS[head_index]
        plan = self.plans[h.layer]
        p = item.n_prompt - 1 + t
        k = keys[KEY_GROUP[h.layer]][: p + 1, plan.kv_heads[plan.heads.index(h.head)]]
        return attention_row(qs[h.layer][p, h.head][None].cpu(), k[None].cpu(), torch.arange(p + 1), p,
                             plan.scaling, plan.sliding_window)[0]


def check_against_dense(engine, rid, item, got):
    assert got.rows.shape == (item.n_tokens, len(HEADS), len(item.source_positions))
    for t in range(item.n_tokens):
        for i in range(len(HEADS)):
            want = engine.dense(rid, item, t, i)
            np.testing.assert_allclose(got.rows[t, i], want[list(item.source_positions)].numpy(), atol=1e-6)
            gen = float(want[item.generated_start:].sum())
            other = float(want.sum()) - gen - float(want[list(item.source_positions)].sum())
            assert abs(got.generated[t, i] - gen) < 1e-6
            assert abs(got.other_prompt[t, i] - other) < 1e-6


def test_reference_fetch_rebuilds_each_heads_rows_through_block_tables_and_donor_caches():
    engine = StandInEngine(keep_raw=True)
    item = engine.add("req-1", ([3, 0], [5, 1]), 14, 5, [3, 4, 5, 7, 9, 10], 12)
    got, timings = engine.fetcher.fetch_one(item, method="reference")
    assert "req-1" not in engine.block_ids  # consumed
    assert timings.capture_ms >= 0 and timings.reconstruct_ms > 0
    check_against_dense(engine, "req-1", item, got)
    # sliding layers see at most 8 keys: the earliest source tokens are invisible to late tokens
    assert got.rows[-1][0][0] == 0.0 and got.rows[-1][1][0] > 0.0  # head 0 sliding, head 1 full
    assert got.raw.query_positions.tolist() == list(range(13, 18))


def test_one_batched_step_gives_every_request_its_own_rows():
    """Four requests of different prompt and draft lengths, interleaved blocks (one shares a
    block id order with another's reversed), finishing in the same step: the batched fetch (one
    gather and one softmax per layer, padded) equals the per-request reference and the truth."""
    requests = [
        ("a", ([3, 0], [5, 1]), 14, 5, [3, 4, 5, 7, 9, 10], 12),
        ("b", ([1, 6], [2, 7, 9]), 20, 9, [2, 3, 4, 5, 6, 8, 11, 12, 13], 17),
        ("c", ([4], [0, 3]), 9, 1, [1, 2, 3], 8),
        ("d", ([2, 5, 7], [4, 6, 8, 10]), 27, 14, list(range(3, 20)), 24),
    ]
    batched, reference = StandInEngine(keep_raw=True), StandInEngine()
    items = [batched.add(*r) for r in requests]
    ref_items = [reference.add(*r) for r in requests]
    got, timings = batched.fetcher.fetch(items)
    assert not batched.block_ids  # every request's block ids consumed
    assert timings.reconstruct_ms > 0
    for (rid, *_), item, g, ref_item in zip(requests, items, got, ref_items):
        want, _ = reference.fetcher.fetch_one(ref_item)
        np.testing.assert_allclose(g.rows, want.rows, atol=1e-6)
        np.testing.assert_allclose(g.other_prompt, want.other_prompt, atol=1e-6)
        np.testing.assert_allclose(g.generated, want.generated, atol=1e-6)
        check_against_dense(batched, rid, item, g)
        assert g.raw.query_positions[0] == item.n_prompt - 1 and len(g.raw.query_positions) == item.n_tokens
    # the requests really differ (a fetch that mixed them up could not pass the checks above)
    assert not np.allclose(got[0].rows[0], got[1].rows[0][:, :6])


def test_fetch_without_a_recorded_block_table_fails_loudly():
    engine = StandInEngine()
    item = engine.add("req-1", ([3, 0], [5, 1]), 14, 5, [3, 4, 5], 12)
    engine.block_ids.clear()
    with pytest.raises(RuntimeError, match="no block table was recorded"):
        engine.fetcher.fetch([item])
    with pytest.raises(RuntimeError, match="no block table was recorded"):
        engine.fetcher.fetch_one(item)


def test_a_block_table_that_does_not_cover_the_draft_is_refused():
    from alignatt.core.errors import AlignattError

    engine = StandInEngine()
    item = engine.add("req-1", ([3, 0], [5, 1]), 14, 5, [3, 4, 5], 12)
    engine.block_ids["req-1"] = ([3], [5])  # one block short in both groups
    with pytest.raises(AlignattError, match="does not cover the draft"):
        engine.fetcher.fetch([item])


def test_context_and_history_mass_batched_equals_reference_and_dense():
    """Mass on the prompt's context block and history turns (parts of other_prompt), per token
    and head: the batched fetch, the per-request reference and dense attention agree; a request
    without the blocks reports None."""
    from dataclasses import replace

    requests = [("a", ([3, 0], [5, 1]), 14, 5, [9, 10, 11], 12), ("b", ([1, 6], [2, 7, 9]), 20, 9, [14, 15, 16], 17),
                ("c", ([4], [0, 3]), 9, 1, [6, 7], 8)]
    blocks = {"a": ((1, 2, 3), (5, 6, 7, 8)), "b": ((0, 1, 2, 3, 4, 5), (8, 9, 10, 11, 12)), "c": ((), ())}
    batched, reference = StandInEngine(), StandInEngine()
    items = [replace(batched.add(*r), context_positions=blocks[r[0]][0], history_positions=blocks[r[0]][1])
             for r in requests]
    ref_items = [replace(reference.add(*r), context_positions=blocks[r[0]][0], history_positions=blocks[r[0]][1])
                 for r in requests]
    got, _ = batched.fetcher.fetch(items)
    for (rid, *_), item, g, ref_item in zip(requests, items, got, ref_items):
        want, _ = reference.fetcher.fetch_one(ref_item)
        if not item.context_positions:
            assert g.context is None and g.history is None and want.context is None
            continue
        np.testing.assert_allclose(g.context, want.context, atol=1e-6)
        np.testing.assert_allclose(g.history, want.history, atol=1e-6)
        for t in range(item.n_tokens):
            for i in range(len(HEADS)):
                dense = batched.dense(rid, item, t, i)
                assert abs(g.context[t, i] - float(dense[list(item.context_positions)].sum())) < 1e-6
                assert abs(g.history[t, i] - float(dense[list(item.history_positions)].sum())) < 1e-6
        assert (g.context <= g.other_prompt + 1e-6).all()  # a part of the other-prompt mass
    assert got[1].context.max() > 0  # the sliding layer still sees b's context for early tokens


def random_batch(seed, engines, n_requests=None, name=""):
    """Requests of random prompt, draft, source, context and history lengths on shuffled blocks, added
    to every engine alike; the items of each. Odd seeds give the positions as the int64 arrays the
    seam keeps per request, even ones as tuples. The q and keys follow from the request names: another
    `name` gives the same layout other values."""
    from dataclasses import replace

    rng = np.random.default_rng(seed)
    free = {0: list(rng.permutation(40)), 1: list(rng.permutation(40))}  # group 1: manager blocks of 2 kernel blocks
    out = [[] for _ in engines]
    for r in range(n_requests or int(rng.integers(2, 7))):
        n_prompt, n = int(rng.integers(3, 40)), int(rng.integers(1, 12))
        total = n_prompt + n
        ids = ([int(free[0].pop()) for _ in range(total // 16 + 1)], [int(free[1].pop()) for _ in range(total // 16 + 1)])
        source = sorted(rng.choice(n_prompt - 1, int(rng.integers(1, n_prompt - 1)), replace=False).tolist())
        context = tuple(sorted(rng.choice(n_prompt, int(rng.integers(0, 4)), replace=False).tolist()))
        history = tuple(sorted(rng.choice(n_prompt, int(rng.integers(0, 4)), replace=False).tolist()))
        args = (f"{name}r{r}", ids, n_prompt, n, source, int(rng.integers(1, n_prompt)))
        for engine, items in zip(engines, out):
            item = replace(engine.add(*args), context_positions=context, history_positions=history)
            if seed % 2:
                item = replace(item, **{k: np.asarray(getattr(item, k), np.int64)
                                        for k in ("source_positions", "context_positions", "history_positions")})
            items.append(item)
    return out


def assert_same_rows(got, want, atol=1e-6):
    for name in ("rows", "other_prompt", "generated", "context", "history"):
        a, b = getattr(got, name), getattr(want, name)
        assert (a is None) == (b is None), name
        if a is not None:
            np.testing.assert_allclose(a, b, atol=atol, err_msg=name)


@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("seed", range(4))
def test_random_ragged_batches_give_every_request_the_reference_rows(seed, padded):
    """A random batch (the indices built for all requests at once, with padding): each request's rows
    and masses equal the per-request reference's, also with the batch padded to bucket sizes (its
    requests, tokens, source columns and keys: what a GPU's graphed fetch replays)."""
    from alignatt.capture.vllm.batched import power_of_two

    batched, reference = StandInEngine(n_blocks=(40, 80), padded=padded), StandInEngine(n_blocks=(40, 80))
    items, ref_items = random_batch(seed, [batched, reference])
    pending = batched.fetcher.enqueue(items)
    got, _ = pending.result()
    for g, ref_item in zip(got, ref_items):
        assert_same_rows(g, reference.fetcher.fetch_one(ref_item)[0])
    T, S = max(it.n_tokens for it in items), max(len(it.source_positions) for it in items)
    want_shape = ((len(items), power_of_two(T), len(HEADS), power_of_two(S, 16) + 4) if padded
                  else (len(items), T, len(HEADS), S + 4))
    assert pending.packed.shape == want_shape


def test_bucket_sizes_are_few_and_at_most_half_again_the_real_size():
    from alignatt.capture.vllm.batched import bucket, power_of_two

    sizes = [bucket(n) for n in range(1, 1025)]
    assert sizes[:13] == [1, 2, 3, 4, 6, 6, 8, 8, 12, 12, 12, 12, 16]
    assert all(n <= b <= max(1.5 * n, 1) for n, b in zip(range(1, 1025), sizes))
    assert len(set(sizes)) == 20  # 1, 2, then two per octave to 1024
    assert bucket(3, 8) == 8 and bucket(0) == 1 and bucket(5, 5) == 6
    assert [power_of_two(n) for n in (0, 1, 3, 4, 5)] == [1, 1, 4, 4, 8] and power_of_two(3, 16) == 16


def test_heads_are_grouped_by_head_size_and_come_back_in_the_callers_order():
    from alignatt.capture.vllm.batched import group_heads, head_permutation

    plans = plan_capture(layout(), HEADS)
    groups = group_heads(plans)
    # layers 0 and 2 (head size 8) in one group, layer 1 (16) in the other; a layer's heads stay together
    assert [g.layers for g in groups] == [(0, 2), (1,)]
    assert groups[0].heads == ((0, 0), (0, 1), (2, 0))
    computed = [h for g in groups for h in g.heads]
    order = head_order(plans, HEADS)
    assert [computed[i] for i in head_permutation(groups, order)] == order


def test_an_enqueued_fetch_has_read_its_keys_before_the_blocks_are_reused():
    """`enqueue` queues every read of the engine's caches at once; the result, read later, is what
    the caches held then, not what a next step wrote into the freed blocks afterwards."""
    engine, reference = StandInEngine(), StandInEngine()
    args = ("a", ([3, 0], [5, 1]), 14, 5, [3, 4, 5, 7, 9, 10], 12)
    item, ref_item = engine.add(*args), reference.add(*args)
    pending = engine.fetcher.enqueue([item])
    for kv in engine.kv.values():  # the next step hands the blocks to another request
        kv.normal_()
    for cache in engine.caches.values():
        cache.q.normal_()
    assert pending.ready()
    (got,), timings = pending.result()
    want, _ = reference.fetcher.fetch_one(ref_item)
    np.testing.assert_allclose(got.rows, want.rows, atol=1e-6)
    np.testing.assert_allclose(got.generated, want.generated, atol=1e-6)
    assert timings.capture_ms > 0 and timings.reconstruct_ms > 0
    packed = pending.packed
    assert pending.result()[1] is timings and pending.packed is packed  # copied to the host once


def test_a_batch_within_the_sliding_window_still_gives_the_reference_rows():
    """When every request's keys fit the sliding window, sliding and full layers span the same keys;
    each head's own window still masks in the rebuild, and the rows equal the reference's."""
    from alignatt.capture.vllm.batched import pack_batch

    requests = [("a", ([3], [5]), 5, 3, [1, 2, 3], 4), ("b", ([1], [2]), 4, 2, [0, 1], 3),
                ("c", ([4], [0]), 6, 1, [2, 3, 4], 5)]
    batched, reference = StandInEngine(), StandInEngine()
    items = [batched.add(*r) for r in requests]
    ref_items = [reference.add(*r) for r in requests]
    blocks = [batched.block_ids[it.request_id] for it in items]
    _, spans, shape = pack_batch(items, blocks, batched.plans, batched.view.layers, batched.fetcher.groups, 3, 3)
    assert spans[0] == spans[1] and shape.L == (7, 7)  # layer 0 sliding (window 8), layer 1 full: keys 0..6 of c
    got, _ = batched.fetcher.fetch(items)
    for g, ref_item in zip(got, ref_items):
        want, _ = reference.fetcher.fetch_one(ref_item)
        np.testing.assert_allclose(g.rows, want.rows, atol=1e-6)
        np.testing.assert_allclose(g.generated, want.generated, atol=1e-6)


def test_the_packers_buffer_holds_every_array_as_put_and_as_a_copy_of_its_own():
    packer = Packer()
    slots = np.arange(12).reshape(3, 4) * 7 - 5  # negative and large values survive the int64 buffer
    packer.put("slots", slots)
    packer.put("flags", np.arange(10).reshape(2, 5) % 3 == 0)
    packer.put("positions", np.array([[1 << 40], [3]]))
    ix = packer.views(packer.to_host(pin=False))
    assert ix["slots"].dtype == torch.int64 and np.array_equal(ix["slots"].numpy(), slots)
    assert ix["flags"].tolist() == [[1, 0, 0, 1, 0], [0, 1, 0, 0, 1]]
    assert ix["positions"].tolist() == [[1 << 40], [3]]
    slots[0, 0] = 99  # the buffer is a copy: the host arrays may be reused at once
    assert ix["slots"][0, 0].item() == -5
    size, places = packer.layout()
    assert size == 12 + 10 + 2 and [name for name, _ in places] == ["slots", "flags", "positions"]


def test_the_kv_cache_capacity_is_read_per_group_from_the_caches_shapes():
    """blocks x block size of each group's cache: what running drafts and cached prefixes share."""
    engine = StandInEngine(n_blocks=(10, 20))
    assert engine.view.kv_cache_tokens() == {0: 10 * 16, 1: 20 * 8}


def test_a_graph_that_fails_leaves_the_fetch_eager_with_the_same_rows_and_one_line_said(capsys):
    """A CUDA graph that cannot be captured or replayed (here a stand-in that raises as torch does)
    costs no request its rows: the fetch runs the same ops eagerly, says so once, and stays eager."""

    class FailingGraphs:
        calls = 0

        def run(self, *args):
            FailingGraphs.calls += 1
            raise RuntimeError("it->second->use_count > 0 INTERNAL ASSERT FAILED\nat CUDACachingAllocator.cpp")

    batched, reference = StandInEngine(n_blocks=(40, 80), padded=True), StandInEngine(n_blocks=(40, 80))
    batched.fetcher.graphs = FailingGraphs()
    for round_ in range(2):
        items, ref_items = random_batch(3, [batched, reference], name=f"{round_}-")
        got, timings = batched.fetcher.fetch(items)
        for g, ref_item in zip(got, ref_items):
            assert_same_rows(g, reference.fetcher.fetch_one(ref_item)[0])
        assert timings.capture_ms > 0 and timings.reconstruct_ms > 0
    assert FailingGraphs.calls == 1 and batched.fetcher.graphs is None
    said = [line for line in capsys.readouterr().out.splitlines() if "CUDA graph" in line]
    assert said == ["[alignatt.capture.vllm.seam] the fetch's CUDA graph failed (it->second->use_count > 0 "
                    "INTERNAL ASSERT FAILED); the fetch runs eagerly from now on"]
