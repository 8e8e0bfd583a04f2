"""The batched rebuild behind `BatchFetcher.fetch`: host-side indices, then few, large device ops.

Heads are grouped by what their rows are rebuilt with (head size, scaling, softcap): a layer's
heads always fall in one group, and on Gemma-4 the sliding and the full layers make two groups.
Per group there is one gather per layer for q and one for the keys (the captured heads' KV heads
only), then one matmul, one softmax, one gather of the source columns and one masked sum of the
four mass categories over the whole padded batch [requests, tokens, heads, keys]. Every index
(slots as block and offset, key positions, source columns, category masks) is built on the host
from the recorded block ids and goes to the GPU in two pinned copies, so nothing here waits on the
device: the result stays on the GPU until the caller copies it back.

The math is `attention_row`'s (fp32 scores, softcap, causal and sliding-window masks, fp32
softmax); the per-request reference (`BatchFetcher.fetch_one`) is tested to give the same rows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import chain
from typing import Any, Callable, Sequence

import numpy as np
import torch

from alignatt.capture.vllm.qcache import LayerPlan, check_covered, check_kv_layout, kernel_block_ids

# The four per-token, per-head masses after the source columns, in this order.
MASSES = ("other_prompt", "generated", "context", "history")
NO_WINDOW = 1 << 40  # a full-attention head's "window": larger than any position


@dataclass(frozen=True)
class HeadGroup:
    """Captured heads rebuilt by one matmul and one softmax (same head size, scaling and softcap)."""

    layers: tuple[int, ...]  # ascending; each layer brings all its captured heads
    heads: tuple[tuple[int, int], ...]  # (layer, index in that layer's plan), layer-major
    head_dim: int
    scaling: float
    softcap: float | None


def group_heads(plans: dict[int, LayerPlan]) -> list[HeadGroup]:
    by_key: dict[tuple, list[int]] = {}
    for layer in sorted(plans):
        p = plans[layer]
        by_key.setdefault((p.head_dim, p.scaling, p.softcap), []).append(layer)
    return [HeadGroup(tuple(layers), tuple((l, i) for l in layers for i in range(len(plans[l].heads))), *key)
            for key, layers in by_key.items()]


def head_permutation(groups: Sequence[HeadGroup], order: Sequence[tuple[int, int]]) -> list[int]:
    """For each output head (the caller's order): its index among the groups' heads, concatenated."""
    computed = [h for g in groups for h in g.heads]
    return [computed.index(h) for h in order]


class Packer:
    """Host arrays of one batch, laid out in two flat buffers (int64 indices, uint8 masks)."""

    KINDS = {"i64": (np.int64, torch.int64), "u8": (np.uint8, torch.uint8)}  # each buffer's host and device dtype

    def __init__(self) -> None:
        self.parts: dict[str, list[np.ndarray]] = {kind: [] for kind in self.KINDS}
        self.at: dict[str, tuple[str, int, int, tuple]] = {}
        self.size = {kind: 0 for kind in self.KINDS}

    def put(self, name: str, array: np.ndarray, kind: str = "i64") -> None:
        flat = array.reshape(-1).astype(self.KINDS[kind][0], copy=False)  # concatenated later
        self.parts[kind].append(flat)
        self.at[name] = (kind, self.size[kind], self.size[kind] + flat.size, array.shape)
        self.size[kind] += flat.size

    def alias(self, name: str, of: str) -> None:
        """`name` reads the array already put as `of` (sent once)."""
        self.at[name] = self.at[of]

    def to_host(self, pin: bool) -> dict[str, torch.Tensor]:
        """Each buffer as one host tensor; pinned (`pin`), so that its copy to the device does not wait.

        The parts are concatenated straight into a block of torch's caching host allocator, which
        keeps the block until the copy that reads it has run. `Tensor.pin_memory()` on a fresh array
        took 2 ms a call in the engine at 128 speakers on the H200 (cProfile, 2026-12-03), nearly
        half of the fetch's host time; an allocator block is not among the step's costs."""
        out = {}
        for kind, parts in self.parts.items():
            host = torch.empty(self.size[kind], dtype=self.KINDS[kind][1], pin_memory=pin)
            np.concatenate(parts, out=host.numpy())  # every group puts both kinds
            out[kind] = host
        return out

    def views(self, buffers: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Every array put, as a view of its buffer (which may be longer than this batch's)."""
        return {name: buffers[kind][a:b].view(shape) for name, (kind, a, b, shape) in self.at.items()}

    def to_device(self, device: torch.device) -> dict[str, torch.Tensor]:
        """One host-to-device copy per buffer, from pinned memory on a GPU (pageable copies wait)."""
        host = self.to_host(device.type == "cuda")
        return self.views({kind: h.to(device, non_blocking=True) for kind, h in host.items()})

    def layout(self) -> tuple:
        """What the views depend on: every name's place and shape (a captured graph reads these)."""
        return tuple(self.size.values()), tuple(self.at.items())


def power_of_two(n: int, floor: int = 1) -> int:
    """The smallest power of two >= max(n, floor)."""
    return 1 << (max(n, floor, 1) - 1).bit_length()


def bucket(n: int, floor: int = 1) -> int:
    """The smallest of 2^k and 3 * 2^(k-1) that is >= max(n, floor): a padded size at most 1.5x
    the real one, from few distinct sizes (each padded batch shape is a graph of its own)."""
    p = power_of_two(n, floor)
    return p * 3 // 4 if p >= 4 and p * 3 // 4 >= max(n, floor) else p


@dataclass
class LayerSpan:
    lo: list[int]  # first key position per request
    n_keys: list[int]  # keys per request


def _padded(rows: Sequence[Sequence[int]], fill: int, expand: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Ragged integer rows as one [R, max] array padded with `fill`, and each row's length; with
    `expand` k, each value v becomes v*k .. v*k+k-1. One pass over all values, no loop over rows."""
    lengths = np.fromiter(map(len, rows), np.int64, len(rows))
    n = int(lengths.sum())
    if n and isinstance(rows[0], np.ndarray):
        flat = np.concatenate(rows).astype(np.int64, copy=False)
    else:
        flat = np.fromiter(chain.from_iterable(rows), np.int64, n)
    if expand != 1:
        flat, lengths = (flat[:, None] * expand + np.arange(expand)).reshape(-1), lengths * expand
    out = np.full((len(rows), max(int(lengths.max(initial=0)), 1)), fill, np.int64)
    out[np.arange(out.shape[1])[None] < lengths[:, None]] = flat  # row-major: each row's values in order
    return out, lengths


def _floor_div(x: np.ndarray, size: int) -> np.ndarray:
    """x // size for x >= 0; a shift when size is a power of two (numpy's int64 // is several times slower)."""
    return x >> (size.bit_length() - 1) if size & (size - 1) == 0 else x // size


def _remainder(x: np.ndarray, size: int) -> np.ndarray:
    """x % size for x >= 0; a mask when size is a power of two."""
    return x & (size - 1) if size & (size - 1) == 0 else x % size


def _flat(rows: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
    """Ragged integer rows as (row index, value) pairs."""
    lengths = [len(x) for x in rows]
    # one C-level conversion per row (a session's history turns run to hundreds of positions)
    values = np.concatenate([np.asarray(x, np.int64) for x in rows]) if sum(lengths) else np.zeros(0, np.int64)
    return np.repeat(np.arange(len(rows)), lengths), values


def pack_batch(items: Sequence[Any], blocks: Sequence[Any], plans: dict[int, LayerPlan],
               sources: dict[int, Any], groups: Sequence[HeadGroup], T: int, S: int,
               keys_to: Callable[[int], int] = int) -> tuple[Packer, dict[int, LayerSpan]]:
    """Every index of a batch of requests (`FetchItem`s with their recorded block ids).

    Per layer: q slots [R, T] and key slots [R, L_group] as (block, offset); per group and head (or
    once, Hg = 1, when the group's layers span the same keys): key positions [R, Hg, L] (-1: padding),
    source columns [R, Hg, S] with their validity, and the category masks [R, Hg, 4, L] in `MASSES` order, L padded to the group's longest span (then to
    `keys_to` of it: padded keys are masked like a shorter request's). Returns
    the packer and each layer's key span. Whole-batch array operations per layer: the host work
    does not grow with a loop over requests (it runs on the engine's thread, between steps)."""
    R = len(items)
    packer = Packer()
    n_prompt = np.asarray([it.n_prompt for it in items], np.int64)
    n_tokens = np.asarray([it.n_tokens for it in items], np.int64)
    # query t of request r sits at n_prompt - 1 + t; pad queries repeat the last one (finite, dropped)
    qpos = (n_prompt - 1)[:, None] + np.minimum(np.arange(T)[None], (n_tokens - 1)[:, None])
    packer.put("qpos", qpos)
    spans: dict[int, LayerSpan] = {}
    by_window: dict[int | None, LayerSpan] = {}  # a span depends on the layer's window only
    first_query, last_query = n_prompt - 1, n_prompt + n_tokens - 2
    for layer, plan in plans.items():
        if plan.sliding_window not in by_window:
            w = plan.sliding_window  # `key_span` over whole arrays: the first query's window start
            lo = np.zeros(R, np.int64) if w is None else np.maximum(first_query - w + 1, 0)
            span = LayerSpan(lo.tolist(), (last_query - lo + 1).tolist())
            # a window longer than every request's keys spans what full attention spans: the same object,
            # so that every array built per span below is built once for both
            by_window[plan.sliding_window] = next((s for s in by_window.values() if s == span), span)
        spans[layer] = by_window[plan.sliding_window]
    span_arrays = {id(s): (np.asarray(s.lo, np.int64), np.asarray(s.n_keys, np.int64)) for s in by_window.values()}
    source, _ = _padded([it.source_positions for it in items], -1)
    generated_start = np.asarray([it.generated_start for it in items], np.int64)
    blocks_by_key = {"context": _flat([it.context_positions for it in items]),
                     "history": _flat([it.history_positions for it in items])}
    row = np.arange(R)[:, None]  # fancy-indexes each request's own table row
    # Layers that share a span share every key-position array, and layers that also share a KV
    # group share the slots: each is built once and the packer sends it once (the others alias it).
    tables: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}
    positional: dict[tuple, tuple] = {}
    sent: dict[tuple, str] = {}

    def table_of(src: Any) -> tuple[np.ndarray, np.ndarray]:
        key = (src.group, k := src.blocks_per_kv_block)
        if key not in tables:  # `kernel_block_ids` on arrays: manager block b is kernel blocks b*k .. b*k+k-1
            kernel_block_ids([], k)  # raises for k < 1
            tables[key] = _padded([blocks[r][src.group] for r in range(R)], 0, k)
        return tables[key]

    def put_once(name: str, key: tuple, make: Any) -> None:
        if key in sent:
            packer.alias(name, sent[key])
        else:
            packer.put(name, make())
            sent[key] = name

    for g, group in enumerate(groups):
        L = keys_to(max(max(spans[l].n_keys) for l in group.layers))
        per_layer = {}
        for layer in group.layers:
            src = sources[layer]
            bs = src.block_size
            span = id(spans[layer])  # the key of everything built per span (spans are shared, above)
            table, n_blocks = table_of(src)
            lo, n = span_arrays[span]
            last = lo + n - 1  # the last query's position: every index read is at or before it
            short = np.flatnonzero(last // bs >= n_blocks)
            if len(short):
                check_covered(int(last[short[0]]), int(n_blocks[short[0]]), bs)  # raises, naming the position
            if (span, L) not in positional:
                valid = np.arange(L)[None] < n[:, None]
                positions = lo[:, None] + np.arange(L)[None]
                rel = source - lo[:, None]
                inside = (source >= 0) & (rel >= 0) & (rel < n[:, None])
                src_index = np.zeros((R, S), np.int64)
                src_valid = np.zeros((R, S), np.uint8)
                src_index[:, : source.shape[1]] = np.where(inside, rel, 0)
                src_valid[:, : source.shape[1]] = inside
                source_key = np.zeros((R, L), bool)
                hit_r, hit_c = np.nonzero(inside)
                source_key[hit_r, rel[hit_r, hit_c]] = True
                gen = positions >= generated_start[:, None]
                masks = np.zeros((R, len(MASSES), L), np.uint8)
                masks[:, 0] = valid & ~source_key & ~gen
                masks[:, 1] = valid & gen
                for m, name in ((2, "context"), (3, "history")):
                    owner, pos = blocks_by_key[name]
                    at = pos - lo[owner]
                    ok = (at >= 0) & (at < n[owner])
                    masks[owner[ok], m, at[ok]] = 1
                safe = np.where(valid, positions, 0)  # pads read slot 0, masked
                positional[(span, L)] = (valid, np.where(valid, positions, -1), safe, src_index, src_valid, masks)
            valid, kpos, safe, src_index, src_valid, masks = positional[(span, L)]
            kv = (src.group, src.blocks_per_kv_block, bs)
            # the query cache is indexed by KV slot
            put_once(f"qslots{layer}", ("q", *kv), lambda: table[row, _floor_div(qpos, bs)] * bs + _remainder(qpos, bs))
            put_once(f"k_block{layer}", ("kb", *kv, span, L),
                     lambda: np.where(valid, table[row, _floor_div(safe, bs)], 0))
            put_once(f"k_off{layer}", ("ko", bs, span, L), lambda: _remainder(safe, bs))  # safe: 0 at pads
            per_layer[layer] = (kpos, src_index, src_valid, masks)
        # Per head, its layer's arrays (heads are layer-major: repeat each layer's once per head); when
        # every layer of the group spans the same keys (Gemma-4: one window per group), one copy, [R, 1, ...],
        # which the rebuild broadcasts over the heads.
        pick = [layer for layer, _ in group.heads]
        if len({id(spans[layer]) for layer in group.layers}) == 1:
            pick = pick[:1]
        packer.put(f"kpos_g{g}", np.stack([per_layer[l][0] for l in pick], axis=1))
        packer.put(f"src_index_g{g}", np.stack([per_layer[l][1] for l in pick], axis=1))
        packer.put(f"src_valid_g{g}", np.stack([per_layer[l][2] for l in pick], axis=1), "u8")
        packer.put(f"masks_g{g}", np.stack([per_layer[l][3] for l in pick], axis=1), "u8")
    return packer, spans


class GroupConstants:
    """Per-group device tensors made once per fetcher: KV heads to gather, each head's window."""

    def __init__(self, group: HeadGroup, plans: dict[int, LayerPlan], sources: dict[int, Any],
                 device: torch.device) -> None:
        for layer in group.layers:
            check_kv_layout(sources[layer].kv_cache, f" on layer {layer}")
        self.kv_heads = {l: torch.tensor(plans[l].kv_heads, dtype=torch.long, device=device) for l in group.layers}
        self.window = torch.tensor([plans[l].sliding_window or NO_WINDOW for l, _ in group.heads],
                                   dtype=torch.long, device=device)


def gather_group(group: HeadGroup, consts: GroupConstants, sources: dict[int, Any], ix: dict[str, torch.Tensor]
                 ) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    """Per layer of the group: q [R, T, h, D] from the query cache and the keys its heads read
    [R, L, h, D] from the KV cache (padding reads slot 0; it is masked)."""
    gathered = {}
    for layer in group.layers:
        src = sources[layer]
        q = src.cache.q[ix[f"qslots{layer}"]]
        keys = src.kv_cache[ix[f"k_block{layer}"][..., None], 0, ix[f"k_off{layer}"][..., None],
                            consts.kv_heads[layer]]
        gathered[layer] = (q, keys)
    return gathered


def rebuild_group(group: HeadGroup, consts: GroupConstants, gathered: dict[int, tuple[torch.Tensor, torch.Tensor]],
                  ix: dict[str, torch.Tensor], g: int, S: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One group's [R, T, Hg, S + 4] (source columns, then the `MASSES`) and its probs [R, T, Hg, L]."""
    parts = [gathered[layer] for layer in group.layers]
    q = (torch.cat([p[0] for p in parts], dim=2) if len(parts) > 1 else parts[0][0]).float()
    keys = (torch.cat([p[1] for p in parts], dim=2) if len(parts) > 1 else parts[0][1]).float()
    scores = torch.einsum("rthd,rlhd->rthl", q, keys) * group.scaling
    if group.softcap:
        scores = torch.tanh(scores / group.softcap) * group.softcap
    qp = ix["qpos"][:, :, None, None]  # [R, T, 1, 1]
    kp = ix[f"kpos_g{g}"][:, None]  # [R, 1, Hg, L]
    visible = (kp >= 0) & (kp <= qp) & (kp > qp - consts.window[None, None, :, None])
    probs = torch.softmax(scores.masked_fill(~visible, -math.inf), dim=-1)
    R, T, Hg, _ = probs.shape  # the index arrays have Hg heads or one (broadcast)
    cols = probs.gather(-1, ix[f"src_index_g{g}"][:, None].expand(R, T, Hg, S))
    cols = cols * ix[f"src_valid_g{g}"][:, None].to(probs.dtype)
    masses = (probs[:, :, :, None, :] * ix[f"masks_g{g}"][:, None].to(probs.dtype)).sum(-1)  # [R, T, Hg, 4]
    return torch.cat([cols, masses], dim=-1), probs


def rebuild_batch(groups: Sequence[HeadGroup], consts: Sequence[GroupConstants], sources: dict[int, Any],
                  ix: dict[str, torch.Tensor], S: int, perm: torch.Tensor,
                  between: Callable[[], None] = lambda: None) -> tuple[torch.Tensor, list, list]:
    """The whole batch's [R, T, H, S + 4] in the caller's head order, from device tensors only (no
    host sync: it can be captured), with each group's gathered q and keys and its probs. `between`
    runs after the gathers (a timing mark)."""
    gathered = [gather_group(g, c, sources, ix) for g, c in zip(groups, consts)]
    between()
    built = [rebuild_group(g, c, gat, ix, k, S) for k, (g, c, gat) in enumerate(zip(groups, consts, gathered))]
    full = torch.cat([b[0] for b in built], dim=2) if len(built) > 1 else built[0][0]
    return full.index_select(2, perm), gathered, [b[1] for b in built]
