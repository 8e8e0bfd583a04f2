"""The capture seams and vLLM modes by name: the one list that the registry, the CLI and the artifact schema share.

Kept apart from the registry so that the schema (and the audit) know the names without importing
torch or any seam.
"""

SEAMS = ("hf_eager", "hf_qk_fast", "vllm_capture")
HF_SEAMS = SEAMS[:2]  # the transformers seams: they do not depend on the vLLM mode
DEFAULT_SEAM = "hf_qk_fast"
# How vllm_capture runs the engine (alignatt.capture.vllm.engine.engine_options says what each is):
# eager; cudagraph: full graphs for decode steps only; fullgraph: full graphs for every step,
# prefill and mixed ones too; compiled: vLLM's default torch.compile + graphs.
VLLM_MODES = ("eager", "cudagraph", "fullgraph", "compiled")
