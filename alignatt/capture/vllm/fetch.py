"""Fetch + rebuild for `vllm_capture`: every request that finished in a step, read and rebuilt at once.

A finished request's drafted tokens have their q rows in the query caches (slot-addressed, written
by the hooks) and the keys they saw in vLLM's KV cache, both found through the request's block
table. `BatchFetcher.fetch` does this for all requests of one engine step together: the slot and
mask indices are built on the host from the recorded block ids (no device reads), go to the GPU
in one copy, and per layer there is one q gather, one key gather and one fp32 softmax over the
padded batch [requests, tokens, heads, keys]; the rows, masses and splits of every request come
back in one device-to-host copy. `fetch_one` is the per-request reference path (the rebuild the
seam used before batching), kept for tests and `reconstruct="reference"`.

Callers must fetch before the next engine step: vLLM frees a finished request's blocks when it
reports it finished, and the next step may hand them to a new request (the gathers are queued on
the current stream ahead of that step's forward).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import numpy as np
import torch

from alignatt.capture.vllm.qcache import (
    LayerPlan,
    QueryCache,
    gather_kv,
    kernel_block_ids,
    key_span,
    rebuild_rows,
    slots_for_positions,
    split_rows,
)
from alignatt.core.draft import DraftRequest, sync
from alignatt.core.errors import AlignattError


@dataclass
class DraftState:
    """One request in the engine, from submission to its finished draft."""

    handle: str  # the id alignatt gave it (vLLM's external request id)
    internal: str  # vLLM's internal id: the key of its recorded block ids
    request: DraftRequest
    prompt: Any  # alignatt.core.prompt.PromptLayout
    submitted_at: float
    tokens: list[int] = field(default_factory=list)
    first_token_at: Optional[float] = None
    finished_at: Optional[float] = None
    finish_reason: Optional[str] = None
    cached_tokens: Optional[int] = None  # prompt tokens vLLM's prefix cache served (None: not reported)


@dataclass(frozen=True)
class FetchItem:
    """What the fetch needs of one finished request."""

    request_id: str  # key into the recorded block ids
    n_prompt: int
    n_tokens: int  # drafted tokens whose rows are wanted (>= 1)
    source_positions: tuple[int, ...]
    generated_start: int  # first key position counted as generated (target prefix + draft)
    # The prompt's context block and history turns (empty: none; their mass is then not reported).
    context_positions: tuple[int, ...] = ()
    history_positions: tuple[int, ...] = ()


@dataclass
class RawCapture:
    """What one draft fetched, kept when `keep_raw=True` (for the GPU checks)."""

    query_positions: np.ndarray  # [n]
    layers: dict[int, dict[str, Any]]  # per layer: q [n,h,D], keys [L,kvh,D], key_lo, probs, ...


@dataclass
class FetchedRows:
    rows: np.ndarray  # float32 [T, H, S] in head order
    other_prompt: np.ndarray  # float32 [T, H]
    generated: np.ndarray  # float32 [T, H]
    raw: Optional[RawCapture] = None
    context: Optional[np.ndarray] = None  # float32 [T, H]: mass on the context block (None: no block)
    history: Optional[np.ndarray] = None  # float32 [T, H]: mass on the history turns (None: none)


@dataclass
class LayerSource:
    """Where one captured layer's q rows and keys live in a running engine."""

    cache: QueryCache
    kv_cache: torch.Tensor  # [blocks, 2, block_size, kv_heads, dim]
    block_size: int  # kernel block size of the layer's KV-cache group
    blocks_per_kv_block: int  # kernel blocks per KV-manager block
    group: int  # KV-cache group id (index into a request's block ids)


