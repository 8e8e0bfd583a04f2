"""The Benchmarks page's GPU step anatomy: where an engine step's time went at a profiled load level.

From the load artifacts' `step_anatomy` (`alignatt load --kernel-profile-speakers N`): a row per
profiled engine (its parts' GPU time per step, the idle time, and the step's memory bandwidth and
FLOP/s against the device's peaks), and a figure of the parts as one stacked bar per row.
"""

from __future__ import annotations

from typing import Any

from alignatt.core.errors import AlignattError
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
            rows.append(dict(row, missing=s.missing, device="—"))
            continue
        parts = sorted(((p, ms) for p, ms in s.parts_ms.items() if ms > 0), key=lambda t: -t[1])
        rows.append(dict(
            row, missing=None, device=s.device, steps=s.steps, wall=f"{s.step_wall_ms:.2f}", busy=f"{s.gpu_busy_ms:.2f}",
            idle=f"{s.idle_ms:.2f}", parts="; ".join(f"{p} {ms:.2f}" for p, ms in parts) or "—",
            host="—" if s.host_ms is None else f"{s.host_ms:.2f} / {s.gpu_wait_ms:.2f} / {s.between_steps_ms:.2f}",
            host_ranges="; ".join(f"{name} {ms:.2f}" for name, ms in s.host_ranges_ms.items()) or "—",
            tokens=f"{s.tokens.get('prefill', 0) / s.steps:.0f} + {s.tokens.get('decode', 0) / s.steps:.0f}"
            if s.tokens else "—",
            bandwidth="—" if s.weights_gb_per_s is None else f"{s.weights_gb_per_s:.0f} GB/s ({_share(s.bandwidth_share)})",
            floor="—" if s.weight_read_floor_ms is None else f"{s.weight_read_floor_ms:.2f}",
            flops="—" if s.tflops is None else f"{s.tflops:.1f} ({_share(s.flops_share)})",
            stopped="—" if s.write_s is None else f"{s.write_s:.1f}"))
    return rows


def bandwidth_verdicts(inputs: ReportInputs) -> list[str]:
    """params.yaml's `report.step_bandwidth_target` ({speakers, share}) judged on each load level at
    those speakers whose steps ran untraced (`_untraced_verdicts`), then on each profiled engine there:
    met or missed, and what keeps the step from it. At the target share, a traced step may take
    the weights' read floor divided by it; the step's period (GPU busy + idle) is set against that,
    part by part, and without its idle time (the kernels alone, as they are)."""
    target = (inputs.params.get("report") or {}).get("step_bandwidth_target")
    if not target:
        return []
    if set(target) != {"speakers", "share"} or not 0 < target["share"] <= 1:
        raise AlignattError(f"report.step_bandwidth_target {target}: give speakers and share (0 < share <= 1)")
    said = []
    weights = _traced_weight_bytes(inputs)
    for rel, a, lv in _untraced_levels(inputs, target["speakers"]):
        said.extend(_untraced_verdicts(rel, a, lv, weights, target["share"]))
    for rel, a, lv, engine, s in _profiled(inputs):
        if lv.speakers != target["speakers"] or not isinstance(s, StepAnatomy) or s.bandwidth_share is None:
            continue
        budget = s.weight_read_floor_ms / target["share"]
        period = s.gpu_busy_ms + s.idle_ms
        parts = sorted([(IDLE, s.idle_ms), *((p, ms) for p, ms in s.parts_ms.items() if ms > 0)], key=lambda t: -t[1])
        over = [f"{p} {ms:.2f}" for p, ms in parts if ms >= 0.05 * period]
        said.append(f"{a.provenance.date}, `{rel}`, {lv.vllm_mode or a.config.seam}, {_speakers(lv.speakers)}, engine "
                    f"{engine}: **{'met' if s.bandwidth_share >= target['share'] else 'missed'}**, "
                    f"{_share(s.bandwidth_share)} of the peak (target {_share(target['share'])}). At "
                    f"{_share(target['share'])} a step may take {budget:.2f} ms (the {s.weight_read_floor_ms:.2f} ms "
                    f"floor ÷ {target['share']:g}); it took {period:.2f} ms of GPU busy and idle time: "
                    f"{'; '.join(over)} (ms per step, each part ≥ 5 % of it). With no idle time the kernels as they "
                    f"are would reach {_share(s.weight_read_floor_ms / s.gpu_busy_ms)}"
                    + (f"; the GEMMs alone take {s.parts_ms['GEMM'] / budget:.1f}× the target's step"
                       if s.parts_ms.get("GEMM", 0) > budget else "") + "." + _host_words(s, lv))
    return said


