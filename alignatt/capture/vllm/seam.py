"""`vllm_capture`: alignment-head rows from vLLM's own q and KV cache, correct under CUDA graphs.

How (see docs/cudagraph-capture.md for why):
- Before the engine captures any graph, the `Attention` module of every selected layer gets a
  subclass whose forward first calls a registered custom op, `alignatt::qcache_write`, on the
  post-RoPE query. The op writes the selected heads into a `QueryCache` (alignatt.capture.vllm.qcache) at the
  step's `slot_mapping` entry of that layer (a KV-shared layer uses its donor's entry), i.e. at
  the same index the KV-cache write uses; pad rows carry slot -1 and go to a dump row. The
  buffers are allocated right after vLLM allocates its KV cache, before capture, and never move.
  That engine side lives in `alignatt.capture.vllm.hooks`; this module is the seam that drives it.
- After a request finishes, its drafted tokens' q rows are read by the request's block table,
  its keys are read from the KV cache (a KV-shared layer reads its donor's cache) and the rows are
  rebuilt with fp32 softmax over every visible position (sliding window on sliding layers).

Modes: `eager` (enforce_eager), `cudagraph` (full decode CUDA graphs, no torch.compile: the
bit-exact scored mode) and `compiled` (vLLM's default torch.compile + graphs). Everything
vLLM-specific is imported lazily: this module imports on a CPU machine without vLLM.

Synthetic weights (`gemma4-e4b-synthetic`): vLLM's dummy loader makes Gemma-4's activations
vanish with depth, so right after the model loads (before the KV cache and any graph) the
weights are rewritten in place the way transformers initialises a fresh Gemma-4
(alignatt.models.synthetic_init); `describe()` records it.

Pinned against vLLM 0.22.1 (V1 GPU model runner, in-process engine, TRITON_ATTN KV layout
[num_blocks, 2, block_size, num_kv_heads, head_size]); every internal it touches is checked at
engine start and a mismatch raises naming what differed.
"""

import gc
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np
import torch

from alignatt.core.draft import Draft, DraftRequest, Head, Timings, TokenCapture, sync
from alignatt.core.errors import AlignattError
from alignatt.core.layout import AttentionLayout
from alignatt.capture.vllm import hooks as vllm_hooks
from alignatt.capture.vllm.qcache import (
    gather_kv,
    head_order,
    kernel_block_ids,
    key_span,
    plan_capture,
    rebuild_rows,
    slots_for_positions,
    split_rows,
)
from alignatt.models.synthetic_init import HFLikeInit
from alignatt.capture.vllm.hooks import PINNED_VLLM, log

VLLM_MODES = ("eager", "cudagraph", "compiled")
SUPPORTED_MODELS = ("gemma4-e4b", "gemma4-e4b-synthetic")  # or a local Gemma-4 checkpoint directory


def engine_options(mode: str) -> dict:
    """The LLM(...) arguments that select a capture mode."""
    if mode == "eager":
        return {"enforce_eager": True}
    if mode == "cudagraph":
        # Full CUDA graphs for decode batches, no torch.compile: numerics identical to eager.
        return {"enforce_eager": False,
                "compilation_config": {"mode": 0, "cudagraph_mode": "FULL_DECODE_ONLY"}}
    if mode == "compiled":
        return {"enforce_eager": False}  # vLLM's default: torch.compile + CUDA graphs
    raise AlignattError(f"unknown vllm_mode {mode!r}: use one of {', '.join(VLLM_MODES)}")


# ---- model resolution ----


@dataclass
class _ModelSpec:
    name: str
    engine_model: str  # what LLM(model=...) gets
    load_format: str
    synthetic: bool
    config_dir: str  # a directory with the HF config.json
    tmp_dir: Optional[str] = None