@dataclass
class EngineView:
    """What the fetch reads of an engine: per-layer sources and the recorded block ids."""

    layers: dict[int, LayerSource]
    block_ids: dict[str, Any]  # request id -> block ids per KV-cache group (the hooks' live dict)

    @classmethod
    def from_hooks(cls, hooks: Any) -> "EngineView":
        layers = {}
        for layer in hooks.plans:
            group = hooks.group[layer]
            table = hooks.runner.input_batch.block_table[group]
            layers[layer] = LayerSource(hooks.caches[layer], hooks.attn[layer].kv_cache, table.block_size,
                                        table.blocks_per_kv_block, group)
        return cls(layers, hooks.block_ids)

    def take_blocks(self, request_id: str) -> Any:
        blocks = self.block_ids.pop(request_id, None)
        if blocks is None:
            raise RuntimeError(f"alignatt: no block table was recorded for request {request_id}")
        return blocks

    def device(self) -> torch.device:
        return next(iter(self.layers.values())).cache.q.device


@dataclass
class FetchTimings:
    capture_ms: float  # gathers of the whole step
    reconstruct_ms: float  # softmax, split and the copy to the host


def _slots(blocks: Sequence[int], block_size: int, positions: np.ndarray) -> np.ndarray:
    """Host-side `slots_for_positions`."""
    table = np.asarray(blocks, dtype=np.int64)
    index = positions // block_size
    if len(positions) and int(index.max()) >= len(table):
        raise AlignattError(
            f"position {int(positions.max())} lies past the request's {len(table)} blocks of "
            f"{block_size} tokens: the block table does not cover the draft"
        )
    return table[index] * block_size + positions % block_size


