"""The paged query cache: the selected heads' post-RoPE q, stored by KV-cache slot.

An engine that replays CUDA graphs runs no Python during a decode step, so whatever the capture
writes must be (1) a tensor op on (2) memory that exists before the graph is captured, at (3) an
address the step itself supplies. vLLM already has such an address: the step's `slot_mapping`, the
index its KV-cache write uses (padded batch rows carry a negative pad slot). The query cache is a
small buffer beside the KV cache, indexed by that same slot: a row per KV slot for the captured
heads of one layer, plus one dump row that pad slots are sent to. After a draft, the rows of the
request's drafted tokens are read back by the request's block table, the keys are read from the
KV cache by the same slots, and the attention rows are rebuilt with the model's own math.

Everything here is plain torch (CPU in the tests, CUDA in the engine); nothing imports vLLM.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch

from alignatt.capture.attention import attention_row
from alignatt.core.draft import Head
from alignatt.core.errors import AlignattError
from alignatt.core.layout import AttentionLayout


@dataclass(frozen=True)
class LayerPlan:
    """What is captured on one layer and how its rows are rebuilt."""

    layer: int
    heads: tuple[int, ...]  # query heads captured on this layer, ascending
    kv_heads: tuple[int, ...]  # the KV head each captured query head reads (GQA)
    n_heads: int
    n_kv_heads: int
    head_dim: int
    scaling: float
    sliding_window: int | None
    softcap: float | None
    kv_source_layer: int  # whose KV cache holds this layer's keys (itself unless KV-shared)


def plan_capture(layout: AttentionLayout, heads: Sequence[Head]) -> dict[int, LayerPlan]:
    """Group the selected heads by layer (ascending), validated against the layout."""
    heads = layout.validate_heads(heads)
    if len(set(heads)) != len(heads):
        raise AlignattError("the same (layer, head) is selected twice")
    by_layer: dict[int, set[int]] = {}
    for h in heads:
        by_layer.setdefault(h.layer, set()).add(h.head)
    plans = {}
    for layer in sorted(by_layer):
        la = layout[layer]
        hs = tuple(sorted(by_layer[layer]))
        plans[layer] = LayerPlan(
            layer=layer,
            heads=hs,
            kv_heads=tuple(la.kv_head(h) for h in hs),
            n_heads=la.n_heads,
            n_kv_heads=la.n_kv_heads,
            head_dim=la.head_dim,
            scaling=la.scaling,
            sliding_window=la.sliding_window,
            softcap=la.softcap,
            kv_source_layer=la.kv_source_layer,
        )
    return plans


def head_order(plans: dict[int, LayerPlan], heads: Sequence[Head]) -> list[tuple[int, int]]:
    """For each selected head (in the caller's order): (layer, index within that layer's plan)."""
    return [(h.layer, plans[h.layer].heads.index(h.head)) for h in heads]


class QueryCache:
    """Per-layer buffers addressed by KV slot; allocate before any CUDA graph is captured.

    `q` holds the captured heads' post-RoPE query ([n_slots + 1, heads, head_dim]); `out`, when
    asked for, the same heads' attention output (for the self-consistency check). Row `n_slots`
    is the dump row: pad slots (< 0) write there, so a replayed padded batch never touches a
    real slot. Writes are fixed-shape tensor ops only, which is what makes them replay-safe.
    """

    def __init__(
        self,
        n_slots: int,
        n_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str,
        head_index: Sequence[int] | None = None,
        out_dim: int | None = None,
    ) -> None:
        if n_slots < 1 or n_heads < 1 or head_dim < 1:
            raise ValueError(f"bad query cache shape: slots={n_slots} heads={n_heads} dim={head_dim}")
        self.n_slots = n_slots
        self.dump_slot = n_slots
        self.q = torch.zeros(n_slots + 1, n_heads, head_dim, dtype=dtype, device=device)
        self.out = (
            torch.zeros(n_slots + 1, n_heads, out_dim, dtype=dtype, device=device) if out_dim else None
        )
        # Which query heads of the layer's [T, H * D] tensor to keep; a device tensor made now,
        # not per step, so a captured graph reads the same memory on every replay.
        index = list(range(n_heads)) if head_index is None else list(head_index)
        if len(index) != n_heads:
            raise ValueError(f"head_index has {len(index)} entries for {n_heads} heads")
        self.head_index = torch.tensor(index, dtype=torch.long, device=device)

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.q, self.out) if t is not None)

    def _targets(self, slots: torch.Tensor, n: int) -> torch.Tensor:
        if slots.shape[0] < n:
            raise RuntimeError(
                f"slot_mapping has {slots.shape[0]} entries for {n} tokens: the capture and the "
                "KV-cache write no longer see the same step"
            )
        slots = slots[:n]
        return torch.where(slots >= 0, slots, torch.full_like(slots, self.dump_slot))

    def write(self, x: torch.Tensor, slots: torch.Tensor) -> None:
        """Store the captured heads of `x` ([T, H * D] or [T, H, D]) at `slots` ([>= T])."""
        n = x.shape[0]
        heads = x.reshape(n, -1, self.q.shape[-1]).index_select(1, self.head_index)
        self.q.index_copy_(0, self._targets(slots, n), heads.to(self.q.dtype))

    def write_out(self, x: torch.Tensor, slots: torch.Tensor) -> None:
        """Store the captured heads of the attention output `x` ([T, H * Dv])."""
        if self.out is None:
            raise RuntimeError("this query cache was built without an output buffer")
        n = x.shape[0]
        heads = x.reshape(n, -1, self.out.shape[-1]).index_select(1, self.head_index)
        self.out.index_copy_(0, self._targets(slots, n), heads.to(self.out.dtype))

    def read(self, slots: torch.Tensor) -> torch.Tensor:
        return self.q.index_select(0, slots.to(self.q.device))

    def read_out(self, slots: torch.Tensor) -> torch.Tensor:
        if self.out is None:
            raise RuntimeError("this query cache was built without an output buffer")
        return self.out.index_select(0, slots.to(self.out.device))


# ---- block table -> slot addressing (vLLM's own arithmetic, see v1/worker/block_table.py) ----


def kernel_block_ids(manager_block_ids: Sequence[int], blocks_per_kv_block: int) -> list[int]:
    """Expand KV-manager block ids into attention-kernel block ids (manager block b covers
    kernel blocks b*k .. b*k+k-1 when the kernel block is k times smaller)."""
    if blocks_per_kv_block < 1:
        raise ValueError(f"blocks_per_kv_block must be >= 1, got {blocks_per_kv_block}")
    return [b * blocks_per_kv_block + j for b in manager_block_ids for j in range(blocks_per_kv_block)]


def check_covered(last_position: int, n_blocks: int, block_size: int) -> None:
    """A request's block table must reach its last token position."""
    if last_position // block_size >= n_blocks:
        raise AlignattError(
            f"position {last_position} lies past the request's {n_blocks} blocks of "
            f"{block_size} tokens: the block table does not cover the draft"
        )


