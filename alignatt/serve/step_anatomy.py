"""Where an engine step's time goes on the GPU: a kernel trace cut into parts, against the roofline.

An engine process records a window of its steps with torch's profiler (CUDA activities; kernels
replayed from CUDA graphs are traced too) and `anatomy` reduces the trace to what the load
artifact keeps: per step, the GPU time of each part, the idle time (the step's wall that no kernel
or copy covers), the tokens the step computed, and the memory bandwidth and FLOP/s those imply.

The host side of the same steps: the engine thread's time blocked in CUDA synchronisation calls
(`SYNC_CALL`: vLLM's step ends waiting on its output copy's event) is its wait on the GPU; the
rest of a step's wall is host work, and the time between two steps is the engine loop's own. While
the window runs, vLLM's own host ranges are on (`gpu_model_runner: ...`, `schedule: ...`; the seam's
`host_scopes`), so the host work is split by phase too.

Kernels are sorted into parts by name (`PARTS`, first match wins), except the capture's own
fetch, which runs inside an `alignatt.capture_fetch` range. Names are the stack's: vLLM's
TRITON_ATTN backend (`kernel_unified_attention_2d` for steps with prefill, `_3d` + `reduce_segments`
for split-KV decode), cuBLAS/CUTLASS GEMMs, vLLM's KV-cache writes. The q writes of the capture
inside the graphs are index kernels (`index_put`, `index_copy`); the model's own embedding
gathers are `indexSelect`/`embedding` and stay in "other".
"""

from __future__ import annotations

import bisect
import re
from typing import Any, Iterable

from alignatt.capture.names import FETCH_RANGE  # the range the vllm seam's fetch runs in

STEP_RANGE = "alignatt.engine_step"  # the engine process's step, around the seam's step
# CUDA runtime calls that block the calling thread until the GPU has caught up.
SYNC_CALL = re.compile(r"^cuda(Event|Stream|Device)Synchronize$|^cudaMemcpy$")
# vLLM's record_function scopes (vllm.v1.utils.record_function_or_nullcontext), when switched on.
VLLM_SCOPE = re.compile(r"^(gpu_model_runner|schedule): ")
HOST_RANGES_KEPT = 10

# Ordered: the first pattern that matches a kernel's name names its part.
PARTS: tuple[tuple[str, str], ...] = (
    ("KV-cache write", r"reshape_and_cache|concat_and_cache"),
    ("attention, decode (split-KV)", r"unified_attention_3d|reduce_segments"),
    ("attention, prefill or mixed", r"unified_attention|flash|fmha|attn"),
    ("GEMM", r"gemm|nvjet|cutlass|xmma|cublas|matmul|splitK|s16816|s1688"),
    ("capture: q writes", r"index_put|index_copy|scatter"),
    ("sampling", r"argmax|ArgMax|topk|sort|softmax|sampl|gumbel|multinomial|logsumexp"),
)
# Dense peaks by device name (NVIDIA's datasheets: H200 SXM 4.8 TB/s HBM3e, 989 TFLOP/s bf16 dense).
DEVICE_PEAKS: dict[str, tuple[float, float]] = {"H200": (4800.0, 989.0), "H100": (3350.0, 989.0)}
CAPTURE_FETCH = "capture: fetch"
OTHER = "other kernels (norms, activations, rotary, elementwise)"
COPIES = "memory copies and sets"
ORDER = [p for p, _ in PARTS] + [CAPTURE_FETCH, OTHER, COPIES]
_COMPILED = [(part, re.compile(pattern, re.IGNORECASE)) for part, pattern in PARTS]


def part_of(kernel_name: str) -> str:
    for part, pattern in _COMPILED:
        if pattern.search(kernel_name):
            return part
    return OTHER


def device_peaks(device_name: str) -> tuple[float | None, float | None]:
    """(GB/s, bf16 TFLOP/s) of a device by its name; (None, None) when the table lacks it."""
    for key, peaks in DEVICE_PEAKS.items():
        if key in device_name:
            return peaks
    return None, None


def _union_us(intervals: Iterable[tuple[float, float]]) -> float:
    """Total length covered by the intervals (overlaps counted once)."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def _within(spans: list[tuple[float, float]], starts: list[float], a: float, b: float) -> bool:
    """Whether [a, b] lies inside one of `spans` (sorted by start; `starts` their starts): the last
    span starting at or before `a` is the only one that can hold it, the fetch ranges being one
    after another on the stream. A bisection, not a scan: a window holds ~10^5 kernels."""
    i = bisect.bisect_right(starts, a) - 1
    return i >= 0 and b <= spans[i][1]


def _host_side(events: list[dict[str, Any]], steps: list[tuple[float, float]]) -> tuple[float, dict[str, float]]:
    """On the engine thread (the one whose step ranges these are), inside the steps: the µs blocked
    on the GPU, and the µs of each of vLLM's host ranges by name."""
    threads = {(e.get("pid"), e.get("tid")) for e in events
               if e.get("name") == STEP_RANGE and e.get("cat") == "user_annotation"}
    spans = sorted(steps)
    starts = [a for a, _ in spans]

    def inside(e: dict[str, Any]) -> float:
        """The µs of event `e` inside the step that holds its start (0 outside every step)."""
        a, b = e["ts"], e["ts"] + e["dur"]
        i = bisect.bisect_right(starts, a) - 1
        return max(0.0, min(b, spans[i][1]) - a) if i >= 0 and a < spans[i][1] else 0.0

    wait_us, ranges = 0.0, {}
    for e in events:
        if "dur" not in e or (e.get("pid"), e.get("tid")) not in threads:
            continue
        name = e.get("name", "")
        if e.get("cat") == "cuda_runtime" and SYNC_CALL.match(name):
            wait_us += inside(e)
        elif e.get("cat") == "user_annotation" and VLLM_SCOPE.match(name):
            ranges[name] = ranges.get(name, 0.0) + inside(e)
    return wait_us, ranges


