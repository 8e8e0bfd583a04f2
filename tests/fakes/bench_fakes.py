"""A fake capture seam with known drafts and timings, for testing the benchmark's bookkeeping.

`make_fake_seam` is a bench seam factory (importable by the bench worker subprocess as
`tests.fakes.bench_fakes:make_fake_seam`). Seam behaviour by name:
- `hf_eager`, `hf_qk_fast`: translate word i of the source to " W<i>", attending to word i;
  timings: prefill 10 ms, decode 2 ms per token (hf_qk_fast: 1 ms), capture 0, reconstruct 0.5.
- `vllm_capture`: raises AlignattError like a machine without vLLM.
- a seam in `DIVERGE` drafts differently on prompt `short_01` (token 2 looks at the last word).
- `crash_seam`: the process dies in the middle of the measured passes (like an OOM kill).
"""

from __future__ import annotations

import os

import numpy as np

from alignatt.core.draft import Draft, DraftRequest, Head, Timings, TokenCapture
from alignatt.core.errors import AlignattError

DECODE_MS = {"hf_eager": 2.0, "hf_qk_fast": 1.0}
DIVERGE = {"diverging_seam"}


class FakeSeam:
    def __init__(self, name: str, heads: list[Head], decode_ms: float):
        self.name = name
        self.heads = heads
        self.decode_ms = decode_ms
        self.calls = 0

    def close(self) -> None:
        pass

    def draft(self, request: DraftRequest) -> Draft:
        self.calls += 1
        if self.name == "crash_seam" and self.calls > 20:
            os._exit(3)
        words = request.source_words
        n = min(len(words), request.max_new_tokens)
        aligned = list(range(n))
        if self.name in DIVERGE and words[:2] == ["the", "model"] and not request.target_prefix:
            aligned[2] = len(words) - 1  # look at the tail early: the policy stops sooner
        tokens = []
        for i, w in enumerate(aligned):
            rows = np.full((len(self.heads), len(words)), 0.01, dtype=np.float32)
            rows[:, w] = 0.9
            tokens.append(
                TokenCapture(
                    token_id=1000 + i,
                    piece=f" W{i}",
                    rows=rows,
                    other_prompt_mass=np.zeros(len(self.heads), dtype=np.float32),
                    generated_mass=np.zeros(len(self.heads), dtype=np.float32),
                )
            )
        timings = Timings(prefill_ms=10.0, decode_ms=self.decode_ms * n, reconstruct_ms=0.5)
        return Draft(
            request=request,
            heads=self.heads,
            prompt_token_count=50 + len(words),
            source_token_positions=list(range(50, 50 + len(words))),
            source_word_of_token=list(range(len(words))),
            tokens=tokens,
            stop_reason="max_new_tokens" if n == request.max_new_tokens else "eos",
            timings=timings,
            seam=self.name,
        )


def make_fake_seam(name: str, config) -> FakeSeam:
    if name == "vllm_capture":
        raise AlignattError("vllm_capture needs vLLM 0.22.1 and CUDA: vLLM is not installed")
    heads = [Head(1, 0), Head(2, 1)][: config.heads_k]
    return FakeSeam(name, heads, DECODE_MS.get(name, 1.5))
