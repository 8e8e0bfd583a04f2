"""The engine side of `vllm_capture`: a custom op in vLLM's attention and three runner hooks.

One capturing engine per process. `arm()` is called before the engine starts; then vLLM's own
`GPUModelRunner` calls, through class-level wrappers:
- `load_model` -> (synthetic weights) rewrite them like transformers, then swap each selected
  layer's `Attention` for a subclass whose forward first calls `alignatt::qcache_write` on the
  post-RoPE query (and checks every layer fact against the layout);
- `initialize_kv_cache` -> allocate one `QueryCache` per selected layer, before any CUDA graph is
  captured, so graph replays write into buffers that never move;
- `_update_states` -> remember each request's block ids, to read its rows after it finishes.
The op writes the selected heads at the step's `slot_mapping` entry of the layer (a KV-shared
layer uses its donor's), the same index the KV-cache write uses; pad rows (slot -1) go to a dump
row. Under replay no Python runs, and nothing here needs it to.
"""

import time
from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from alignatt.capture.attention import sync
from alignatt.capture.names import PINNED_VLLM  # noqa: F401 - engine.py reads it from here
from alignatt.capture.vllm.qcache import LayerPlan, QueryCache
from alignatt.models.synthetic_init import HFLikeInit, hf_like_init


def log(message: str) -> None:
    print(f"[alignatt.capture.vllm.seam] {message}", flush=True)


@dataclass
class Hooks:
    plans: dict[int, LayerPlan]
    capture_output: bool
    runner: Any = None
    keep_alive: bool = False  # add the op's zero to q so torch.compile cannot drop the op
    attn: dict[int, Any] = field(default_factory=dict)  # layer -> vLLM Attention module
    layer_names: dict[int, str] = field(default_factory=dict)
    donor_names: dict[int, str] = field(default_factory=dict)
    group: dict[int, int] = field(default_factory=dict)  # layer -> KV cache group id
    caches: dict[int, QueryCache] = field(default_factory=dict)
    block_ids: dict[str, Any] = field(default_factory=dict)  # internal request id -> block ids
    op_calls: int = 0  # Python-side calls of the op (eager steps and capture, never replays)


_HOOKS: Optional[Hooks] = None
# Synthetic weights: (init, pad token id) to apply once the next engine has loaded its model;
# the summary of what was applied lands in _INIT_REPORT.
_PENDING_INIT: Optional[tuple[HFLikeInit, Optional[int]]] = None
_INIT_REPORT: Optional[dict] = None
_LIB: Any = None
_forward_context: Any = None  # vllm.forward_context, bound once the op is registered


def _step_slots(hooks: Hooks, layer: int) -> Optional[torch.Tensor]:
    if _forward_context is None or not _forward_context.is_forward_context_available():
        return None
    mapping = _forward_context.get_forward_context().slot_mapping
    if not mapping:
        return None  # profiling run before the KV cache exists
    if isinstance(mapping, list):
        raise RuntimeError("alignatt q capture does not support micro-batching (DBO / ubatch slot mappings)")
    slots = mapping.get(hooks.layer_names[layer])
    if slots is None:
        slots = mapping.get(hooks.donor_names[layer])
    return slots


def _qcache_write(x: torch.Tensor, layer: int, kind: int) -> torch.Tensor:
    """The custom op: write the selected heads of `x` (kind 0: query, 1: attention output) into
    the layer's query cache by the step's slot mapping. Returns a zero the caller may add."""
    hooks = _HOOKS
    if hooks is not None:
        hooks.op_calls += 1
        cache = hooks.caches.get(layer)
        if cache is None:
            if torch.cuda.is_current_stream_capturing():
                raise RuntimeError(
                    f"alignatt: query cache of layer {layer} is not allocated but a CUDA graph is "
                    "being captured: the capture would bake in a missing buffer"
                )
        else:
            slots = _step_slots(hooks, layer)
            if slots is not None:
                if kind == 0:
                    cache.write(x, slots)
                else:
                    cache.write_out(x, slots)
    return torch.zeros((), dtype=x.dtype, device=x.device)