def _traced_weight_bytes(inputs: ReportInputs) -> dict[tuple[str, str | None], int]:
    """What one forward streams of the weights, by (model, configuration), as the traced levels
    recorded it: the weights of an untraced level of the same model and configuration."""
    return {(a.config.model, lv.vllm_mode): s.weight_bytes for _, a, lv, _, s in _profiled(inputs)
            if isinstance(s, StepAnatomy) and s.weight_bytes}


def _untraced_levels(inputs: ReportInputs, speakers: int) -> list[tuple[str, Any, Any]]:
    """The load levels at `speakers` whose engines were not traced: their steps ran at full speed."""
    return [(rel, a, lv) for rel, a in sorted(inputs.of_kind("load"), key=lambda t: t[0])
            for lv in a.levels if lv.speakers == speakers and not lv.step_anatomy]


def _card_bandwidth(a: Any) -> tuple[str, float | None]:
    """The card an artifact ran on, and its peak memory bandwidth in GB/s (None: not in the table)."""
    from alignatt.serve.step_anatomy import device_peaks

    card = a.provenance.gpus[0].name if a.provenance.gpus else ""
    return card, device_peaks(card)[0]


def _untraced_verdicts(rel: str, a: Any, lv: Any, weights: dict[tuple[str, str | None], int],
                       share: float) -> list[str]:
    """The bandwidth over an untraced level's steps: the weights one forward streams (as a traced level
    of the same model and configuration recorded them) per mean step of each engine, against the peak
    of the card the artifact ran on. A level without such a traced twin (another model, FP8 weights)
    or on a card the peak table lacks says nothing."""
    weight_bytes = weights.get((a.config.model, lv.vllm_mode))
    card, peak_gbs = _card_bandwidth(a)
    if not weight_bytes or peak_gbs is None:
        return []
    said = []
    for e in lv.engines:
        if not e.step_ms_mean:
            continue
        reached = weight_bytes / e.step_ms_mean / 1e6 / peak_gbs
        said.append(f"{a.provenance.date}, `{rel}`, {lv.vllm_mode}, {_speakers(lv.speakers)}, engine {e.engine}, "
                    f"untraced on {card}: **{'met' if reached >= share else 'missed'}**, {_share(reached)} of the "
                    f"peak (target {_share(share)}): a step took {e.step_ms_mean:.2f} ms; the peak reads the "
                    f"{weight_bytes / 1e9:.2f} GB of weights in {weight_bytes / peak_gbs / 1e6:.2f} ms.")
    return said


