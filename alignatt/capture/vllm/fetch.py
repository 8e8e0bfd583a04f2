"""Fetch + rebuild for `vllm_capture`: every request that finished in a step, read and rebuilt at once.

A finished request's drafted tokens have their q rows in the query caches (slot-addressed, written
by the hooks) and the keys they saw in vLLM's KV cache, both found through the request's block
table. `BatchFetcher.enqueue` does this for all requests of one engine step together
(`alignatt.capture.vllm.batched`: each request packed on the host from its recorded block ids,
the indices built from that on the device, one matmul and one fp32 softmax per head group over the
padded batch; on a GPU one CUDA graph, `graphed.py`) and queues the copy of every
request's rows and masses to pinned host memory. Nothing in it waits on the device: the
`PendingFetch` it returns is read once its own event has passed, which lets vLLM's next step be
queued behind the fetch instead of after a device-wide synchronisation. `fetch` is enqueue and
wait; `fetch_one` is the per-request reference path, kept for tests and `reconstruct="reference"`.

Callers must enqueue before the next engine step: vLLM frees a finished request's blocks when it
reports it finished, and the next step may hand them to a new request (the gathers are queued on
the current stream ahead of that step's forward).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

import numpy as np
import torch

from alignatt.capture.vllm.batched import (
    MASSES,
    GroupConstants,
    BatchShape,
    bucket,
    expand_indices,
    group_heads,
    head_permutation,
    pack_batch,
    power_of_two,
    rebuild_batch,
)
from alignatt.capture.vllm.graphed import GraphedRebuild
from alignatt.capture.vllm.hooks import log
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
from alignatt.capture.attention import sync
from alignatt.core.draft import DraftRequest


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
    finish_reason: Optional[str] = None  # vLLM's, or core.settle.SETTLED: stopped at settle_length
    cached_tokens: Optional[int] = None  # prompt tokens vLLM's prefix cache served (None: not reported)
    proposal: tuple[int, ...] = ()  # the tokens the engine was asked to verify (verify on)
    step_tokens: list[int] = field(default_factory=list)  # new tokens each of its steps delivered
    # Settling (request.settle): the token count of the next check of its rows so far, and the length
    # that holds the policy's answer once a check found its first held token (None: not yet).
    check_at: Optional[int] = None
    settle_length: Optional[int] = None
    checked: Any = None  # (PendingFetch, its index there) of its last check: a settled draft's rows when they cover it
    arrays: Any = None  # `prompt_arrays()`, made at the first fetch

    def prompt_arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Its prompt's source, context and history positions and each source token's word, as int64
        arrays made once: its settle checks fetch and scan it again and again."""
        if self.arrays is None:
            p = self.prompt
            self.arrays = tuple(np.asarray(x, np.int64) for x in (
                p.source_token_positions, p.context_token_positions, p.history_token_positions, p.source_word_of_token))
        return self.arrays


@dataclass(frozen=True)
class FetchItem:
    """What the fetch needs of one finished request."""

    request_id: str  # key into the recorded block ids
    n_prompt: int
    n_tokens: int  # drafted tokens whose rows are wanted (>= 1)
    # Positions: tuples, or the int64 arrays a seam keeps per request (its checks fetch it again and
    # again, and a session's history turns run to hundreds of positions).
    source_positions: Sequence[int]
    generated_start: int  # first key position counted as generated (target prefix + draft)
    # The prompt's context block and history turns (empty: none; their mass is then not reported).
    context_positions: Sequence[int] = ()
    history_positions: Sequence[int] = ()


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

    def first(self, n: int) -> "FetchedRows":
        """The rows of the first n tokens (a settled draft cut where its check read it; no raw)."""
        cut = lambda a: None if a is None else a[:n]  # noqa: E731
        return FetchedRows(self.rows[:n], self.other_prompt[:n], self.generated[:n], None,
                           cut(self.context), cut(self.history))


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

    def peek_blocks(self, request_id: str) -> Any:
        """A running request's block ids, left in place (its rows so far, for a settle check)."""
        blocks = self.block_ids.get(request_id)
        if blocks is None:
            raise RuntimeError(f"alignatt: no block table was recorded for request {request_id}")
        return blocks

    def take_blocks(self, request_id: str) -> Any:
        blocks = self.block_ids.pop(request_id, None)
        if blocks is None:
            raise RuntimeError(f"alignatt: no block table was recorded for request {request_id}")
        return blocks

    def device(self) -> torch.device:
        return next(iter(self.layers.values())).cache.q.device

    def kv_cache_tokens(self) -> dict[int, int]:
        """Per KV-cache group of the captured layers, the tokens its cache holds (blocks x block size):
        every running draft and every cached prefix share them."""
        return {src.group: int(src.kv_cache.shape[0] * src.kv_cache.shape[2]) for src in self.layers.values()}