def _qcache_write_fake(x: torch.Tensor, layer: int, kind: int) -> torch.Tensor:
    return torch.zeros((), dtype=x.dtype, device=x.device)


def _register_op() -> None:
    global _LIB, _forward_context
    if _LIB is not None:
        return
    import vllm.forward_context
    from torch.library import Library
    from vllm.utils.torch_utils import direct_register_custom_op

    lib = Library("alignatt", "FRAGMENT")
    direct_register_custom_op(
        op_name="qcache_write",
        op_func=_qcache_write,
        mutates_args=[],
        fake_impl=_qcache_write_fake,
        target_lib=lib,
    )
    _LIB = lib  # the op lives as long as this library object
    _forward_context = vllm.forward_context


_CAPTURING: dict[type, type] = {}


def _capturing_class(base: type) -> type:
    """A subclass of vLLM's Attention whose forward captures q (and optionally the output)."""
    if base not in _CAPTURING:

        class CapturingAttention(base):  # type: ignore[misc, valid-type]
            def forward(self, query, key, value, output_shape=None):  # noqa: ANN001, ANN201
                layer = self._alignatt_layer
                dep = torch.ops.alignatt.qcache_write(query, layer, 0)
                if self._alignatt_keep_alive:
                    query = query + dep
                out = super().forward(query, key, value, output_shape)
                if self._alignatt_capture_output:
                    dep_out = torch.ops.alignatt.qcache_write(out, layer, 1)
                    if self._alignatt_keep_alive:
                        out = out + dep_out
                return out

        CapturingAttention.__name__ = CapturingAttention.__qualname__ = f"Capturing{base.__name__}"
        _CAPTURING[base] = CapturingAttention
    return _CAPTURING[base]


def _attach(runner: Any, hooks: Hooks) -> None:
    """After the model is loaded, before any forward: swap in the capturing attention."""
    from vllm.config import CompilationMode
    from vllm.model_executor.models.gemma3 import Gemma3Attention
    from vllm.model_executor.models.gemma4 import Gemma4Attention
    from vllm.model_executor.models.utils import extract_layer_index

    if runner.cache_config.kv_sharing_fast_prefill:
        raise RuntimeError("alignatt: kv_sharing_fast_prefill skips KV-shared layers in prefill; disable it")
    if runner.parallel_config.tensor_parallel_size != 1:
        raise RuntimeError("alignatt: q capture supports tensor_parallel_size=1 only")
    model = runner.get_model()
    found: dict[int, Any] = {}
    for _, module in model.named_modules():
        if isinstance(module, (Gemma4Attention, Gemma3Attention)):  # both hold their layer's `attn`
            found[extract_layer_index(module.attn.layer_name)] = module
    missing = sorted(set(hooks.plans) - set(found))
    if missing:
        raise RuntimeError(
            f"alignatt: no Gemma-4 or Gemma-3 attention for layers {missing} in {type(model).__name__} "
            f"(found layers {sorted(found)})"
        )
    hooks.keep_alive = runner.compilation_config.mode != CompilationMode.NONE
    for layer, plan in hooks.plans.items():
        attn = found[layer].attn
        donor = attn.kv_sharing_target_layer_name
        donor_layer = layer if donor is None else extract_layer_index(donor)
        facts = {
            "num_heads": (attn.num_heads, plan.n_heads),
            "num_kv_heads": (attn.num_kv_heads, plan.n_kv_heads),
            "head_size": (attn.head_size, plan.head_dim),
            "sliding_window": (attn.sliding_window, plan.sliding_window),
            "scale": (float(attn.impl.scale), plan.scaling),
            "softcap": (getattr(attn.impl, "logits_soft_cap", None) or None, plan.softcap),
            "kv donor layer": (donor_layer, plan.kv_source_layer),
        }
        wrong = {k: v for k, v in facts.items() if v[0] != v[1]}
        if wrong:
            raise RuntimeError(
                f"alignatt: layer {layer} in vLLM differs from the layout (vLLM, layout): {wrong}"
            )
        attn.__class__ = _capturing_class(type(attn))
        attn._alignatt_layer = layer
        attn._alignatt_keep_alive = hooks.keep_alive
        attn._alignatt_capture_output = hooks.capture_output
        hooks.attn[layer] = attn
        hooks.layer_names[layer] = attn.layer_name
        hooks.donor_names[layer] = donor or attn.layer_name
        log(f"layer {layer}: {attn.layer_name} heads {list(plan.heads)} (kv {list(plan.kv_heads)}) "
            f"dim {plan.head_dim} window {plan.sliding_window} kv from {hooks.donor_names[layer]} "
            f"backend {attn.attn_backend.get_name()}")
    hooks.runner = runner
    log(f"compilation mode {runner.compilation_config.mode!s}, cudagraph mode "
        f"{runner.compilation_config.cudagraph_mode!s}, keep-alive add {hooks.keep_alive}")