def anatomy(events: list[dict[str, Any]], tokens: dict[str, int], weight_bytes: int | None,
            peak_bandwidth_gbs: float | None, peak_tflops: float | None, active_params: int | None) -> dict:
    """The window's breakdown from Chrome-trace events (`ph: X`, times in µs).

    `tokens`: the prefill and decode tokens the window's steps computed; `weight_bytes`: what one
    forward reads of the weights (the lower bound of a step's traffic); `active_params`: the
    parameters a token multiplies by (2 FLOP each). Peaks: the device's, for the shares."""
    # The CPU's ranges (a range also has a GPU twin, `gpu_user_annotation`, over its kernels).
    steps = [(e["ts"], e["ts"] + e["dur"]) for e in events
             if e.get("name") == STEP_RANGE and e.get("cat") == "user_annotation" and "dur" in e]
    if not steps:
        raise ValueError(f"the trace holds no {STEP_RANGE} range: no step was profiled")
    lo, hi = min(a for a, _ in steps), max(b for _, b in steps)
    fetch_spans = sorted((e["ts"], e["ts"] + e["dur"]) for e in events
                         if e.get("name") == FETCH_RANGE and e.get("cat") == "gpu_user_annotation")
    fetch_starts = [a for a, _ in fetch_spans]
    by_part = dict.fromkeys(ORDER, 0.0)
    kernels = dict.fromkeys(ORDER, 0)
    busy: list[tuple[float, float]] = []
    names: dict[str, list[float]] = {}
    for e in events:
        cat = e.get("cat")
        if cat not in ("kernel", "gpu_memcpy", "gpu_memset") or "dur" not in e:
            continue
        a, b = e["ts"], e["ts"] + e["dur"]
        if b < lo or a > hi:
            continue
        a, b = max(a, lo), min(b, hi)
        if cat != "kernel":
            part = COPIES
        elif _within(fetch_spans, fetch_starts, a, b):
            part = CAPTURE_FETCH
        else:
            part = part_of(e.get("name", ""))
        by_part[part] += b - a
        kernels[part] += 1
        busy.append((a, b))
        slot = names.setdefault(e.get("name", "?")[:120], [0.0, 0])
        slot[0] += b - a
        slot[1] += 1
    n = len(steps)
    wall_us = sum(b - a for a, b in steps)
    span_us = hi - lo
    busy_us = _union_us(busy)
    step_ms = wall_us / n / 1e3
    per_step = {p: round(by_part[p] / n / 1e3, 4) for p in ORDER}
    out: dict[str, Any] = {
        "steps": n,
        "window_s": round(span_us / 1e6, 6),
        "step_wall_ms": round(step_ms, 4),  # the engine thread's time in a step, mean
        "gpu_busy_ms": round(busy_us / n / 1e3, 4),  # kernels and copies, overlaps once, per step
        "idle_ms": round(max(span_us - busy_us, 0.0) / n / 1e3, 4),  # the window's time no kernel covers, per step
        "parts_ms": per_step,
        "kernels": kernels,
        "tokens": dict(tokens),
        "top_kernels": [{"name": k, "ms_per_step": round(v[0] / n / 1e3, 4), "calls": int(v[1])}
                        for k, v in sorted(names.items(), key=lambda kv: -kv[1][0])[:15]],
    }
    seconds = span_us / 1e6
    if weight_bytes:
        out["weight_bytes"] = int(weight_bytes)
        # A floor on the traffic: every forward reads the weights once (KV reads come on top).
        gbs = weight_bytes * n / seconds / 1e9 if seconds > 0 else None
        out["weights_gb_per_s"] = round(gbs, 1) if gbs is not None else None
        if peak_bandwidth_gbs and gbs is not None:
            out["bandwidth_share"] = round(gbs / peak_bandwidth_gbs, 4)
            out["weight_read_floor_ms"] = round(weight_bytes / peak_bandwidth_gbs / 1e6, 4)
    if active_params:
        flops = 2.0 * active_params * (tokens.get("prefill", 0) + tokens.get("decode", 0))
        tflops = flops / seconds / 1e12 if seconds > 0 else None
        out["tflops"] = round(tflops, 3) if tflops is not None else None
        if peak_tflops and tflops is not None:
            out["flops_share"] = round(tflops / peak_tflops, 4)
    wait_us, ranges = _host_side(events, steps)
    out.update({
        "gpu_wait_ms": round(wait_us / n / 1e3, 4),  # the engine thread blocked on the GPU, per step
        "host_ms": round((wall_us - wait_us) / n / 1e3, 4),  # the rest of the step's wall: host work
        "between_steps_ms": round((span_us - wall_us) / n / 1e3, 4),  # the engine loop's own
        "host_ranges_ms": {k: round(v / n / 1e3, 4)
                           for k, v in sorted(ranges.items(), key=lambda kv: -kv[1])[:HOST_RANGES_KEPT]},
    })
    out["largest_part"] = max(ORDER, key=lambda p: by_part[p]) if busy else None
    out["peaks"] = {"bandwidth_gbs": peak_bandwidth_gbs, "tflops": peak_tflops}
    return out