@dataclass
class FetchTimings:
    # The whole step's. Eager: the host's packing, then the indices built and the gathers (GPU time);
    # graphed (a GPU without raw capture), the gathers and the rebuild are one replay: both fall here.
    capture_ms: float
    reconstruct_ms: float  # eager: matmul, softmax, split; then the copy to the host (GPU time), unpacking


class StageClock:
    """Marks between the stages of a fetch: CUDA events on a GPU (read once the fetch is done,
    so timing it never waits on the device), wall clock on a CPU (where every op is synchronous)."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.marks: list[Any] = []

    def mark(self) -> None:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks.append(event)
        else:
            self.marks.append(time.perf_counter())

    def spans_ms(self) -> list[float]:
        pairs = zip(self.marks, self.marks[1:])
        if self.cuda:
            return [a.elapsed_time(b) for a, b in pairs]
        return [(b - a) * 1e3 for a, b in pairs]


class PendingFetch:
    """A batched fetch queued on the device. `ready()` asks without waiting; `wait()` waits for this
    fetch alone (its own event, not the device) and copies the batch out; `row(r)` unpacks one
    request's rows (a settle check scans the whole batch and unpacks only a settled draft's);
    `result()` is every request's rows and the timings."""

    def __init__(self, items: Sequence[FetchItem], host: torch.Tensor, event: Optional[Any], clock: StageClock,
                 pack_ms: float, raw: Optional[Callable[[int], RawCapture]]) -> None:
        self.items = list(items)
        self._host, self._event, self._clock, self._pack_ms, self._raw = host, event, clock, pack_ms, raw
        self._timings: Optional[FetchTimings] = None
        self.packed: Optional[np.ndarray] = None  # [R, T, H, S + len(MASSES)] once read: the batch as one array

    @property
    def pack_ms(self) -> float:
        """Host time spent building and sending the batch's indices."""
        return self._pack_ms

    def ready(self) -> bool:
        return self._event is None or bool(self._event.query())

    def wait(self) -> np.ndarray:
        """The whole batch on the host, [R, T, H, S + len(MASSES)] (waits for this fetch only)."""
        if self.packed is not None:
            return self.packed
        if self._event is not None:
            self._event.synchronize()
        t0 = time.perf_counter()
        # A copy: the pinned buffer goes back to torch's host allocator, which reuses it.
        self.packed, self._host = self._host.numpy().copy(), None
        gather_ms, rebuild_ms = self._clock.spans_ms()
        self._timings = FetchTimings(self._pack_ms + gather_ms, rebuild_ms + (time.perf_counter() - t0) * 1e3)
        return self.packed

    def timings(self) -> FetchTimings:
        self.wait()
        return self._timings

    def row(self, r: int) -> FetchedRows:
        """Request r's rows and masses, cut to its own tokens and source."""
        packed = self.wait()
        it = self.items[r]
        n, s, S = it.n_tokens, len(it.source_positions), packed.shape[-1] - len(MASSES)
        mass = {name: np.ascontiguousarray(packed[r, :n, :, S + k]) for k, name in enumerate(MASSES)}
        return FetchedRows(np.ascontiguousarray(packed[r, :n, :, :s]), mass["other_prompt"], mass["generated"],
                           self._raw(r) if self._raw else None,
                           mass["context"] if len(it.context_positions) else None,
                           mass["history"] if len(it.history_positions) else None)

    def result(self) -> tuple[list[FetchedRows], FetchTimings]:
        return [self.row(r) for r in range(len(self.items))], self.timings()


