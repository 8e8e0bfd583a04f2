"""Random weights for the synthetic Gemma-4 in vLLM, initialised the way transformers does.

vLLM's dummy loader (`initialize_dummy_weights`) fills *every* state-dict entry uniformly in
±1e-3. For Gemma-4 that includes the RMSNorm scales (plain `x * w` norms) and each decoder
layer's `layer_scalar` (which multiplies the hidden state at the end of the layer), so the
activations shrink by ~1e-3 per layer: deep layers attend with exactly-zero outputs, every
logit ties and every greedy draft is `<pad>` (as it does on the H200). A capture test
on such a model proves nothing. transformers initialises a fresh Gemma-4 instead with matrices
and embeddings ~ normal(0, initializer_range), the padding row of each token embedding zero,
norm scales and `layer_scalar` at one; `hf_like_init` rewrites the weights that way, in place
(same tensors, shapes and dtypes: CUDA-graph pointers and timings stay as they were).

The rule is chosen per tensor from its owning module's class name, so the same code runs on
vLLM's modules (`QKVParallelLinear`, `VocabParallelEmbedding`, `RMSNorm`, ...) and on
transformers' (`Linear`, `Gemma4TextScaledWordEmbedding`, `Gemma4RMSNorm`, ...); a state-dict
entry no rule covers raises, naming it, rather than staying at the dummy loader's values.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Optional

import torch

# vLLM registers these per attention layer; for an unquantised KV cache they are 1.0 (vLLM resets
# them after loading; the dummy loader had scrambled them first).
_ATTENTION_SCALES = ("_k_scale", "_v_scale", "_q_scale", "_prob_scale")
# Weights vLLM quantized as it loaded them (quantization="fp8"): drawn in float32 like the others,
# then stored with one scale per tensor (the module's `weight_scale`), as vLLM's online FP8 does.
FP8_DTYPES = tuple(getattr(torch, n) for n in ("float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2") if hasattr(torch, n))


def _is_fp8(tensor: Optional[torch.Tensor]) -> bool:
    return tensor is not None and tensor.dtype in FP8_DTYPES


@dataclass(frozen=True)
class HFLikeInit:
    std: float = 0.02  # the config's initializer_range (transformers' default 0.02)
    seed: int = 0

    def describe(self) -> str:
        return f"hf_like(std={self.std:g}, seed={self.seed})"


def _class_names(module: torch.nn.Module) -> list[str]:
    # The whole MRO: a subclass (e.g. alignatt's capturing Attention) keeps its base's rule.
    return [c.__name__ for c in type(module).__mro__]


def init_rule(module: torch.nn.Module, name: str) -> Optional[str]:
    """How transformers would initialise tensor `name` of `module`: 'normal', 'ones', 'zeros',
    or None when no rule covers it."""
    classes = _class_names(module)
    if name == "layer_scalar":
        return "ones"
    if name in _ATTENTION_SCALES and any("Attention" in c for c in classes):
        return "ones"
    if any(c == "GemmaRMSNorm" for c in classes):  # vLLM's (1 + w) norm: its identity is w = 0
        return "zeros" if name == "weight" else None
    if any("RMSNorm" in c or "LayerNorm" in c for c in classes):
        return {"weight": "ones", "bias": "zeros"}.get(name)
    if any("Embedding" in c or "LMHead" in c for c in classes):
        return "normal" if name == "weight" else None
    if any("Linear" in c for c in classes):
        if name == "weight_scale":  # written with its FP8 weight
            return "scale" if _is_fp8(getattr(module, "weight", None)) else None
        return {"weight": "normal", "bias": "zeros"}.get(name)
    return None


def _is_token_embedding(module: torch.nn.Module) -> bool:
    classes = _class_names(module)
    return any("Embedding" in c for c in classes) and not any("LMHead" in c for c in classes)


def _state_tensors(model: torch.nn.Module):
    """(qualified name, owning module, local name, tensor) for every parameter and persistent
    buffer: exactly what the dummy loader touched."""
    for prefix, module in model.named_modules():
        for name, p in module._parameters.items():
            if p is not None:
                yield f"{prefix}.{name}" if prefix else name, module, name, p
        for name, b in module._buffers.items():
            if b is not None and name not in module._non_persistent_buffers_set:
                yield f"{prefix}.{name}" if prefix else name, module, name, b


def tensor_seed(seed: int, name: str) -> int:
    """A per-tensor seed from the run seed and the tensor's name: independent of visiting order."""
    return (seed * 1_000_003 + zlib.crc32(name.encode())) % (2**63 - 1)