def check_kv_layout(kv_cache: torch.Tensor, where: str = "") -> None:
    """The KV-cache layout the gathers index: TRITON_ATTN's [num_blocks, 2, block_size, kv_heads, dim]."""
    if kv_cache.dim() != 5 or kv_cache.shape[1] != 2:
        raise RuntimeError(
            f"unexpected KV cache shape {tuple(kv_cache.shape)}{where}: expected "
            "[num_blocks, 2, block_size, num_kv_heads, head_size] (TRITON_ATTN layout)"
        )


def slots_for_positions(block_ids: Sequence[int], block_size: int, positions: torch.Tensor) -> torch.Tensor:
    """KV slot of each token position of one request: block_ids[p // bs] * bs + p % bs."""
    positions = positions.to(torch.long)
    if positions.numel() and int(positions.min()) < 0:
        raise ValueError("negative token position")
    table = torch.as_tensor(list(block_ids), dtype=torch.long, device=positions.device)
    blocks = torch.div(positions, block_size, rounding_mode="floor")
    if positions.numel():
        check_covered(int(positions.max()), table.numel(), block_size)
    return table[blocks] * block_size + positions % block_size


def visible_range(query_position: int, sliding_window: int | None) -> tuple[int, int]:
    """Inclusive [lo, hi] of key positions a query at `query_position` attends to."""
    lo = 0 if sliding_window is None else max(0, query_position - sliding_window + 1)
    return lo, query_position


def key_span(query_positions: Sequence[int], sliding_window: int | None) -> tuple[int, int]:
    """Inclusive key range covering every listed query (what one gather must fetch)."""
    return visible_range(min(query_positions), sliding_window)[0], max(query_positions)


def gather_kv(kv_cache: torch.Tensor, slots: torch.Tensor, part: int) -> torch.Tensor:
    """Rows of a vLLM KV cache ([blocks, 2, block_size, kv_heads, dim]; part 0 = K, 1 = V)."""
    check_kv_layout(kv_cache)
    block_size = kv_cache.shape[2]
    slots = slots.to(kv_cache.device, torch.long)
    blocks = torch.div(slots, block_size, rounding_mode="floor")
    return kv_cache[blocks, part, slots % block_size]


# ---- reconstruction ----


def rebuild_rows(
    plan: LayerPlan,
    q: torch.Tensor,
    query_positions: torch.Tensor,
    keys: torch.Tensor,
    key_positions: torch.Tensor,
    method: str = "batched",
) -> torch.Tensor:
    """Attention of T queries over L keys for the plan's heads: fp32 [T, heads, L].

    q: [T, heads, D] captured rows; keys: [L, kv_heads, D] (all KV heads of the layer's cache);
    key_positions: [L]; query_positions: [T]. `reference` calls `attention_row` once per token;
    `batched` passes all T queries to it at once (tested to agree with `reference`).
    """
    kv = torch.as_tensor(plan.kv_heads, dtype=torch.long, device=keys.device)
    k_sel = keys.index_select(1, kv).permute(1, 0, 2).float()  # [heads, L, D]
    if method == "reference":
        return torch.stack(
            [
                attention_row(q[t], k_sel, key_positions, int(query_positions[t]), plan.scaling,
                              plan.sliding_window, plan.softcap)
                for t in range(q.shape[0])
            ]
        )
    if method != "batched":
        raise ValueError(f"unknown reconstruction method {method!r}")
    return attention_row(q, k_sel, key_positions.to(q.device), query_positions.to(q.device, torch.long),
                         plan.scaling, plan.sliding_window, plan.softcap)