class BatchFetcher:
    """Rows of many finished requests from one engine step, with one softmax per head group."""

    def __init__(self, view: EngineView, plans: dict[int, LayerPlan], order: list[tuple[int, int]],
                 capture_output: bool = False, keep_raw: bool = False, padded: Optional[bool] = None) -> None:
        self.view = view
        self.plans = plans
        self.order = order  # (layer, index within that layer's plan) for each head, in head order
        self.capture_output = capture_output
        self.keep_raw = keep_raw
        self.groups = group_heads(plans)
        device = view.device()
        self._consts = [GroupConstants(g, plans, view.layers, device) for g in self.groups]
        self._perm = torch.tensor(head_permutation(self.groups, order), dtype=torch.long, device=device)
        # Batches padded to `bucket` sizes, and on a GPU replayed as CUDA graphs (graphed.py). The
        # raw capture reads the eager path's intermediates: it stays eager and unpadded. `padded`
        # on a CPU is the padding alone (its rows must not change).
        self.padded = (device.type == "cuda" and not keep_raw) if padded is None else padded
        self.graphs = (GraphedRebuild(device, lambda ix, shape: self._rebuild(ix, shape)[0])
                       if self.padded and device.type == "cuda" and not keep_raw else None)
        # A padding request: one token at position 0 of block 0 in every KV-cache group (one visible
        # key, so its row is finite; it is dropped).
        self._pad_item = FetchItem("<pad>", 1, 1, (), 1)
        self._pad_blocks = tuple([0] for _ in range(1 + max(src.group for src in view.layers.values())))

    def _rebuild(self, packed: dict[str, torch.Tensor], shape: BatchShape, between: Callable[[], None] = lambda: None
                 ) -> tuple[torch.Tensor, list, list, dict[str, torch.Tensor]]:
        """Device ops only, from the packed arrays: the batch's [R, T, H, S + 4], each group's gathered q
        and keys and its probs, and the indices built for them."""
        ix = expand_indices(packed, shape, self.plans, self.view.layers, self.groups)
        return (*rebuild_batch(self.groups, self._consts, self.view.layers, ix, shape.S, self._perm, between), ix)

    # ---- batched ----

    def fetch(self, items: Sequence[FetchItem]) -> tuple[list[FetchedRows], FetchTimings]:
        """`enqueue` and wait for it."""
        if not items:
            return [], FetchTimings(0.0, 0.0)
        return self.enqueue(items).result()

    def enqueue(self, items: Sequence[FetchItem], running: bool | Sequence[bool] = False) -> PendingFetch:
        """Queue the fetch of every request in `items` on the current stream; nothing waits.

        Must run before the next engine step (that step may reuse the requests' blocks; being
        queued first, the gathers read them before it writes). The result can be read later.
        `running` (one for all, or per item): the request is still drafting (its rows so far, a
        settle check): its block ids stay."""
        t0 = time.perf_counter()
        device = self.view.device()
        still = [running] * len(items) if isinstance(running, bool) else list(running)
        blocks = [(self.view.peek_blocks if run else self.view.take_blocks)(it.request_id)
                  for it, run in zip(items, still, strict=True)]
        T = max(it.n_tokens for it in items)
        S = max(max(len(it.source_positions) for it in items), 1)
        pad = bucket(len(items)) - len(items) if self.padded else 0
        if self.padded:  # requests and keys (the bulk of the work) in steps of 1.5x, the rest in powers of two
            T, S = power_of_two(T), power_of_two(S, 16)
            packer, spans, shape = pack_batch([*items, *[self._pad_item] * pad], [*blocks, *[self._pad_blocks] * pad],
                                              self.plans, self.view.layers, self.groups, T, S,
                                              keys_to=lambda n: bucket(n, 32), widths=power_of_two)
        else:
            packer, spans, shape = pack_batch(items, blocks, self.plans, self.view.layers, self.groups, T, S)
        host_ix = packer.to_host(pin=device.type == "cuda")
        pack_ms = (time.perf_counter() - t0) * 1e3
        clock = StageClock(device)
        full = ix = gathered = probs = None
        if self.graphs is not None:  # one span for the indices' copy in and the graph (gathers and rebuild)
            try:
                clock.mark()
                full = self.graphs.run(packer, host_ix, shape, (len(items) + pad, T, len(self.order), S + len(MASSES)))
                clock.mark()
            except RuntimeError as error:  # the same rows, eagerly: a server keeps serving
                log(f"the fetch's CUDA graph failed ({str(error).splitlines()[0]}); the fetch runs eagerly from now on")
                self.graphs, clock = None, StageClock(device)
        if full is None:
            packed = packer.views(host_ix.to(device, non_blocking=True))
            clock.mark()
            full, gathered, probs, ix = self._rebuild(packed, shape, clock.mark)  # marked between gathers and rebuild
        full = full[: len(items)]  # padding requests dropped before the copy
        host = torch.empty(full.shape, dtype=full.dtype, pin_memory=device.type == "cuda")
        host.copy_(full, non_blocking=True)
        clock.mark()
        event = None
        if device.type == "cuda":
            event = torch.cuda.Event()
            event.record()
        raw = self._raw_reader(items, spans, ix, gathered, probs) if self.keep_raw else None
        return PendingFetch(items, host, event, clock, pack_ms, raw)

    def _raw_reader(self, items: Sequence[FetchItem], spans: dict, ix: dict, gathered: list,
                    probs: list) -> Callable[[int], RawCapture]:
        """Per request, what `RawCapture` holds (all KV heads of each layer's keys, for the checks)."""
        per_layer = {}
        for g, group in enumerate(self.groups):
            for layer in group.layers:
                src = self.view.layers[layer]
                slots = (ix[f"k_block{layer}"] * src.block_size + ix[f"k_off{layer}"]).reshape(-1)
                R, L = ix[f"k_block{layer}"].shape
                heads = [j for j, (l, _) in enumerate(group.heads) if l == layer]
                entry = {"q": gathered[g][layer][0], "keys": gather_kv(src.kv_cache, slots, 0).view(R, L, -1,
                                                                                                  src.kv_cache.shape[-1]),
                         "probs": probs[g][:, :, heads[0]:heads[-1] + 1]}
                if self.capture_output:
                    entry["values"] = gather_kv(src.kv_cache, slots, 1).view(R, L, -1, src.kv_cache.shape[-1])
                    entry["out"] = src.cache.read_out(ix[f"qslots{layer}"].reshape(-1)).view(
                        R, -1, len(heads), src.cache.out.shape[-1])
                per_layer[layer] = entry

        def read(r: int) -> RawCapture:
            it = items[r]
            n = it.n_tokens
            layers = {}
            for layer, e in per_layer.items():
                n_keys = spans[layer].n_keys[r]
                entry = {"q": e["q"][r, :n].float().cpu().numpy(), "keys": e["keys"][r, :n_keys].float().cpu().numpy(),
                         "key_lo": int(spans[layer].lo[r]), "probs": e["probs"][r, :n, :, :n_keys].cpu().numpy()}
                if self.capture_output:
                    entry["values"] = e["values"][r, :n_keys].float().cpu().numpy()
                    entry["out"] = e["out"][r, :n].float().cpu().numpy()
                layers[layer] = entry
            return RawCapture(query_positions=np.arange(it.n_prompt - 1, it.n_prompt - 1 + n), layers=layers)

        return read

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
            if not len(positions):
                out[name] = None
                continue
            per_layer = {}
            for layer, probs in probs_of.items():
                rel = [p - fetched[layer]["lo"] for p in positions if 0 <= p - fetched[layer]["lo"] < probs.shape[-1]]
                idx = torch.tensor(rel, dtype=torch.long, device=probs.device)
                per_layer[layer] = probs.index_select(-1, idx).sum(-1)
            out[name] = torch.stack([per_layer[l][:, i] for l, i in self.order], dim=1).cpu().numpy().astype(np.float32)
        return out