def drafting_floors(inputs: ReportInputs) -> list[str]:
    """Each round-trip p50 bound of `report.capacity_targets` set against the least a draft can take
    on the card of each `load` stage run: its mean forward steps (`verification`), each reading the
    weights once (as the traced level of the same model and configuration recorded them), at the
    card's peak bandwidth. A floor above the bound says the bound needs fewer forward steps per
    draft, not faster ones."""
    from alignatt.serve.step_anatomy import DEVICE_PEAKS

    bounds = {t["speakers"]: t["rtt_p50_ms"] for t in (inputs.params.get("report") or {}).get("capacity_targets") or []
              if "rtt_p50_ms" in t}
    weights = _traced_weight_bytes(inputs)
    said = []
    for rel, a in sorted(inputs.of_kind("load"), key=lambda t: t[0]):
        card, peak_gbs = _card_bandwidth(a)
        if not rel.endswith("/load.json") or peak_gbs is None:
            continue
        for lv in a.levels:
            weight_bytes = weights.get((a.config.model, lv.vllm_mode))
            steps = lv.verification.forward_steps_per_draft if lv.verification else None
            if lv.speakers not in bounds or not weight_bytes or not steps:
                continue
            read_ms = weight_bytes / peak_gbs / 1e6
            floor, bound = steps * read_ms, bounds[lv.speakers]
            others = "".join(f"; on an {name}, {steps * weight_bytes / gbs / 1e6:.1f} ms"
                             for name, (gbs, _) in DEVICE_PEAKS.items() if name not in card)
            verdict = (f"**above** the target's p50 of {bound} ms: on this card the target needs fewer forward "
                       "steps per draft" if floor > bound else
                       f"within the target's p50 of {bound} ms, which leaves {bound - floor:.1f} ms for the rest")
            said.append(f"{a.provenance.date}, `{rel}`, {lv.vllm_mode}, {_speakers(lv.speakers)} on {card}: a draft "
                        f"ran {steps:.2f} forward steps on average, and one step reads the {weight_bytes / 1e9:.2f} "
                        f"GB of weights in {read_ms:.2f} ms at the card's peak, so a mean draft takes at least "
                        f"**{floor:.1f} ms**, {verdict} (measured p50 {lv.partial_rtt_ms_p50:.0f} ms{others}).")
    return said


def _host_words(s: StepAnatomy, lv: Any) -> str:
    """Who keeps the GPU waiting, where the trace timed the engine thread: its host work against its
    waits on the GPU, and how much of a core the server's event loop used at the level."""
    if s.host_ms is None:
        return ""
    said = (f" The engine thread worked {s.host_ms:.2f} ms a step on the host and waited {s.gpu_wait_ms:.2f} ms "
            "on the GPU" + (": the host sets the step, and the GPU idles while it works"
                            if s.host_ms > s.gpu_busy_ms and s.gpu_wait_ms < 0.1 * s.host_ms else ""))
    loop = lv.server_loop_cpu_share
    return said + (f"; the server's event loop used {loop:.1%} of a core." if loop is not None else ".")


SMALL = "smaller parts (each under 5 % of the GPU time)"
SMALL_SHARE = 0.05  # parts below this share of every bar's GPU time draw as one (the table lists each)
SHORT = {"other kernels (norms, activations, rotary, elementwise)": "other kernels (norms, activations, ...)"}


def _drawn_parts(bars: list[tuple[str, StepAnatomy]]) -> list[str]:
    """The parts drawn on their own, in the order the engine recorded them (serve.step_anatomy.ORDER):
    those that reach SMALL_SHARE of some bar's GPU time; the rest draw as SMALL."""
    recorded = dict.fromkeys(p for _, s in bars for p in s.parts_ms)
    return [p for p in recorded
            if any(s.parts_ms.get(p, 0.0) >= SMALL_SHARE * max(sum(s.parts_ms.values()), 1e-9) for _, s in bars)]


HOST_PARTS = (("host work", "#555555", None), ("waiting on the GPU", "#BBBBBB", None),
              ("between steps (engine loop)", "#FFFFFF", ".."))


def _host_ms(s: StepAnatomy) -> list[float]:
    return [s.host_ms, s.gpu_wait_ms, s.between_steps_ms]


# A step traced where torch sees no CUDA device: its steps are host work alone, hundreds of times a
# GPU step's, so it is drawn in a figure of its own rather than on the GPU steps' axis.
NO_GPU = "cpu"


def _speakers(n: int) -> str:
    return f"{n} speaker{'' if n == 1 else 's'}"


def step_anatomy_figure(inputs: ReportInputs) -> list[Figure]:
    """One stacked bar per profiled engine: ms per step by part, then the idle time; under it, where
    the artifact has them, the engine thread's bar: host work, waiting on the GPU, between steps.
    The steps traced on GPUs and those traced on a CPU are two figures."""
    # the device in every label: one profile's folder can hold steps traced on different cards
    bars = [(f"{a.provenance.date} {s.device.removeprefix('NVIDIA ')}, {lv.vllm_mode or a.config.seam}, "
             f"{_speakers(lv.speakers)}, engine {engine}", s)
            for _, a, lv, engine, s in _profiled(inputs) if isinstance(s, StepAnatomy)]
    on_gpu = [b for b in bars if b[1].device != NO_GPU]
    on_cpu = [b for b in bars if b[1].device == NO_GPU]
    gpu_rows = [row for label, s in on_gpu for row in
                ([(f"{label}: GPU", s, "gpu")] + ([("engine thread", s, "host")] if s.host_ms is not None else []))]
    cpu_rows = [(f"{label}: engine thread", s, "host") for label, s in on_cpu if s.host_ms is not None]
    return ([_figure(gpu_rows, "step_anatomy", "GPU step anatomy")] if gpu_rows else []) + \
        ([_figure(cpu_rows, "step_anatomy_cpu", "Engine step anatomy without a GPU")] if cpu_rows else [])