@torch.no_grad()
def hf_like_init(model: torch.nn.Module, init: HFLikeInit, pad_token_id: Optional[int] = None,
                 strict: bool = True) -> dict:
    """Re-initialise `model` in place like a fresh transformers model. Returns a summary.

    A floating state-dict entry no rule covers raises (strict) or is left as it was and listed
    under "unknown" (strict=False: the engine still starts, and the caller reports it)."""
    # A tensor tied to several modules (lm_head = embed_tokens) is written once, under the token
    # embedding's rule, so its padding row stays zero as in transformers.
    chosen: dict[int, tuple[str, torch.nn.Module, str, torch.Tensor]] = {}
    unknown: list[str] = []
    for qualified, module, name, tensor in _state_tensors(model):
        if not torch.is_floating_point(tensor):
            continue
        if init_rule(module, name) is None:
            unknown.append(f"{qualified} ({type(module).__name__})")
            continue
        key = id(tensor)
        if key not in chosen or (_is_token_embedding(module) and not _is_token_embedding(chosen[key][1])):
            chosen[key] = (qualified, module, name, tensor)
    if unknown and strict:
        raise RuntimeError(
            "alignatt: no transformers-like init rule for these state-dict entries (they would keep "
            f"the dummy loader's ±1e-3 values): {unknown[:20]}{' ...' if len(unknown) > 20 else ''}"
        )
    counts = {"normal": 0, "ones": 0, "zeros": 0}
    elements = 0
    pad_rows: list[str] = []
    fp8: list[str] = []
    for qualified, module, name, tensor in sorted(chosen.values(), key=lambda item: item[0]):
        rule = init_rule(module, name)
        if rule == "scale":
            continue
        if rule == "normal":
            generator = torch.Generator(device=tensor.device)
            generator.manual_seed(tensor_seed(init.seed, qualified))
            if _is_fp8(tensor):
                _normal_fp8(module, tensor, init.std, generator)
                fp8.append(qualified)
            else:
                tensor.normal_(0.0, init.std, generator=generator)
            if pad_token_id is not None and _is_token_embedding(module) and tensor.dim() == 2 \
                    and 0 <= pad_token_id < tensor.shape[0]:
                tensor[pad_token_id].zero_()
                pad_rows.append(qualified)
        elif rule == "ones":
            tensor.fill_(1.0)
        else:
            tensor.zero_()
        counts[rule] += 1
        elements += tensor.numel()
    return {"init": init.describe(), "tensors": counts, "elements": elements, "pad_rows_zeroed": pad_rows,
            "fp8_weights": len(fp8), "unknown": unknown}


def _normal_fp8(module: torch.nn.Module, weight: torch.Tensor, std: float, generator: torch.Generator) -> None:
    """normal(0, std) drawn in float32, stored in FP8 with one scale for the tensor (its absolute
    maximum onto the format's largest value) written to the module's `weight_scale`."""
    scale_param = getattr(module, "weight_scale", None)
    if scale_param is None:
        raise RuntimeError(f"alignatt: an FP8 weight of {type(module).__name__} without a weight_scale")
    draw = torch.empty(weight.shape, dtype=torch.float32, device=weight.device).normal_(0.0, std, generator=generator)
    scale = draw.abs().amax().clamp_min(1e-12) / torch.finfo(weight.dtype).max
    weight.copy_((draw / scale).to(weight.dtype))
    scale_param.copy_(scale.to(scale_param.dtype).expand_as(scale_param))

