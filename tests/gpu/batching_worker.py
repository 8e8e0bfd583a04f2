"""One vLLM engine for the batching GPU tests, in its own process (one capturing engine per
process): drafts a growing utterance one update at a time (each prompt extends the previous one's
source, so prefix caching serves the shared prefix), then the same requests submitted a step
apart into one running batch (with the batched fetch, then with the per-request reference
rebuild), and writes every draft's tokens and rows to an .npz.

`python -m tests.gpu.batching_worker SPEC.json OUT.npz`; SPEC: checkpoint, dtype, mode,
prefix_caching, heads, tokens, kv_cache_memory_gib.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

SENTENCE = ("the night train to the coast leaves from platform four at ten past eleven and "
            "arrives shortly after sunrise").split()


def requests(tokens: int):
    from alignatt.core.draft import DraftRequest

    # A growing utterance: every update drafts over one more word (the tail is the last word).
    return [DraftRequest(source_words=SENTENCE[:k], committed_words=k - 1, max_new_tokens=tokens)
            for k in range(4, len(SENTENCE) + 1, 2)]


def open_seam(spec: dict, **options):
    """The vLLM capture seam on the reduced Gemma-4 checkpoint that `spec` names (built once)."""
    from alignatt.capture.vllm.seam import VllmCaptureSeam
    from alignatt.checks.cross_engine import ensure_reduced_checkpoint
    from alignatt.checks.records import choose_tokenizer
    from alignatt.core.draft import Head

    tokenizer, _ = choose_tokenizer("auto")
    ckpt = Path(spec["checkpoint"])
    ensure_reduced_checkpoint(ckpt, tokenizer)
    return VllmCaptureSeam(str(ckpt), [Head(l, h) for l, h in spec["heads"]], tokenizer=tokenizer,
                           vllm_mode=spec["mode"], dtype=spec["dtype"], fixed_length=True, max_num_seqs=16,
                           kv_cache_memory_gib=spec["kv_cache_memory_gib"], **options)


def kernel_window(seam, reqs, path: Path) -> dict[str, np.ndarray]:
    """The requests in one batch again, under the engine process's kernel window (3 steps): its
    anatomy's host side, and whether vLLM's scope function is back to what it was after it."""
    import vllm.v1.utils as vllm_utils

    from alignatt.serve.engine_profile import KernelWindow

    before = vllm_utils._PROFILER_FUNC
    window = KernelWindow(seam)
    window.arm(str(path), 3)
    for r in reqs:
        seam.submit(r)
    while seam.has_unfinished():
        window.step(seam.step)
    anatomy = json.loads(path.read_text())
    return {"window_gpu_busy_ms": np.asarray(anatomy["gpu_busy_ms"]),
            "window_gpu_wait_ms": np.asarray(anatomy["gpu_wait_ms"]),
            "window_host_ms": np.asarray(anatomy["host_ms"]),
            "window_step_wall_ms": np.asarray(anatomy["step_wall_ms"]),
            "window_host_ranges": np.asarray(sorted(anatomy["host_ranges_ms"]) or [""]),
            "window_scopes_restored": np.asarray(vllm_utils._PROFILER_FUNC is before)}


def main(spec_path: str, out_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text())
    seam = open_seam(spec, enable_prefix_caching=spec["prefix_caching"])
    out: dict[str, np.ndarray] = {}
    try:
        reqs = requests(spec["tokens"])
        for i, r in enumerate(reqs):  # one update at a time, like a session
            d = seam.draft(r)
            out[f"alone_tokens_{i}"] = np.asarray([t.token_id for t in d.tokens])
            out[f"alone_rows_{i}"] = np.stack([t.rows for t in d.tokens])
        # Continuous batching: request i joins the running batch at step i (so most finish while
        # others still run, and their rows are read a step later). Once with the batched fetch,
        # once with the per-request reference rebuild.
        for kind, reconstruct in (("batch", "batched"), ("reference", "reference")):
            seam.reconstruct = reconstruct
            handles, done = [], {}
            for r in reqs:
                handles.append(seam.submit(r))
                done.update(seam.step())
            while seam.has_unfinished():
                done.update(seam.step())
            for i, h in enumerate(handles):
                d = done[h]
                out[f"{kind}_tokens_{i}"] = np.asarray([t.token_id for t in d.tokens])
                out[f"{kind}_rows_{i}"] = np.stack([t.rows for t in d.tokens])
        seam.reconstruct = "batched"
        if spec.get("kernel_window"):
            out.update(kernel_window(seam, reqs, Path(out_path).with_suffix(".anatomy.json")))
        facts = seam.describe()
        out["cached_prompt_tokens"] = np.asarray(facts["cached_prompt_tokens"])
        out["prompt_tokens"] = np.asarray(facts["prompt_tokens"])
    finally:
        seam.close()
    np.savez(out_path, **out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(*sys.argv[1:3]))