def _figure(rows: list[tuple[str, StepAnatomy, str]], figure_name: str, title: str) -> Figure:
    """The figure of `rows` (label, anatomy, "gpu" or "host"): a GPU bar splits into parts, a host bar
    into the engine thread's time."""
    gpu_bars = [(label, s) for label, s, kind in rows if kind == "gpu"]

    def draw() -> Figure:
        from alignatt.report.capacity import OKABE_ITO

        drawn = _drawn_parts(gpu_bars)
        names = drawn + [SMALL, IDLE]
        colors = dict(zip(drawn, OKABE_ITO)) | {SMALL: "#999999"}
        fig, ax = new_figure(7.5, 1.7 + 0.5 * len(rows))
        labelled: set[str] = set()

        def segment(i: int, left: float, ms: float, name: str, color: str, hatch: str | None) -> float:
            ax.barh(i, ms, left=left, color=color, edgecolor="#000000" if hatch else "none", hatch=hatch,
                    linewidth=0.5, label=None if name in labelled else SHORT.get(name, name))
            labelled.add(name)
            return left + ms

        for i, (_, s, kind) in enumerate(rows):
            left = 0.0
            if kind == "host":
                for (name, color, hatch), ms in zip(HOST_PARTS, _host_ms(s)):
                    left = segment(i, left, ms, name, color, hatch)
                continue
            for part in names:
                if part == IDLE:
                    ms = s.idle_ms
                elif part == SMALL:
                    ms = sum(v for p, v in s.parts_ms.items() if p not in drawn)
                else:
                    ms = s.parts_ms.get(part, 0.0)
                left = segment(i, left, ms, part, "#FFFFFF" if part == IDLE else colors[part],
                               "//" if part == IDLE else None)
            if s.weight_read_floor_ms:
                ax.plot([s.weight_read_floor_ms] * 2, [i - 0.4, i + 0.4], color="#000000", linewidth=1.5,
                        label=None if "floor" in labelled else "weights read once at peak bandwidth")
                labelled.add("floor")
        ax.set_yticks(range(len(rows)), [label for label, _, _ in rows], fontsize=7)
        ax.invert_yaxis()
        ax.set_xlabel("ms per engine step", fontsize=8)
        ax.tick_params(labelsize=7)
        fig.legend(*ax.get_legend_handles_labels(), fontsize=7, loc="outside lower center", ncol=3, frameon=False)
        if not gpu_bars:  # the engine thread's bars alone
            caption = ("Where an engine step's time went where torch saw no GPU (torch profiler on the engine "
                       "process, `alignatt/serve/step_anatomy.py`): the engine thread's host work and the engine "
                       "loop's time between steps. A smoke of the tracing, not a GPU step.")
            return Figure(figure_name, "load", title, caption, svg_text(fig))
        caption = ("Where an engine step's time went at a profiled load level (torch profiler, CUDA kernels, "
                   "kernels sorted into parts by name, `alignatt/serve/step_anatomy.py`; parts under 5 % of the "
                   "GPU time drawn as one, each listed in the table; idle: the traced window's time that no "
                   "kernel or copy covers, between steps too), against the time the step's weights take to read "
                   "once at the device's peak bandwidth (the black tick); under a GPU bar, where recorded, the "
                   "engine thread's: host work, waiting on the GPU (CUDA synchronisation calls) and the engine "
                   "loop's time between steps.")
        return Figure(figure_name, "load", title, caption, svg_text(fig))

    return styled(draw)
