"""The capture seams and vLLM modes by name: the one list that the registry, the CLI and the artifact schema share.

Kept apart from the registry so that the schema (and the audit) know the names without importing
torch or any seam.
"""

import os

from alignatt.core.errors import AlignattError

HF_EAGER = "hf_eager"
HF_QK_FAST = "hf_qk_fast"
VLLM_CAPTURE = "vllm_capture"
SEAMS = (HF_EAGER, HF_QK_FAST, VLLM_CAPTURE)
HF_SEAMS = SEAMS[:2]  # the transformers seams: they do not depend on the vLLM mode
DEFAULT_SEAM = HF_QK_FAST
# What alignatt[vllm] installs: vllm_capture is written against this version's internals.
PINNED_VLLM = "0.22.1"
# How vllm_capture runs the engine (alignatt.capture.vllm.engine.engine_options says what each is):
# eager; cudagraph: full graphs for decode steps only; fullgraph: full graphs for every step,
# prefill and mixed ones too; compiled: torch.compile under fullgraph's graphs.
VLLM_MODES = ("eager", "cudagraph", "fullgraph", "compiled")
# vLLM's online weight quantizations that vllm_capture offers (VllmEngineConfig.quantization).
VLLM_QUANTIZATIONS = ("fp8",)
# The profiler range the vllm seam's fetch runs in: a kernel profile (serve.step_anatomy) tells
# the capture's own GPU work from the model's by it.
FETCH_RANGE = "alignatt.capture_fetch"


# Set where several engines start side by side on one GPU (the GPU suite's lanes): the share of the
# device vLLM's start-up check may ask for, split further by a server between its engines
# (serve/pool.py). The KV cache is sized by kv_cache_memory_gib either way.
GPU_MEMORY_SHARE_ENV = "ALIGNATT_VLLM_GPU_MEMORY_SHARE"


def gpu_memory_share() -> float | None:
    raw = os.environ.get(GPU_MEMORY_SHARE_ENV)
    if not raw:
        return None
    try:
        share = float(raw)
    except ValueError:
        share = -1.0
    if not 0 < share <= 1:
        raise AlignattError(f"{GPU_MEMORY_SHARE_ENV} must be a fraction in (0, 1], not {raw!r}")
    return share
