"""The seam registry: one name per capture seam, one factory that builds any of them.

`hf_eager` and `hf_qk_fast` run on transformers anywhere (CPU or CUDA); `vllm_capture` needs
CUDA and vLLM 0.22.1 and lives in `alignatt.vllm_capture` (imported only when asked for).
"""

from __future__ import annotations

from typing import Any

from alignatt.capture import Head, Seam
from alignatt.errors import AlignattError

SEAMS = ("hf_eager", "hf_qk_fast", "vllm_capture")
DEFAULT_SEAM = "hf_qk_fast"
DEFAULT_MODEL = "gemma3-270m"


def make_seam(
    name: str,
    model: str = DEFAULT_MODEL,
    heads: list[Head] | None = None,
    device: str = "cpu",
    dtype: str | None = None,
    **options: Any,
) -> Seam:
    """Build a seam by name; loading happens here. Raises AlignattError when it cannot run here."""
    if name not in SEAMS:
        raise AlignattError(f"unknown seam {name!r}: use one of {', '.join(SEAMS)}")
    if name == "vllm_capture":
        return _make_vllm(model, heads, device, dtype, **options)
    if options:
        raise AlignattError(f"seam {name} takes no options, got {', '.join(sorted(options))}")
    from alignatt.models import load_model

    loaded = load_model(model, device=device, dtype=dtype)
    if heads is None:
        from alignatt.heads import default_heads

        heads = default_heads(model, 4)
    if name == "hf_eager":
        from alignatt.hf_eager import HFEagerSeam

        return HFEagerSeam(loaded, heads)
    from alignatt.hf_qk_fast import HFQKFastSeam

    return HFQKFastSeam(loaded, heads)


def _make_vllm(model: str, heads: list[Head] | None, device: str, dtype: str | None, **options: Any) -> Seam:
    reason = ""
    try:
        import torch

        if not torch.cuda.is_available():
            reason = "CUDA is not available here"
    except ImportError as e:  # pragma: no cover - torch is a hard dependency
        reason = str(e)
    if not reason:
        try:
            from alignatt import vllm_capture
        except ImportError as e:
            reason = f"cannot import it ({e})"
    if reason:
        raise AlignattError(f"vllm_capture needs CUDA and vLLM 0.22.1: {reason}")
    if heads is None:
        from alignatt.heads import default_heads

        heads = default_heads(model, 4)
    device = "cuda" if device == "cpu" else device
    # alignatt.vllm_capture is written separately: accept a `make_seam` factory or the seam class.
    factory = getattr(vllm_capture, "make_seam", None) or getattr(vllm_capture, "VLLMCaptureSeam", None)
    if factory is None:
        raise AlignattError("vllm_capture needs CUDA and vLLM 0.22.1: alignatt.vllm_capture has no seam factory")
    return factory(model=model, heads=heads, device=device, dtype=dtype, **options)