def rebuild_output(plan: LayerPlan, probs: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """softmax(qK)·V for the plan's heads: probs [T, heads, L], values [L, kv_heads, Dv] ->
    fp32 [T, heads, Dv]. What the kernel should have written, for the self-consistency check."""
    kv = torch.as_tensor(plan.kv_heads, dtype=torch.long, device=values.device)
    v_sel = values.index_select(1, kv).permute(1, 0, 2).float()
    return torch.einsum("thl,hld->thd", probs.float(), v_sel)


# A row of attention output is a convex combination of value rows, and Gemma-4's values are
# RMS-normalised without a scale (per-element RMS 1): a real layer's output cannot fall below this
# per-element RMS. Rows under it are dead activations, where any relative error means nothing.
TINY_OUTPUT_RMS = 1e-3


def consistency_stats(own: torch.Tensor, rebuilt: torch.Tensor) -> dict:
    """Compare a layer's own attention output with softmax(q K) V rebuilt from the capture.

    own, rebuilt: [..., D] (one row per token and head). Per row: relative error
    ||own - rebuilt|| / max(||rebuilt||, tiny) with tiny = TINY_OUTPUT_RMS * sqrt(D), and cosine
    only on rows whose rebuilt norm is not tiny ("live" rows).
    """
    if own.shape != rebuilt.shape:
        raise ValueError(f"output {tuple(own.shape)} vs rebuilt {tuple(rebuilt.shape)}")
    d = own.shape[-1]
    a = own.reshape(-1, d).double()
    b = rebuilt.reshape(-1, d).double()
    tiny = TINY_OUTPUT_RMS * math.sqrt(d)
    nb = b.norm(dim=-1)
    rel = (a - b).norm(dim=-1) / nb.clamp_min(tiny)
    live = nb >= tiny
    cos = torch.nn.functional.cosine_similarity(a[live], b[live], dim=-1) if bool(live.any()) else None
    return {
        "rows": int(a.shape[0]),
        "live_rows": int(live.sum()),
        "max_rel_err": float(rel.max()) if rel.numel() else None,
        "mean_rel_err": float(rel.mean()) if rel.numel() else None,
        "min_cos": float(cos.min()) if cos is not None else None,
        "max_abs_err": float((a - b).abs().max()) if a.numel() else None,
        "output_rms": float(a.pow(2).mean().sqrt()) if a.numel() else None,
        "rebuilt_rms": float(b.pow(2).mean().sqrt()) if b.numel() else None,
    }


def judge_consistency(stats: dict, max_rel_err: float, min_cos: float, min_live_fraction: float = 0.5) -> str:
    """'passed', 'failed' or 'degenerate activations' (most rows dead: the check would be empty)."""
    if not stats["rows"] or stats["live_rows"] < min_live_fraction * stats["rows"]:
        return "degenerate activations"
    ok = stats["max_rel_err"] <= max_rel_err and stats["min_cos"] is not None and stats["min_cos"] >= min_cos
    return "passed" if ok else "failed"


@dataclass
class SplitRows:
    rows: torch.Tensor  # fp32 [T, heads, S]: mass on each source token position
    other_prompt: torch.Tensor  # fp32 [T, heads]: non-source prompt tokens before the prefix
    generated: torch.Tensor  # fp32 [T, heads]: accepted target prefix + drafted tokens


def split_rows(
    full: torch.Tensor, key_lo: int, source_positions: Sequence[int], generated_start: int
) -> SplitRows:
    """Split rows over the contiguous key positions key_lo.. into the `Draft` mass categories.

    Source positions before key_lo (outside a sliding window) get exactly 0.
    """
    T, H, L = full.shape
    src = torch.as_tensor(list(source_positions), dtype=torch.long, device=full.device)
    rel = src - key_lo
    inside = (rel >= 0) & (rel < L)
    rows = torch.zeros(T, H, src.numel(), dtype=full.dtype, device=full.device)
    if bool(inside.any()):
        rows[:, :, inside] = full.index_select(2, rel[inside])
    kp = torch.arange(key_lo, key_lo + L, device=full.device)
    is_src = torch.zeros(L, dtype=torch.bool, device=full.device)
    if bool(inside.any()):
        is_src[rel[inside]] = True
    is_gen = kp >= generated_start
    generated = full[:, :, is_gen].sum(-1)
    other = full[:, :, ~is_src & ~is_gen].sum(-1)
    return SplitRows(rows=rows, other_prompt=other, generated=generated)
