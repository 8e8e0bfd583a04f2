"""What crosses the process boundary between a GPU check and its vLLM worker, and the thresholds.

The parent writes a `WorkerSpec` as JSON; the worker pickles one `WorkerResult` back (numpy arrays
inside the draft records stay arrays: they are compared, never written to an artifact). Every
pass/fail threshold of the checks lives here once.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Optional, TypedDict

from pydantic import BaseModel, ConfigDict

WorkerTask = Literal["drafts", "parity_vllm", "parity_hf"]

# Captured vs uncaptured decode (speed checks): the capture may cost at most 15%.
CAPTURED_DECODE_RATIO_MAX = 1.15
# Share of (token, head) rows whose argmax source position agrees between two captures.
ALIGN_AGREEMENT_MIN = 0.95
# Self-consistency: ||own - rebuilt|| / ||rebuilt|| per row (bf16 output vs fp32 rebuild), and cosine.
SELF_CONSISTENCY_REL_TOL = 0.02
SELF_CONSISTENCY_MIN_COS = 0.999


class WorkerSpec(BaseModel):
    """One worker's job: which engine to build and what to draft with it."""

    model_config = ConfigDict(extra="forbid")

    name: str
    task: WorkerTask
    heads: list[tuple[int, int]]
    tokens: int = 20
    tokenizer: Literal["auto", "tiny"] = "auto"
    model: str = ""  # task drafts: a model preset
    checkpoint: str = ""  # parity tasks: the reduced checkpoint directory
    mode: str = "eager"  # vLLM mode
    quantization: Optional[str] = None  # vLLM's online weight quantization (fp8)
    dtype: str = "bfloat16"
    device: str = "cuda"  # parity_hf: where transformers runs
    warmup: int = 1
    repeats: int = 3
    decision_heads: int = 8
    fixed_length: bool = True
    capture: bool = True
    capture_output: bool = False
    batch_check: bool = False
    max_model_len: int = 4096
    kv_cache_memory_gib: float = 1.0
    vllm_fp32: Optional[str] = None  # parity_hf: the vLLM workers' result files
    vllm_bf16: Optional[str] = None
    env: dict[str, str] = {}
    result: str = ""  # where the worker pickles its WorkerResult


class DecisionRecord(TypedDict):
    emit_count: int
    stop_reason: str
    emitted_text: str
    emit: list[bool]
    aligned_word: list[int]


class DraftRecord(TypedDict, total=False):
    """One draft as plain data: tokens, rows [T, H, S] and masses, timings, AlignAtt decisions."""

    id: str
    repeat: int
    token_ids: list[int]
    text: str
    stop_reason: str
    rows: Any  # np.ndarray float32 [T, H, S]
    other: Any
    generated: Any
    timings: dict[str, float]
    n_tokens: int
    prompt_tokens: int
    decision: DecisionRecord
    probe: dict
    layers: dict  # parity: raw q / keys / probs per captured layer


@dataclass
class WorkerResult:
    """What a worker sends back; `ok=False` carries the error instead."""

    ok: bool
    error: Optional[str] = None
    traceback: Optional[str] = None
    wall_s: Optional[float] = None
    tokenizer: Optional[str] = None
    describe: Optional[dict] = None
    drafts: list[DraftRecord] = field(default_factory=list)
    batch: Optional[list[DraftRecord]] = None
    self_consistency: Optional[dict] = None
    batch_self_consistency: Optional[dict] = None
    # parity_vllm
    runs: list[DraftRecord] = field(default_factory=list)
    checkpoint: Optional[dict] = None
    dtype: Optional[str] = None
    mode: Optional[str] = None
    triton_f32_default: Optional[str] = None
    # parity_hf
    have_vllm_fp32: Optional[bool] = None
    have_vllm_bf16: Optional[bool] = None
    fp32: Optional[dict] = None
    bf16: Optional[dict] = None
    hf_qk_fast_seam: Optional[dict] = None

    @classmethod
    def failed(cls, error: str, **extra: Any) -> "WorkerResult":
        return cls(ok=False, error=error, **extra)


def load_result(path: Path) -> WorkerResult:
    """A worker's pickled result (our own file, written by `checks.worker`)."""
    with open(path, "rb") as f:
        result = pickle.load(f)
    if not isinstance(result, WorkerResult):
        raise TypeError(f"{path}: not a WorkerResult ({type(result).__name__})")
    return result