class BatchFetcher:
    """Rows of many finished requests from one engine step, with one softmax per layer."""

    def __init__(self, view: EngineView, plans: dict[int, LayerPlan], order: list[tuple[int, int]],
                 capture_output: bool = False, keep_raw: bool = False) -> None:
        self.view = view
        self.plans = plans
        self.order = order  # (layer, index within that layer's plan) for each head, in head order
        self.capture_output = capture_output
        self.keep_raw = keep_raw

    # ---- batched ----

    def fetch(self, items: Sequence[FetchItem]) -> tuple[list[FetchedRows], FetchTimings]:
        if not items:
            return [], FetchTimings(0.0, 0.0)
        device = self.view.device()
        blocks = [self.view.take_blocks(it.request_id) for it in items]
        R = len(items)
        T = max(it.n_tokens for it in items)
        S = max(max(len(it.source_positions) for it in items), 1)
        sync(device)
        t0 = time.perf_counter()
        host, spans = self._host_indices(items, blocks, T, S)
        index = torch.from_numpy(host).to(device, non_blocking=True)
        gathered = {}
        for layer, plan in self.plans.items():
            src = self.view.layers[layer]
            sp = spans[layer]
            ix = {k: index[a:b].view(shape) for k, (a, b, shape) in sp["at"].items()}
            L = sp["L"]
            q = src.cache.read(ix["qslots"].reshape(-1)).view(R, T, len(plan.heads), -1)
            keys = gather_kv(src.kv_cache, ix["kslots"].reshape(-1), 0).view(R, L, src.kv_cache.shape[3], -1)
            item = {"q": q, "keys": keys, **ix}
            if self.capture_output:
                item["values"] = gather_kv(src.kv_cache, ix["kslots"].reshape(-1), 1).view(
                    R, L, src.kv_cache.shape[3], -1)
                item["out"] = src.cache.read_out(ix["qslots"].reshape(-1)).view(R, T, len(plan.heads), -1)
            gathered[layer] = item
        sync(device)
        t1 = time.perf_counter()
        per_layer = {}
        probs_of = {}
        for layer, plan in self.plans.items():
            g = gathered[layer]
            probs = _batched_rows(plan, g["q"], g["qpos"], g["keys"], g["kpos"])  # [R, T, h, L]
            probs_of[layer] = probs
            h = probs.shape[2]
            src_index = g["src_index"][:, None, None, :].expand(R, T, h, S)
            rows = probs.gather(-1, src_index) * g["src_valid"][:, None, None, :].to(probs.dtype)
            gen = (probs * g["is_gen"][:, None, None, :].to(probs.dtype)).sum(-1)
            other = (probs * g["is_other"][:, None, None, :].to(probs.dtype)).sum(-1)
            ctx = (probs * g["is_ctx"][:, None, None, :].to(probs.dtype)).sum(-1)
            hist = (probs * g["is_hist"][:, None, None, :].to(probs.dtype)).sum(-1)
            per_layer[layer] = (rows, other, gen, ctx, hist)
        rows = torch.stack([per_layer[l][0][:, :, i] for l, i in self.order], dim=2)  # [R, T, H, S]
        other = torch.stack([per_layer[l][1][:, :, i] for l, i in self.order], dim=2)  # [R, T, H]
        gen = torch.stack([per_layer[l][2][:, :, i] for l, i in self.order], dim=2)
        ctx = torch.stack([per_layer[l][3][:, :, i] for l, i in self.order], dim=2)
        hist = torch.stack([per_layer[l][4][:, :, i] for l, i in self.order], dim=2)
        packed = torch.cat([rows.reshape(-1), other.reshape(-1), gen.reshape(-1), ctx.reshape(-1),
                            hist.reshape(-1)]).cpu().numpy()
        t2 = time.perf_counter()
        H = len(self.order)
        n_rows, n_mass = R * T * H * S, R * T * H
        rows_h = packed[:n_rows].reshape(R, T, H, S)
        other_h, gen_h, ctx_h, hist_h = (packed[n_rows + k * n_mass:n_rows + (k + 1) * n_mass].reshape(R, T, H)
                                         for k in range(4))
        out = []
        for r, it in enumerate(items):
            n, s = it.n_tokens, len(it.source_positions)
            raw = self._raw(r, it, spans, gathered, probs_of) if self.keep_raw else None
            out.append(FetchedRows(np.ascontiguousarray(rows_h[r, :n, :, :s]),
                                   np.ascontiguousarray(other_h[r, :n]), np.ascontiguousarray(gen_h[r, :n]), raw,
                                   np.ascontiguousarray(ctx_h[r, :n]) if it.context_positions else None,
                                   np.ascontiguousarray(hist_h[r, :n]) if it.history_positions else None))
        return out, FetchTimings((t1 - t0) * 1e3, (t2 - t1) * 1e3)

    def _host_indices(self, items: Sequence[FetchItem], blocks: list[Any], T: int, S: int
                      ) -> tuple[np.ndarray, dict]:
        """Every index tensor of the batch, packed into one int64 array (one host-to-device copy)."""
        R = len(items)
        parts: list[np.ndarray] = []
        spans: dict[int, dict] = {}
        cursor = 0

        def put(name: str, array: np.ndarray, at: dict) -> None:
            nonlocal cursor
            parts.append(array.reshape(-1).astype(np.int64))
            at[name] = (cursor, cursor + array.size, array.shape)
            cursor += array.size

        for layer, plan in self.plans.items():
            src = self.view.layers[layer]
            qpos = np.zeros((R, T), np.int64)
            los, his = [], []
            for r, it in enumerate(items):
                p = np.arange(it.n_prompt - 1, it.n_prompt - 1 + it.n_tokens)
                qpos[r, : it.n_tokens] = p
                qpos[r, it.n_tokens:] = p[-1]  # pad queries repeat the last one (finite, dropped)
                lo, hi = key_span(p.tolist(), plan.sliding_window)
                los.append(lo)
                his.append(hi)
            L = max(hi - lo + 1 for lo, hi in zip(los, his))
            kpos = np.full((R, L), -1, np.int64)
            qslots = np.zeros((R, T), np.int64)
            kslots = np.zeros((R, L), np.int64)  # pad keys read slot 0 and are masked (kpos -1)
            src_index = np.zeros((R, S), np.int64)
            src_valid = np.zeros((R, S), np.int64)
            is_gen = np.zeros((R, L), np.int64)
            is_other = np.zeros((R, L), np.int64)
            is_ctx = np.zeros((R, L), np.int64)
            is_hist = np.zeros((R, L), np.int64)
            for r, it in enumerate(items):
                kb = kernel_block_ids(blocks[r][src.group], src.blocks_per_kv_block)
                n_keys = his[r] - los[r] + 1
                kp = np.arange(los[r], his[r] + 1)
                kpos[r, :n_keys] = kp
                qslots[r] = _slots(kb, src.block_size, qpos[r])
                kslots[r, :n_keys] = _slots(kb, src.block_size, kp)
                sp = np.asarray(it.source_positions, np.int64) - los[r]
                inside = (sp >= 0) & (sp < n_keys)
                src_index[r, : len(sp)] = np.where(inside, sp, 0)
                src_valid[r, : len(sp)] = inside
                source_key = np.zeros(n_keys, bool)
                source_key[sp[inside]] = True
                gen = kp >= it.generated_start
                is_gen[r, :n_keys] = gen
                is_other[r, :n_keys] = ~source_key & ~gen
                for flags, positions in ((is_ctx, it.context_positions), (is_hist, it.history_positions)):
                    rel = np.asarray(positions, np.int64) - los[r]
                    flags[r, rel[(rel >= 0) & (rel < n_keys)]] = 1
            at: dict = {}
            for name, array in (("qpos", qpos), ("kpos", kpos), ("qslots", qslots), ("kslots", kslots),
                                ("src_index", src_index), ("src_valid", src_valid), ("is_gen", is_gen),
                                ("is_other", is_other), ("is_ctx", is_ctx), ("is_hist", is_hist)):
                put(name, array, at)
            spans[layer] = {"at": at, "L": L, "lo": los, "hi": his}
        return np.concatenate(parts), spans

    def _raw(self, r: int, it: FetchItem, spans: dict, gathered: dict, probs_of: dict) -> RawCapture:
        n = it.n_tokens
        layers = {}
        for layer, g in gathered.items():
            n_keys = spans[layer]["hi"][r] - spans[layer]["lo"][r] + 1
            entry = {"q": g["q"][r, :n].float().cpu().numpy(), "keys": g["keys"][r, :n_keys].float().cpu().numpy(),
                     "key_lo": int(spans[layer]["lo"][r]), "probs": probs_of[layer][r, :n, :, :n_keys].cpu().numpy()}
            if self.capture_output:
                entry["values"] = g["values"][r, :n_keys].float().cpu().numpy()
                entry["out"] = g["out"][r, :n].float().cpu().numpy()
            layers[layer] = entry
        qpos = np.arange(it.n_prompt - 1, it.n_prompt - 1 + n)
        return RawCapture(query_positions=qpos, layers=layers)

    # ---- per request (the reference) ----

    def fetch_one(self, it: FetchItem, method: str = "batched") -> tuple[FetchedRows, FetchTimings]:
        """One request, layer by layer, through `rebuild_rows` / `split_rows` (the reference)."""
        device = self.view.device()
        blocks = self.view.take_blocks(it.request_id)
        sync(device)
        t0 = time.perf_counter()
        qpos = torch.arange(it.n_prompt - 1, it.n_prompt - 1 + it.n_tokens, device=device)
        fetched = {}
        for layer, plan in self.plans.items():
            src = self.view.layers[layer]
            kb = kernel_block_ids(blocks[src.group], src.blocks_per_kv_block)
            lo, hi = key_span(qpos.tolist(), plan.sliding_window)
            kpos = torch.arange(lo, hi + 1, device=device)
            kslots = slots_for_positions(kb, src.block_size, kpos)
            qslots = slots_for_positions(kb, src.block_size, qpos)
            item = {"q": src.cache.read(qslots), "keys": gather_kv(src.kv_cache, kslots, 0), "kpos": kpos, "lo": lo}
            if self.capture_output:
                item["values"] = gather_kv(src.kv_cache, kslots, 1)
                item["out"] = src.cache.read_out(qslots)
            fetched[layer] = item
        sync(device)
        t1 = time.perf_counter()
        splits, probs_of = {}, {}
        for layer, plan in self.plans.items():
            f = fetched[layer]
            probs = rebuild_rows(plan, f["q"], qpos, f["keys"], f["kpos"], method=method)
            probs_of[layer] = probs
            splits[layer] = split_rows(probs, f["lo"], list(it.source_positions), it.generated_start)
        rows = torch.stack([splits[l].rows[:, i] for l, i in self.order], dim=1)
        other = torch.stack([splits[l].other_prompt[:, i] for l, i in self.order], dim=1)
        gen = torch.stack([splits[l].generated[:, i] for l, i in self.order], dim=1)
        rows, other, gen = (t.cpu().numpy().astype(np.float32) for t in (rows, other, gen))
        blocks_mass = self._block_masses(probs_of, fetched, it)
        t2 = time.perf_counter()
        raw = None
        if self.keep_raw:
            layers = {}
            for layer, f in fetched.items():
                entry = {"q": f["q"].float().cpu().numpy(), "keys": f["keys"].float().cpu().numpy(),
                         "key_lo": int(f["lo"]), "probs": probs_of[layer].cpu().numpy()}
                if self.capture_output:
                    entry["values"] = f["values"].float().cpu().numpy()
                    entry["out"] = f["out"].float().cpu().numpy()
                layers[layer] = entry
            raw = RawCapture(query_positions=qpos.cpu().numpy(), layers=layers)
        return (FetchedRows(rows, other, gen, raw, blocks_mass["context"], blocks_mass["history"]),
                FetchTimings((t1 - t0) * 1e3, (t2 - t1) * 1e3))

    def _block_masses(self, probs_of: dict, fetched: dict, it: FetchItem) -> dict:
        """[T, H] mass on the context block and the history turns, in head order (None: no block)."""
        out = {}
        for name, positions in (("context", it.context_positions), ("history", it.history_positions)):
            if not positions:
                out[name] = None
                continue
            per_layer = {}
            for layer, probs in probs_of.items():
                rel = [p - fetched[layer]["lo"] for p in positions if 0 <= p - fetched[layer]["lo"] < probs.shape[-1]]
                idx = torch.tensor(rel, dtype=torch.long, device=probs.device)
                per_layer[layer] = probs.index_select(-1, idx).sum(-1)
            out[name] = torch.stack([per_layer[l][:, i] for l, i in self.order], dim=1).cpu().numpy().astype(np.float32)
        return out


def _batched_rows(plan: LayerPlan, q: torch.Tensor, qpos: torch.Tensor, keys: torch.Tensor,
                  kpos: torch.Tensor) -> torch.Tensor:
    """fp32 softmax rows [R, T, heads, L] of a padded batch; the masks of `attention_row`
    (causal, sliding window, empty key slots at -1), per request."""
    kv = torch.as_tensor(plan.kv_heads, dtype=torch.long, device=keys.device)
    k_sel = keys.index_select(2, kv).permute(0, 2, 1, 3).float()  # [R, heads, L, D]
    scores = torch.einsum("rthd,rhld->rthl", q.float(), k_sel) * plan.scaling
    if plan.softcap:
        scores = torch.tanh(scores / plan.softcap) * plan.softcap
    qp = qpos[:, :, None, None]
    kp = kpos[:, None, None, :]
    visible = (kp >= 0) & (kp <= qp)
    if plan.sliding_window is not None:
        visible = visible & (kp > qp - plan.sliding_window)
    return torch.softmax(scores.masked_fill(~visible, -math.inf), dim=-1)
