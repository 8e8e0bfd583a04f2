"""The capture seams and vLLM modes by name: the one list that the registry, the CLI and the artifact schema share.

Kept apart from the registry so that the schema (and the audit) know the names without importing
torch or any seam.
"""

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
# prefill and mixed ones too; compiled: vLLM's default torch.compile + graphs.
VLLM_MODES = ("eager", "cudagraph", "fullgraph", "compiled")
# The profiler range the vllm seam's fetch runs in: a kernel profile (serve.step_anatomy) tells
# the capture's own GPU work from the model's by it.
FETCH_RANGE = "alignatt.capture_fetch"
