"""The Benchmarks page's GPU step anatomy: where an engine step's time went at a profiled load level.

From the load artifacts' `step_anatomy` (`alignatt load --kernel-profile-speakers N`): a row per
profiled engine (its parts' GPU time per step, the idle time, and the step's memory bandwidth and
FLOP/s against the device's peaks), and a figure of the parts as one stacked bar per row.
"""

from __future__ import annotations

from typing import Any

from alignatt.record.artifacts.load import StepAnatomy
from alignatt.report.figures import Figure, new_figure, styled, svg_text
from alignatt.report.inputs import ReportInputs

IDLE = "GPU idle (no kernel, no copy)"


def _profiled(inputs: ReportInputs) -> list[tuple[str, Any, Any, str, StepAnatomy | Any]]:
    out = []
    for rel, a in sorted(inputs.of_kind("load"), key=lambda t: t[0]):
        for lv in a.levels:
            for engine, s in (lv.step_anatomy or {}).items():
                out.append((rel, a, lv, engine, s))
    return out


def _share(value: float | None) -> str:
    return "—" if value is None else f"{value:.1%}"


def step_anatomy_rows(inputs: ReportInputs) -> list[dict[str, Any]]:
    from alignatt.report.capacity import configuration

    rows = []
    for rel, a, lv, engine, s in _profiled(inputs):
        row = dict(date=a.provenance.date, configuration=configuration(rel, a, lv.vllm_mode), engine=engine,
                   synthetic=a.synthetic_weights, speakers=lv.speakers)
        if not isinstance(s, StepAnatomy):
            rows.append(dict(row, missing=s.missing))
            continue
        parts = sorted(((p, ms) for p, ms in s.parts_ms.items() if ms > 0), key=lambda t: -t[1])
        rows.append(dict(
            row, missing=None, steps=s.steps, wall=f"{s.step_wall_ms:.2f}", busy=f"{s.gpu_busy_ms:.2f}",
            idle=f"{s.idle_ms:.2f}", parts="; ".join(f"{p} {ms:.2f}" for p, ms in parts) or "—",
            tokens=f"{s.tokens.get('prefill', 0) / s.steps:.0f} + {s.tokens.get('decode', 0) / s.steps:.0f}"
            if s.tokens else "—",
            bandwidth="—" if s.weights_gb_per_s is None else f"{s.weights_gb_per_s:.0f} GB/s ({_share(s.bandwidth_share)})",
            floor="—" if s.weight_read_floor_ms is None else f"{s.weight_read_floor_ms:.2f}",
            flops="—" if s.tflops is None else f"{s.tflops:.1f} ({_share(s.flops_share)})",
            largest=s.largest_part or "—", stopped="—" if s.write_s is None else f"{s.write_s:.1f}"))
    return rows


def step_anatomy_figure(inputs: ReportInputs) -> list[Figure]:
    """One stacked bar per profiled engine: ms per step by part, then the idle time."""
    bars = [(f"{a.provenance.date} {lv.vllm_mode or a.config.get('seam')}, {lv.speakers} speakers, engine {engine}", s)
            for _, a, lv, engine, s in _profiled(inputs) if isinstance(s, StepAnatomy)]
    if not bars:
        return []

    def draw() -> Figure:
        from alignatt.report.capacity import OKABE_ITO

        fig, ax = new_figure(7.5, 1.2 + 0.5 * len(bars))
        colors = list(OKABE_ITO) + ["#999999", "#444444"]
        # the parts in the order the engine recorded them (serve.step_anatomy.ORDER), then idle
        names = list(dict.fromkeys(p for _, s in bars for p in s.parts_ms)) + [IDLE]
        for i, (_, s) in enumerate(bars):
            left = 0.0
            for j, part in enumerate(names):
                ms = s.idle_ms if part == IDLE else s.parts_ms.get(part, 0.0)
                ax.barh(i, ms, left=left, color="#FFFFFF" if part == IDLE else colors[j % len(colors)],
                        edgecolor="#000000" if part == IDLE else "none", hatch="//" if part == IDLE else None,
                        linewidth=0.5, label=part if i == 0 else None)
                left += ms
            if s.weight_read_floor_ms:
                ax.plot([s.weight_read_floor_ms] * 2, [i - 0.4, i + 0.4], color="#000000", linewidth=1.5,
                        label="weights read once at peak bandwidth" if i == 0 else None)
        ax.set_yticks(range(len(bars)), [label for label, _ in bars], fontsize=7)
        ax.invert_yaxis()
        ax.set_xlabel("ms per engine step (GPU time by part; idle: the window's time no kernel covers)", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.legend(fontsize=6, loc="upper center", bbox_to_anchor=(0.5, -0.35), ncol=3, frameon=False)
        caption = ("Where an engine step's time went at a profiled load level (torch profiler, CUDA kernels, "
                   "kernels sorted into parts by name, `alignatt/serve/step_anatomy.py`), against the time the "
                   "step's weights take to read once at the device's peak bandwidth (the black tick).")
        return Figure("step_anatomy", "load", "GPU step anatomy", caption, svg_text(fig))

    return [styled(draw)]