def _allocate(runner: Any, hooks: Hooks) -> None:
    """Right after vLLM binds its KV cache (and before it captures graphs): one query cache per
    layer, one row per KV slot of that layer's cache."""
    if torch.cuda.is_current_stream_capturing():
        raise RuntimeError("alignatt: query caches must be allocated outside CUDA graph capture")
    groups = runner.kv_cache_config.kv_cache_groups
    dtype = runner.model_config.dtype
    hooks.caches = {}  # a re-initialised KV cache (profiling) gets fresh buffers
    total = 0
    for layer, plan in hooks.plans.items():
        attn = hooks.attn[layer]
        kv = attn.kv_cache
        if not isinstance(kv, torch.Tensor) or kv.dim() != 5 or kv.shape[1] != 2:
            raise RuntimeError(
                f"alignatt: layer {layer} KV cache has shape {getattr(kv, 'shape', type(kv))}, expected "
                "[num_blocks, 2, block_size, num_kv_heads, head_size] (TRITON_ATTN)"
            )
        if kv.shape[3] != plan.n_kv_heads or kv.shape[4] != plan.head_dim:
            raise RuntimeError(f"alignatt: layer {layer} KV cache {tuple(kv.shape)} does not match "
                               f"{plan.n_kv_heads} KV heads of dim {plan.head_dim}")
        gid = [g for g, grp in enumerate(groups)
               if hooks.layer_names[layer] in grp.layer_names or hooks.donor_names[layer] in grp.layer_names]
        if not gid:
            raise RuntimeError(f"alignatt: layer {layer} ({hooks.layer_names[layer]}) is in no KV cache group")
        hooks.group[layer] = gid[0]
        table = runner.input_batch.block_table[gid[0]]
        if table.block_size != kv.shape[2]:
            raise RuntimeError(f"alignatt: layer {layer} block table uses {table.block_size}-token blocks, "
                               f"its KV cache {kv.shape[2]}")
        n_slots = kv.shape[0] * kv.shape[2]
        cache = QueryCache(n_slots, len(plan.heads), plan.head_dim, dtype, kv.device, plan.heads,
                           out_dim=plan.head_dim if hooks.capture_output else None)
        hooks.caches[layer] = cache
        total += cache.nbytes()
        log(f"layer {layer}: KV cache {tuple(kv.shape)} {kv.dtype} group {gid[0]} "
            f"(block {table.block_size}, {table.blocks_per_kv_block} per manager block) -> "
            f"query cache {tuple(cache.q.shape)}")
    log(f"query caches: {total / 2**20:.1f} MiB for {len(hooks.caches)} layers")