def _resolve_model(model: str) -> _ModelSpec:
    from alignatt.models.presets import MODEL_PRESETS, e4b_config_path

    if model == "gemma4-e4b-synthetic":
        # A directory holding only the text config: vLLM builds the architecture, dummy weights.
        tmp = tempfile.mkdtemp(prefix="alignatt-e4b-synthetic-")
        shutil.copy(e4b_config_path(), Path(tmp) / "config.json")
        return _ModelSpec(model, tmp, "dummy", True, tmp, tmp)
    if model == "gemma4-e4b":
        model_id = MODEL_PRESETS[model].model_id
        try:
            from huggingface_hub import snapshot_download

            local = snapshot_download(model_id, local_files_only=True)
        except Exception as e:  # noqa: BLE001 - any failure means "not cached here"
            raise AlignattError(
                f"model {model_id} is not in the local HF cache (alignatt never downloads): {e}"
            ) from None
        return _ModelSpec(model, local, "auto", False, local)
    if Path(model).is_dir():
        if not (Path(model) / "config.json").exists():
            raise AlignattError(f"{model} has no config.json")
        return _ModelSpec(model, str(Path(model).resolve()), "auto", False, str(Path(model).resolve()))
    if model in MODEL_PRESETS:
        raise AlignattError(
            f"vllm_capture runs Gemma-4 only ({', '.join(SUPPORTED_MODELS)} or a local Gemma-4 "
            f"checkpoint directory), not {model!r}"
        )
    raise AlignattError(f"unknown model {model!r}: use {', '.join(SUPPORTED_MODELS)} or a local directory")


def _load_tokenizer(spec: _ModelSpec, tokenizer: Any) -> Any:
    if tokenizer is not None and not isinstance(tokenizer, str):
        return tokenizer
    if tokenizer == "tiny":  # byte-level test tokenizer: valid ids for any Gemma vocabulary
        from alignatt.models.presets import tiny_tokenizer

        return tiny_tokenizer()
    if spec.synthetic:
        from alignatt.models.presets import synthetic_tokenizer

        return synthetic_tokenizer()
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(tokenizer or spec.engine_model, local_files_only=True)
    except (OSError, ValueError) as e:
        raise AlignattError(f"no tokenizer for {spec.name}: {str(e).splitlines()[0]}") from None


# ---- the seam ----


@dataclass
class RawCapture:
    """What one draft fetched, kept when `keep_raw=True` (for the GPU checks)."""

    query_positions: np.ndarray  # [n]
    layers: dict[int, dict[str, np.ndarray]]  # per layer: q [n,h,D], keys [L,kvh,D], key_lo, probs, ...


