"""The batched rebuild behind `BatchFetcher.fetch`: a compact host pack, then few, large device ops.

Heads are grouped by what their rows are rebuilt with (head size, scaling, softcap): a layer's
heads always fall in one group, and on Gemma-4 the sliding and the full layers make two groups.
Per group there is one gather per layer for q and one for the keys (the captured heads' KV heads
only), then one matmul, one softmax, one gather of the source columns and one masked sum of the
four mass categories over the whole padded batch [requests, tokens, heads, keys].

The host packs only what each request is (`pack_batch`: its lengths, source, context and history
positions, and its block tables), in one int64 buffer and one pinned copy; `expand_indices` builds
every [requests, keys] index from it on the device (slots as block and offset, key positions,
source columns, category masks), with static shapes, so that the whole rebuild can be captured as
one CUDA graph (graphed.py). Nothing here waits on the device: the result stays on the GPU until
the caller copies it back.

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
    """Host arrays of one batch, laid out in one flat int64 buffer."""

    def __init__(self) -> None:
        self.parts: list[np.ndarray] = []
        self.at: dict[str, tuple[int, int, tuple]] = {}
        self.size = 0

    def put(self, name: str, array: np.ndarray) -> None:
        flat = array.reshape(-1).astype(np.int64, copy=False)  # concatenated later
        self.parts.append(flat)
        self.at[name] = (self.size, self.size + flat.size, array.shape)
        self.size += flat.size

    def to_host(self, pin: bool) -> torch.Tensor:
        """The buffer as one host tensor; pinned (`pin`), so that its copy to the device does not wait.

        The parts are concatenated straight into a block of torch's caching host allocator, which
        keeps the block until the copy that reads it has run. `Tensor.pin_memory()` on a fresh array
        took 2 ms a call in the engine at 128 speakers on the H200 (cProfile, 2026-12-03), nearly
        half of the fetch's host time; an allocator block is not among the step's costs."""
        host = torch.empty(self.size, dtype=torch.int64, pin_memory=pin)
        np.concatenate(self.parts, out=host.numpy())
        return host

    def views(self, buffer: torch.Tensor) -> dict[str, torch.Tensor]:
        """Every array put, as a view of the buffer (which may be longer than this batch's)."""
        return {name: buffer[a:b].view(shape) for name, (a, b, shape) in self.at.items()}

    def layout(self) -> tuple:
        """What the views depend on: every name's place and shape (a captured graph reads these)."""
        return self.size, tuple(self.at.items())


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


@dataclass(frozen=True)
class BatchShape:
    """A packed batch's sizes that no host array carries: with the packer's layout, what a captured
    graph of its rebuild depends on."""

    T: int  # tokens per request
    S: int  # source columns
    L: tuple[int, ...]  # keys per head group


def _padded(rows: Sequence[Sequence[int]], fill: int, width: int = 0, expand: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Ragged integer rows as one [R, max(longest, width, 1)] array padded with `fill`, and each
    row's length; with `expand` k, each value v becomes v*k .. v*k+k-1. One pass over all values."""
    lengths = np.fromiter(map(len, rows), np.int64, len(rows))
    n = int(lengths.sum())
    if n and isinstance(rows[0], np.ndarray):
        flat = np.concatenate(rows).astype(np.int64, copy=False)
    else:
        flat = np.fromiter(chain.from_iterable(rows), np.int64, n)
    if expand != 1:
        flat, lengths = (flat[:, None] * expand + np.arange(expand)).reshape(-1), lengths * expand
    out = np.full((len(rows), max(int(lengths.max(initial=0)), width, 1)), fill, np.int64)
    out[np.arange(out.shape[1])[None] < lengths[:, None]] = flat  # row-major: each row's values in order
    return out, lengths


def window_start(first_query: Any, window: int | None) -> Any:
    """The first key a span of queries from `first_query` sees (numpy or torch, elementwise)."""
    return first_query * 0 if window is None else (first_query - window + 1).clip(min=0)


def pack_batch(items: Sequence[Any], blocks: Sequence[Any], plans: dict[int, LayerPlan],
               sources: dict[int, Any], groups: Sequence[HeadGroup], T: int, S: int,
               keys_to: Callable[[int], int] = int, widths: Callable[[int], int] = int
               ) -> tuple[Packer, dict[int, LayerSpan], BatchShape]:
    """What each request of a batch (`FetchItem`s with their recorded block ids) is, for
    `expand_indices`: "request" [R, 3] (prompt length, tokens, first generated position), "source"
    [R, S], "context" and "history" [R, widths(longest)] (positions, -1: padding), and one block
    table [R, widths(most blocks)] per KV group and kernel split (kernel block ids, 0: padding).

    Also checks that every table covers its request's last query, and returns each layer's key span
    and the batch's shape (L per group: the longest span, then `keys_to` of it; padded keys are
    masked like a shorter request's). Whole-batch array operations over [R]-sized arrays: the host
    work does not grow with the keys."""
    R = len(items)
    packer = Packer()
    n_prompt = np.asarray([it.n_prompt for it in items], np.int64)
    n_tokens = np.asarray([it.n_tokens for it in items], np.int64)
    generated_start = np.asarray([it.generated_start for it in items], np.int64)
    packer.put("request", np.stack([n_prompt, n_tokens, generated_start], axis=1))
    source, _ = _padded([it.source_positions for it in items], -1, S)
    packer.put("source", source[:, :S])
    for name in ("context", "history"):
        rows = [getattr(it, f"{name}_positions") for it in items]
        packer.put(name, _padded(rows, -1, widths(max(map(len, rows))))[0])
    first_query, last_query = n_prompt - 1, n_prompt + n_tokens - 2
    by_window: dict[int | None, LayerSpan] = {}
    for plan in plans.values():
        if plan.sliding_window not in by_window:
            lo = window_start(first_query, plan.sliding_window)
            by_window[plan.sliding_window] = LayerSpan(lo.tolist(), (last_query - lo + 1).tolist())
    spans = {layer: by_window[plan.sliding_window] for layer, plan in plans.items()}
    for layer in plans:
        src = sources[layer]
        name = f"table{src.group}_{src.blocks_per_kv_block}"
        if name not in packer.at:  # `kernel_block_ids` on arrays: manager block b is kernel blocks b*k .. b*k+k-1
            kernel_block_ids([], src.blocks_per_kv_block)  # raises for k < 1
            rows = [blocks[r][src.group] for r in range(R)]
            width = widths(max(map(len, rows)) * src.blocks_per_kv_block)
            table, n_blocks = _padded(rows, 0, width, src.blocks_per_kv_block)
            packer.put(name, table)
            short = np.flatnonzero(last_query // src.block_size >= n_blocks)
            if len(short):
                check_covered(int(last_query[short[0]]), int(n_blocks[short[0]]), src.block_size)  # raises
    L = tuple(keys_to(max(max(spans[layer].n_keys) for layer in group.layers)) for group in groups)
    return packer, spans, BatchShape(T, S, L)


def _positional(ix: dict[str, torch.Tensor], window: int | None, L: int) -> tuple[torch.Tensor, ...]:
    """One window's [R, L] key arrays on the device: validity, positions (-1: padding), positions to
    read (0 at padding), the source columns [R, S] and their validity, and the masks [R, 4, L]."""
    n_prompt, n_tokens, generated_start = ix["request"].unbind(1)
    lo = window_start(n_prompt - 1, window)
    n = n_prompt + n_tokens - 1 - lo  # through the last query, n_prompt + n_tokens - 2
    keys = torch.arange(L, device=lo.device)
    valid = keys[None] < n[:, None]
    positions = lo[:, None] + keys[None]

    def marks(pos: torch.Tensor) -> torch.Tensor:
        """[R, L]: True at each of the row's positions inside its span (a spare column takes the rest)."""
        at = pos - lo[:, None]
        inside = (pos >= 0) & (at >= 0) & (at < n[:, None])
        hit = torch.zeros(pos.shape[0], L + 1, dtype=torch.bool, device=pos.device)
        return hit.scatter_(1, torch.where(inside, at, L), True)[:, :L]

    source = ix["source"]
    rel = source - lo[:, None]
    src_valid = (source >= 0) & (rel >= 0) & (rel < n[:, None])
    generated = positions >= generated_start[:, None]
    masks = torch.stack([valid & ~marks(source) & ~generated, valid & generated,
                         marks(ix["context"]), marks(ix["history"])], dim=1)
    return (valid, torch.where(valid, positions, -1), torch.where(valid, positions, 0),
            torch.where(src_valid, rel, 0), src_valid, masks)


def expand_indices(ix: dict[str, torch.Tensor], shape: BatchShape, plans: dict[int, LayerPlan],
                   sources: dict[int, Any], groups: Sequence[HeadGroup]) -> dict[str, torch.Tensor]:
    """Every index `gather_group` and `rebuild_group` read, built on the device from `pack_batch`'s
    arrays (static shapes, no host sync: it is captured with them). Per layer: q slots [R, T] and key
    slots [R, L] as (block, offset); per group and head (or once, Hg = 1, when the group's layers
    share one window, as on Gemma-4): key positions [R, Hg, L], source columns and their validity
    [R, Hg, S], and the category masks [R, Hg, 4, L] in `MASSES` order."""
    n_prompt, n_tokens, _ = ix["request"].unbind(1)
    tokens = torch.arange(shape.T, device=n_prompt.device)
    # query t of request r sits at n_prompt - 1 + t; pad queries repeat the last one (finite, dropped)
    qpos = (n_prompt - 1)[:, None] + torch.minimum(tokens[None], (n_tokens - 1)[:, None])
    out = {"qpos": qpos}
    positional: dict[tuple, tuple] = {}
    slots: dict[tuple, tuple] = {}  # layers reading one table with one window share their slots
    for g, group in enumerate(groups):
        L = shape.L[g]
        per_layer = {}
        for layer in group.layers:
            window, src = plans[layer].sliding_window, sources[layer]
            if (window, L) not in positional:
                positional[(window, L)] = _positional(ix, window, L)
            valid, kpos, safe, src_index, src_valid, masks = positional[(window, L)]
            table_name, bs = f"table{src.group}_{src.blocks_per_kv_block}", src.block_size
            key = (table_name, bs, window, L)
            if key not in slots:
                table = ix[table_name]
                slots[key] = (table.gather(1, qpos // bs) * bs + qpos % bs,  # the query cache is indexed by KV slot
                              torch.where(valid, table.gather(1, safe // bs), 0), safe % bs)
            out[f"qslots{layer}"], out[f"k_block{layer}"], out[f"k_off{layer}"] = slots[key]
            per_layer[layer] = (kpos, src_index, src_valid, masks)
        pick = [layer for layer, _ in group.heads]  # heads are layer-major: each layer's arrays once per head
        if len({plans[layer].sliding_window for layer in group.layers}) == 1:
            pick = pick[:1]  # one window: one copy, broadcast over the heads by the rebuild
        for j, name in enumerate(("kpos", "src_index", "src_valid", "masks")):
            out[f"{name}_g{g}"] = torch.stack([per_layer[layer][j] for layer in pick], dim=1)
    return out


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
    kp = ix[f"kpos_g{g}"][:, None]  # [R, 1, Hg or 1, L]
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