def _apply_synthetic_init(runner: Any) -> None:
    """Right after the dummy load, before the KV cache exists and before any graph is captured:
    rewrite the weights like a fresh transformers Gemma-4 (in place: same tensors)."""
    global _PENDING_INIT, _INIT_REPORT
    init, pad = _PENDING_INIT
    _PENDING_INIT = None
    if torch.cuda.is_current_stream_capturing():
        raise RuntimeError("alignatt: synthetic weights must be written before CUDA graph capture")
    started = time.perf_counter()
    report = hf_like_init(runner.get_model(), init, pad_token_id=pad, strict=False)
    sync(next(runner.get_model().parameters()).device)
    report["seconds"] = round(time.perf_counter() - started, 2)
    _INIT_REPORT = report
    log(f"synthetic weights re-initialised {init.describe()}: {report['tensors']} tensors, "
        f"{report['elements'] / 1e9:.2f} G elements, padding rows zeroed in {report['pad_rows_zeroed']} "
        f"({report['seconds']} s)")
    if report["unknown"]:
        log(f"WARNING: no init rule for {len(report['unknown'])} state-dict entries; they keep the dummy "
            f"loader's values: {report['unknown'][:20]}")


def _install_runner_hooks() -> None:
    """Wrap three GPUModelRunner methods (class level, idempotent); they act only for the runner
    that `_HOOKS` is attached to (and, for synthetic weights, the first runner to load a model)."""
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner as Runner

    if getattr(Runner, "_alignatt_hooked", False):
        return
    for name in ("load_model", "initialize_kv_cache", "_update_states"):
        if not callable(getattr(Runner, name, None)):
            raise RuntimeError(f"alignatt: vLLM's GPUModelRunner has no {name}(); expected vLLM {PINNED_VLLM}")
    load_model, init_kv, update_states = Runner.load_model, Runner.initialize_kv_cache, Runner._update_states

    def hooked_load_model(self, *args, **kwargs):  # noqa: ANN001, ANN202
        load_model(self, *args, **kwargs)
        if _PENDING_INIT is not None:
            _apply_synthetic_init(self)
        if _HOOKS is not None and _HOOKS.runner is None:
            _attach(self, _HOOKS)

    def hooked_initialize_kv_cache(self, *args, **kwargs):  # noqa: ANN001, ANN202
        init_kv(self, *args, **kwargs)
        if _HOOKS is not None and _HOOKS.runner is self:
            _allocate(self, _HOOKS)

    def hooked_update_states(self, scheduler_output):  # noqa: ANN001, ANN202
        result = update_states(self, scheduler_output)
        hooks = _HOOKS
        if hooks is not None and hooks.runner is self:
            for req_id, state in self.requests.items():
                hooks.block_ids[req_id] = state.block_ids  # lists grow in place; replaced on preemption
        return result

    Runner.load_model = hooked_load_model
    Runner.initialize_kv_cache = hooked_initialize_kv_cache
    Runner._update_states = hooked_update_states
    Runner._alignatt_hooked = True


# ---- what the seam calls ----


def arm(plans: Optional[dict[int, LayerPlan]], capture_output: bool = False,
        synthetic_init: Optional[HFLikeInit] = None, pad_token_id: Optional[int] = None) -> None:
    """Prepare the next engine this process starts: capture on `plans` (None: no capture) and/or
    re-initialise its synthetic weights."""
    global _HOOKS, _PENDING_INIT, _INIT_REPORT
    if plans is None and synthetic_init is None:
        return
    _install_runner_hooks()
    _INIT_REPORT = None
    _PENDING_INIT = (synthetic_init, pad_token_id) if synthetic_init is not None else None
    if plans is not None:
        _register_op()
        _HOOKS = Hooks(plans=plans, capture_output=capture_output)


def disarm() -> None:
    """The engine is gone (or never started): the hooks act for no runner."""
    global _HOOKS, _PENDING_INIT
    _HOOKS = _PENDING_INIT = None


def active() -> Optional[Hooks]:
    return _HOOKS


def init_report() -> Optional[dict]:
    """What the synthetic-weights rewrite did (None: it did not run)."""
    return _INIT_REPORT