class VllmCaptureSeam:
    """Greedy drafts from an in-process vLLM engine with slot-addressed q capture."""

    name = "vllm_capture"

    def __init__(
        self,
        model: str,
        heads: list[Head],
        vllm_mode: str = "cudagraph",
        dtype: Optional[str] = "bfloat16",
        max_model_len: int = 4096,
        *,
        device: str = "cuda",
        kv_cache_memory_gib: float = 4.0,
        max_num_seqs: int = 16,
        enable_prefix_caching: bool = False,
        fixed_length: bool = False,
        capture: bool = True,
        capture_output: bool = False,
        reconstruct: str = "batched",
        keep_raw: bool = False,
        tokenizer: Any = None,
        seed: int = 0,
        **engine_kwargs: Any,
    ) -> None:
        engine_options(vllm_mode)  # validates the mode
        if not str(device).startswith("cuda"):
            raise AlignattError(f"vllm_capture runs on CUDA only, not {device!r}")
        if not torch.cuda.is_available():
            raise AlignattError("vllm_capture needs CUDA and vLLM 0.22.1: CUDA is not available here")
        try:
            import vllm
        except ImportError as e:
            raise AlignattError(f"vllm_capture needs vLLM {PINNED_VLLM}: pip install 'alignatt[vllm]' ({e})") from None
        if vllm.__version__ != PINNED_VLLM and not os.environ.get("ALIGNATT_VLLM_ANY_VERSION"):
            raise AlignattError(
                f"vllm_capture is written against vLLM {PINNED_VLLM}'s internals, found {vllm.__version__} "
                "(set ALIGNATT_VLLM_ANY_VERSION=1 to try anyway)"
            )
        running = vllm_hooks.active()
        if running is not None and running.runner is not None:
            raise AlignattError("one vllm_capture engine per process: close() the other one first")
        if reconstruct not in ("batched", "reference"):
            raise AlignattError(f"reconstruct must be 'batched' or 'reference', not {reconstruct!r}")

        from transformers import AutoConfig

        self.vllm_mode = vllm_mode
        self.dtype = dtype or "bfloat16"
        self.max_model_len = max_model_len
        self.fixed_length = fixed_length
        self.capture = capture
        self.capture_output = capture_output
        self.reconstruct = reconstruct
        self.keep_raw = keep_raw
        self.kv_cache_memory_gib = kv_cache_memory_gib
        self.raw: dict[str, RawCapture] = {}
        self.spec = _resolve_model(model)
        self.synthetic_weights = self.spec.synthetic
        self.tokenizer = _load_tokenizer(self.spec, tokenizer)
        hf_config = AutoConfig.from_pretrained(self.spec.config_dir, local_files_only=True)
        self.layout = AttentionLayout.from_config(hf_config)
        if self.layout.family != "gemma4_text":
            raise AlignattError(f"vllm_capture runs Gemma-4 only; {model} is {self.layout.family}")
        self.heads = self.layout.validate_heads(heads)
        self.plans = plan_capture(self.layout, self.heads)
        self.order = head_order(self.plans, self.heads)
        text_config = hf_config.get_text_config()
        from alignatt.models.presets import eos_and_turn_ids

        self.stop_ids = set(eos_and_turn_ids([text_config], self.tokenizer))
        # Synthetic weights: the dummy loader's are degenerate for Gemma-4 (see synthetic_init).
        self.synthetic_init = (
            HFLikeInit(std=float(getattr(text_config, "initializer_range", None) or 0.02), seed=seed)
            if self.spec.synthetic else None
        )
        self.synthetic_init_report: Optional[dict] = None
        self._newline_ids = {i for t, i in self.tokenizer.get_vocab().items() if "\n" in t or "Ċ" in t}

        # In-process engine on the V1 runner: the hooks below wrap that runner's methods.
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "0"
        os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        if capture and vllm_mode == "compiled":
            # The compile cache keys on source files, not on which layers are patched: a cached
            # graph from another head set would call the op on the wrong layers.
            os.environ["VLLM_DISABLE_COMPILE_CACHE"] = "1"
        vllm_hooks.arm(self.plans if capture else None, capture_output, self.synthetic_init,
                       getattr(text_config, "pad_token_id", None))
        from vllm import LLM

        started = time.perf_counter()
        log(f"starting vLLM {vllm.__version__} ({vllm_mode}) on {self.spec.engine_model} "
            f"[{self.spec.load_format} weights], heads {[(h.layer, h.head) for h in self.heads]}")
        try:
            self.llm = LLM(
                model=self.spec.engine_model,
                skip_tokenizer_init=True,
                load_format=self.spec.load_format,
                dtype=self.dtype,
                max_model_len=max_model_len,
                max_num_seqs=max_num_seqs,
                enable_prefix_caching=enable_prefix_caching,
                kv_cache_memory_bytes=int(kv_cache_memory_gib * 2**30),
                tensor_parallel_size=1,
                seed=seed,
                disable_log_stats=True,
                **engine_options(vllm_mode),
                **engine_kwargs,
            )
        except Exception:
            vllm_hooks.disarm()
            raise
        self.engine_start_s = time.perf_counter() - started
        if self.synthetic_init:
            if vllm_hooks.init_report() is None:
                raise RuntimeError("alignatt: the engine never loaded its model through the hooked "
                                   "GPUModelRunner.load_model, so the synthetic weights were not re-initialised")
            self.synthetic_init_report = vllm_hooks.init_report()
        if capture:
            self._check_attached()
        log(f"engine ready in {self.engine_start_s:.1f} s")
        self._counter = 0

    def _check_attached(self) -> None:
        hooks = vllm_hooks.active()
        if hooks is None or hooks.runner is None:
            raise RuntimeError("alignatt: the engine never loaded its model through the hooked "
                               "GPUModelRunner (V2 runner or multiprocessing engine?)")
        if set(hooks.caches) != set(self.plans):
            raise RuntimeError(f"alignatt: query caches for layers {sorted(hooks.caches)}, "
                               f"expected {sorted(self.plans)}: initialize_kv_cache was not seen")
        try:
            runner = self.llm.llm_engine.model_executor.driver_worker.worker.model_runner
        except AttributeError:
            runner = None
        log(f"runner at llm.llm_engine.model_executor.driver_worker.worker.model_runner: "
            f"{'hooked' if runner is hooks.runner else 'NOT the hooked one' if runner else 'path absent'}")
        self.hooks = hooks

    # ---- drafting ----

    def draft(self, request: DraftRequest) -> Draft:
        return self.draft_many([request])[0]

    def draft_many(self, requests: Sequence[DraftRequest]) -> list[Draft]:
        """Draft several requests in one engine batch; each gets its own rows."""
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        from alignatt.core.prompt import build_prompt

        prompts = [build_prompt(self.tokenizer, r) for r in requests]
        for r, p in zip(requests, prompts):
            if len(p.input_ids) + r.max_new_tokens > self.max_model_len:
                raise AlignattError(f"prompt of {len(p.input_ids)} tokens + {r.max_new_tokens} new tokens "
                                    f"exceeds max_model_len={self.max_model_len}")
        engine = self.llm.llm_engine
        if engine.has_unfinished_requests():
            raise RuntimeError("alignatt: the engine still has unfinished requests")
        states: dict[str, dict] = {}
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for r, p in zip(requests, prompts):
            self._counter += 1
            ext = f"alignatt-{self._counter}"
            fixed = self.fixed_length
            params = SamplingParams(
                temperature=0.0,
                max_tokens=r.max_new_tokens,
                min_tokens=r.max_new_tokens if fixed else 0,
                ignore_eos=fixed,
                stop_token_ids=None if fixed else sorted(
                    self.stop_ids | (self._newline_ids if p.stop_at_newline else set())),
                detokenize=False,
                output_kind=RequestOutputKind.DELTA,
            )
            internal = engine.add_request(ext, self._engine_prompt(p.input_ids), params)
            states[ext] = {"internal": internal, "request": r, "prompt": p, "tokens": [], "t0": t0,
                           "t_first": None, "t_end": None, "finish": None, "draft": None}
        while engine.has_unfinished_requests():
            outputs = engine.step()
            now = time.perf_counter()
            for out in outputs:
                st = states.get(out.request_id)
                if st is None:
                    raise RuntimeError(f"alignatt: output for unknown request {out.request_id}")
                st["tokens"].extend(out.outputs[0].token_ids)
                if st["t_first"] is None and st["tokens"]:
                    st["t_first"] = now
                if out.finished:
                    st["t_end"], st["finish"] = now, out.outputs[0].finish_reason
                    # Read this request's rows now: once it is gone its blocks may be reused.
                    st["draft"] = self._finish(st)
        return [states[k]["draft"] for k in states]

    def _engine_prompt(self, ids: list[int]) -> Any:
        prompt = {"prompt_token_ids": list(ids)}
        preprocess = getattr(self.llm, "_preprocess_cmpl_one", None)
        if preprocess is None:
            return prompt
        try:
            return preprocess(prompt, None)
        except Exception as e:  # noqa: BLE001 - the raw token prompt is still accepted (deprecated)
            if not getattr(self, "_warned_preprocess", False):
                log(f"LLM._preprocess_cmpl_one failed ({e!r}); passing the raw token prompt")
                self._warned_preprocess = True
            return prompt

    def _finish(self, st: dict) -> Draft:
        request, prompt = st["request"], st["prompt"]
        tokens = list(st["tokens"])
        stop_reason = "max_new_tokens"
        if not self.fixed_length:
            for i, tok in enumerate(tokens):
                if tok in self.stop_ids or (prompt.stop_at_newline and tok in self._newline_ids):
                    tokens, stop_reason = tokens[:i], "eos"
                    break
        t_first = st["t_first"] if st["t_first"] is not None else st["t_end"]
        # prefill: submission to the first drafted token; decode: the rest (in-forward capture
        # included); end to end, as the engine serves it.
        timings = Timings(prefill_ms=(t_first - st["t0"]) * 1e3, decode_ms=(st["t_end"] - t_first) * 1e3)
        captures: list[TokenCapture] = []
        if tokens:
            captures = self._captures(st["internal"], prompt, tokens, timings)
        elif self.capture:
            self.hooks.block_ids.pop(st["internal"], None)
        return Draft(
            request=request,
            heads=list(self.heads) if self.capture else [],
            prompt_token_count=len(prompt.input_ids),
            source_token_positions=list(prompt.source_token_positions),
            source_word_of_token=list(prompt.source_word_of_token),
            tokens=captures,
            stop_reason=stop_reason,
            timings=timings,
            seam=self.name,
        )

    def _captures(self, internal: str, prompt: Any, tokens: list[int], timings: Timings) -> list[TokenCapture]:
        from alignatt.capture.hf.base import _pieces

        n, n_prompt = len(tokens), len(prompt.input_ids)
        pieces = _pieces(self.tokenizer, tokens)
        n_src = len(prompt.source_token_positions)
        if not self.capture:
            empty = np.zeros((0, n_src), dtype=np.float32)
            z = np.zeros(0, dtype=np.float32)
            return [TokenCapture(t, pieces[i], empty, z, z) for i, t in enumerate(tokens)]

        # Fetch: q rows of the drafted tokens and the keys they saw, through the block table.
        hooks = self.hooks
        device = next(iter(hooks.caches.values())).q.device
        sync(device)
        t0 = time.perf_counter()
        block_ids = hooks.block_ids.pop(internal, None)
        if block_ids is None:
            raise RuntimeError(f"alignatt: no block table was recorded for request {internal}")
        qpos = torch.arange(n_prompt - 1, n_prompt - 1 + n, device=device)
        window = min((p.sliding_window for p in self.plans.values() if p.sliding_window), default=None)
        if window and n_prompt + n > window + 16 and not getattr(self, "_warned_window", False):
            # vLLM frees sliding-window blocks that fall out of the newest token's window; the
            # early drafted tokens' keys then live in freed blocks, which only another running
            # request could overwrite before this read.
            log(f"note: prompt + draft ({n_prompt + n}) exceeds the sliding window ({window}); rows of "
                "early tokens read keys from blocks vLLM already freed (safe unless other requests run)")
            self._warned_window = True
        fetched = {}
        for layer, plan in self.plans.items():
            table = hooks.runner.input_batch.block_table[hooks.group[layer]]
            blocks = kernel_block_ids(block_ids[hooks.group[layer]], table.blocks_per_kv_block)
            lo, hi = key_span(qpos.tolist(), plan.sliding_window)
            kpos = torch.arange(lo, hi + 1, device=device)
            kv = hooks.attn[layer].kv_cache
            kslots = slots_for_positions(blocks, table.block_size, kpos)
            qslots = slots_for_positions(blocks, table.block_size, qpos)
            item = {"q": hooks.caches[layer].read(qslots), "keys": gather_kv(kv, kslots, 0),
                    "kpos": kpos, "lo": lo}
            if self.capture_output:
                item["values"] = gather_kv(kv, kslots, 1)
                item["out"] = hooks.caches[layer].read_out(qslots)
            fetched[layer] = item
        sync(device)
        t1 = time.perf_counter()
        timings.capture_ms = (t1 - t0) * 1e3

        # Reconstruct: fp32 softmax rows, split into source rows and masses, in head order.
        splits = {}
        probs_by_layer = {}
        for layer, plan in self.plans.items():
            f = fetched[layer]
            probs = rebuild_rows(plan, f["q"], qpos, f["keys"], f["kpos"], method=self.reconstruct)
            probs_by_layer[layer] = probs
            splits[layer] = split_rows(probs, f["lo"], prompt.source_token_positions, prompt.prefix_start)
        rows = torch.stack([splits[l].rows[:, i] for l, i in self.order], dim=1)
        other = torch.stack([splits[l].other_prompt[:, i] for l, i in self.order], dim=1)
        gen = torch.stack([splits[l].generated[:, i] for l, i in self.order], dim=1)
        rows, other, gen = (t.cpu().numpy().astype(np.float32) for t in (rows, other, gen))
        blocks = self._block_masses(probs_by_layer, fetched, prompt)
        timings.reconstruct_ms = (time.perf_counter() - t1) * 1e3

        if self.keep_raw:
            layers = {}
            for layer, f in fetched.items():
                entry = {"q": f["q"].float().cpu().numpy(), "keys": f["keys"].float().cpu().numpy(),
                         "key_lo": int(f["lo"]), "probs": probs_by_layer[layer].cpu().numpy()}
                if self.capture_output:
                    entry["values"] = f["values"].float().cpu().numpy()
                    entry["out"] = f["out"].float().cpu().numpy()
                layers[layer] = entry
            self.raw[internal] = RawCapture(query_positions=qpos.cpu().numpy(), layers=layers)
            self.last_raw_id = internal
        return [
            TokenCapture(
                token_id=tok,
                piece=pieces[i],
                rows=np.ascontiguousarray(rows[i]),
                other_prompt_mass=other[i],
                generated_mass=gen[i],
                **{f"{k}_mass": None if v is None else v[i] for k, v in blocks.items()},
            )
            for i, tok in enumerate(tokens)
        ]

    def _block_masses(self, probs_by_layer: dict, fetched: dict, prompt: Any) -> dict:
        """[T, heads] mass on the context block and the history turns, in head order."""
        from alignatt.capture.hf.base import block_masses

        per_layer = {layer: block_masses(probs, prompt, fetched[layer]["lo"])
                     for layer, probs in probs_by_layer.items()}
        out = {}
        for name in ("context", "history"):
            if any(m[name] is None for m in per_layer.values()):
                out[name] = None
                continue
            out[name] = np.stack([per_layer[l][name][:, i] for l, i in self.order], axis=1)
        return out

    def describe(self) -> dict:
        """Facts for artifacts and logs."""
        hooks = getattr(self, "hooks", None)
        return {
            "seam": self.name,
            "vllm_mode": self.vllm_mode,
            "model": self.spec.name,
            "synthetic_weights": self.synthetic_weights,
            "synthetic_init": self.synthetic_init.describe() if self.synthetic_init else None,
            "synthetic_init_tensors": (self.synthetic_init_report or {}).get("tensors"),
            "synthetic_init_unknown": (self.synthetic_init_report or {}).get("unknown"),
            "dtype": self.dtype,
            "kv_cache_memory_gib": self.kv_cache_memory_gib,
            "heads": [[h.layer, h.head] for h in self.heads],
            "capture": self.capture,
            "engine_start_s": round(self.engine_start_s, 2),
            "options": engine_options(self.vllm_mode),
            "query_cache_mib": round(sum(c.nbytes() for c in hooks.caches.values()) / 2**20, 1) if hooks else 0,
            "keep_alive_add": bool(hooks.keep_alive) if hooks else False,
        }

    def close(self) -> None:
        llm = getattr(self, "llm", None)
        if llm is not None:
            core = getattr(llm.llm_engine, "engine_core", None)
            if core is not None and hasattr(core, "shutdown"):
                try:
                    core.shutdown()
                except Exception as e:  # noqa: BLE001 - best effort at teardown
                    log(f"engine shutdown: {e}")
            self.llm = None
        vllm_hooks.disarm()
        if self.spec.tmp_dir:
            shutil.rmtree(self.spec.tmp_dir, ignore_errors=True)
        gc.collect()
        torch.cuda.empty_cache()


def make_seam(model: str, heads: list[Head], device: str = "cuda", dtype: Optional[str] = None,
              vllm_mode: str = "cudagraph", **options: Any) -> VllmCaptureSeam:
    return VllmCaptureSeam(model, heads, vllm_mode=vllm_mode, dtype=dtype, device=device, **options)
