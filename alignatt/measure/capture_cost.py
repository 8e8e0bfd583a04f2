"""Capture cost of `vllm_capture`: captured vs uncaptured `draft_many` wall per batch size, and a
torch profile of where a draft's time goes at batch 1 and at the largest batch (for `alignatt
load` on a GPU host)."""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any, Callable, Protocol

from alignatt.capture.names import VLLM_CAPTURE


class CaptureCostOptions(Protocol):
    """What the measurement reads from its caller's options (the capacity benchmark's `LoadOptions`
    has them all); a protocol, so that this module needs nothing from the benchmark that runs it."""

    model: str
    device: str
    dtype: str | None
    capture_cost_batches: list[int]
    capture_cost_tokens: int
    capture_cost_repeats: int
    profile_dir: str | None


def write_text_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


def capture_cost(options: CaptureCostOptions, heads: list, make: Callable[..., Any] | None = None,
                 seam_options: dict[str, Any] | None = None) -> list[dict]:
    """Captured vs uncaptured `draft_many` wall at each batch size: same prompts, same run,
    fixed-length drafts (both engines generate the same number of tokens); `seam_options`: the
    configuration's engine options (its vLLM mode, cudagraph unless it names one, and flags)."""
    from alignatt.capture.registry import make_seam
    from alignatt.checks.records import bench_requests

    make = make or make_seam
    prompts = [r for _, r in bench_requests(options.capture_cost_tokens)]
    walls: dict[bool, dict[int, float]] = {}
    for captured in (True, False):
        seam = make(VLLM_CAPTURE, model=options.model, heads=heads, device=options.device, dtype=options.dtype,
                    capture=captured, fixed_length=True, max_num_seqs=max(options.capture_cost_batches),
                    **{"vllm_mode": "cudagraph", **(seam_options or {})})
        try:
            walls[captured] = {}
            for batch in options.capture_cost_batches:
                requests = [prompts[i % len(prompts)] for i in range(batch)]
                seam.draft_many(requests)  # warm-up (graphs of this batch size)
                times = []
                for _ in range(options.capture_cost_repeats):
                    t0 = time.perf_counter()
                    seam.draft_many(requests)
                    times.append((time.perf_counter() - t0) * 1e3)
                walls[captured][batch] = statistics.median(times)
            if options.profile_dir:  # batch 1 and the largest batch: where a draft's wall goes, alone and batched
                for batch in sorted({1, max(options.capture_cost_batches)}):
                    profile_drafts(seam, [prompts[i % len(prompts)] for i in range(batch)], Path(options.profile_dir),
                                   f"{'captured' if captured else 'uncaptured'}_b{batch}")
        finally:
            seam.close()
    return [dict(batch=b, captured_ms=round(walls[True][b], 2), uncaptured_ms=round(walls[False][b], 2),
                 ratio=round(walls[True][b] / walls[False][b], 3)) for b in options.capture_cost_batches]


def profile_drafts(seam: Any, requests: list, folder: Path, label: str, repeats: int = 3) -> Path:
    """torch.profiler over `repeats` drafts of `requests` (CPU and CUDA): a Chrome trace and the
    top operators by CUDA and by CPU time, to see where a draft's wall goes."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    folder.mkdir(parents=True, exist_ok=True)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=activities, record_shapes=False) as prof:
        for _ in range(repeats):
            seam.draft_many(requests)
    prof.export_chrome_trace(str(folder / f"{label}_trace.json"))
    table = []
    for key in ("cuda_time_total", "cpu_time_total"):
        try:
            table.append(f"== by {key} ==\n" + prof.key_averages().table(sort_by=key, row_limit=40))
        except Exception as e:  # noqa: BLE001 - a key this torch build does not know
            table.append(f"== by {key}: {e}")
    path = folder / f"{label}_top_ops.txt"
    write_text_atomic(path, "\n\n".join(table) + "\n")
    return path
