"""The Benchmarks page's capacity section: a table per load level and RTT p95 against speakers.

Rows and the figure come from the `load` artifacts (`alignatt load`, DVC stage `load`); the
figure draws one line per configuration (artifact: profile, seam, vLLM mode, prefix caching).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Optional

from alignatt.measure.load_configurations import LoadConfiguration, is_served_default
from alignatt.core.errors import AlignattError
from alignatt.report.figures import SERVED_COLOR, Figure, new_figure, styled, svg_text
from alignatt.report.inputs import ReportInputs


def _fmt(value: float | None, digits: int = 0) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def configuration(rel: str, artifact: Any, vllm_mode: str | None = None) -> str:
    """profile folder (and the file, unless it is the stage's load.json), seam, vLLM mode (the
    level's, in a run of several), prefix caching: two runs of one mode stay two lines."""
    c = artifact.config
    folder = rel.rsplit("/", 2)[-2] if "/" in rel else rel
    stem = rel.rsplit("/", 1)[-1].removesuffix(".json")
    folder += "" if stem == "load" else f" ({stem})"
    caching = (c.engine_of(vllm_mode)["seam_describe"] or {}).get("enable_prefix_caching")
    extra = "" if caching is None else (", prefix caching" if caching else ", no prefix caching")
    mode = vllm_mode or c.configurations_label
    profiled = ", under cProfile (slowed: where the time goes, not capacity)" if c.engine_profile_dir else ""
    # a `dvc exp run -S` other than the profile: the row is not what params.yaml asks for
    changed = {k: v for k, v in (artifact.provenance.params_changed or {}).items() if k != "profile"}
    deviated = "".join(f", run with `-S {k}={v}` (not params.yaml's)" for k, v in sorted(changed.items()))
    return f"{folder}: {c.seam}{f' {mode}' if mode else ''}{extra}{profiled}{deviated}"


def kernel_profiled(level: Any) -> str:
    """A level whose engines were kernel-profiled: its figures are not capacity (the engine stopped
    stepping while it wrote the trace out)."""
    if not level.step_anatomy:
        return ""
    return (", kernel-profiled (the engine stepped under the profiler, then stopped to write the trace: "
            "where a step's time goes, not capacity)")


def capacity_rows(inputs: ReportInputs) -> list[dict[str, Any]]:
    from alignatt.report.rows import machine_of

    rows = []
    for rel, a in sorted(inputs.of_kind("load"), key=lambda t: t[0]):
        for lv in a.levels:
            rows.append(dict(
                source=rel, date=a.provenance.date, machine=machine_of(a), model=a.config.model,
                synthetic=a.synthetic_weights,
                configuration=configuration(rel, a, lv.vllm_mode) + kernel_profiled(lv),
                streams=", ".join(dict.fromkeys(Path(s).stem for s in lv.streams)), speakers=lv.speakers,
                p50=_fmt(lv.partial_rtt_ms_p50), p95=_fmt(lv.partial_rtt_ms_p95), p99=_fmt(lv.partial_rtt_ms_p99),
                final_p95=_fmt(lv.final_rtt_ms_p95), lag=f"{lv.lag_s_max:.2f}",
                lag_grows=(f"stopped behind at {lv.stopped_at_stream_s:g} s" if lv.stopped_speakers
                           else "grows" if lv.lag_grows else "steady"), retractions=lv.retractions,
                finals=f"{lv.finals_delivered}/{lv.finals_expected}{'' if lv.finals_in_order else ' (order!)'}",
                errors=lv.error_frames, fast_path=lv.fast_path_events,
                batch_max=max((int(k) for k in lv.engine_batch_sizes), default=0),
                gpu_mib=_fmt(lv.peak_gpu_memory_mib), differing=_fmt(lv.texts_differing_from_alone),
                gpu_busy="—" if lv.gpu_busy_share is None else f"{lv.gpu_busy_share:.0%}",
                host_cpu="—" if lv.host_cpu_busy_share is None else
                f"{lv.host_cpu_busy_share:.0%} ({lv.host_cpu_steal_share:.1%})",
                server_loop="—" if lv.server_loop_cpu_share is None else
                f"{lv.server_loop_cpu_share:.1%} ({lv.server_process_cpu_cores:.2f})",
            ))
    return rows


def rtt_split_rows(inputs: ReportInputs) -> list[dict[str, Any]]:
    """Where a partial's round trip went, per load level that recorded it: inside the server (from
    reading the update to sending the reply), and of that, per draft, queued in its scheduler and in
    the engine; beside it, the server process's CPU by thread (one interpreter lock: near one core
    together, the server paces the level whatever the GPU could take)."""
    from alignatt.report.rows import machine_of

    rows = []
    for rel, a in sorted(inputs.of_kind("load"), key=lambda t: t[0]):
        for lv in a.levels:
            if lv.partial_server_ms_p50 is None:
                continue
            threads = lv.server_thread_cpu_cores or {}
            rows.append(dict(
                date=a.provenance.date, machine=machine_of(a), speakers=lv.speakers,
                configuration=configuration(rel, a, lv.vllm_mode) + kernel_profiled(lv),
                rtt=f"{_fmt(lv.partial_rtt_ms_p50)} / {_fmt(lv.partial_rtt_ms_p95)}",
                server=f"{_fmt(lv.partial_server_ms_p50)} / {_fmt(lv.partial_server_ms_p95)}",
                queued=_fmt(_mean_of_engines(lv, "draft_queued_ms_mean"), 1),
                in_engine=_fmt(_mean_of_engines(lv, "draft_in_engine_ms_mean"), 1),
                process=("—" if lv.server_process_cpu_cores is None else f"{lv.server_process_cpu_cores:.2f}")
                + (f"; other front ends {', '.join(_fmt(c, 2) for c in lv.front_end_cpu_cores)}"
                   if lv.front_end_cpu_cores else ""),
                threads=", ".join(f"{name} {cores:.2f}" for name, cores in list(threads.items())[:4]) or "—",
            ))
    return rows


def _mean_of_engines(lv: Any, key: str) -> float | None:
    values = [getattr(e, key) for e in lv.engines if getattr(e, key) is not None]
    return sum(values) / len(values) if values else None


def _buffers(lv: Any) -> str:
    """The shown buffers that differ, and the mean words shown against the first configuration's."""
    if lv.buffers_differing_from_first_configuration is None:
        return ""
    return (f"; {lv.buffers_differing_from_first_configuration} buffers (mean {_fmt(lv.buffer_words_mean, 1)} "
            f"words against {_fmt(lv.first_configuration_buffer_words_mean, 1)})")


def verification_rows(inputs: ReportInputs) -> list[dict[str, Any]]:
    """Verified re-drafts against plain ones, per level of every load run that counted them: what
    the engine did per draft, what a step cost (and how much of it was the engine thread's CPU),
    and, for one speaker alone, how many updates a later configuration served differently."""
    rows = []
    for rel, a in sorted(inputs.of_kind("load"), key=lambda t: t[0]):
        for lv in a.levels:
            v = lv.verification
            if v is None:
                continue
            step, cpu = _mean_of_engines(lv, "step_ms_mean"), _mean_of_engines(lv, "step_cpu_ms_mean")
            compared = lv.updates_compared_with_first_configuration
            rows.append(dict(
                date=a.provenance.date, configuration=configuration(rel, a, lv.vllm_mode),
                synthetic=a.synthetic_weights, model=a.config.model, speakers=lv.speakers, drafts=v.drafts,
                acceptance="—" if v.acceptance_rate is None else f"{v.acceptance_rate:.0%} of {v.proposed}",
                decoded=_fmt(v.decoded_tokens_per_update, 1), forwards=_fmt(v.forward_steps_per_draft, 1),
                verify_ms=_fmt(v.verify_ms_mean, 1), extend_ms=_fmt(v.extend_ms_mean, 1),
                steps=lv.engine_steps, step_ms=_fmt(step, 1),
                cpu_share="—" if not step or cpu is None else f"{cpu / step:.0%}",
                p50=_fmt(lv.partial_rtt_ms_p50), p95=_fmt(lv.partial_rtt_ms_p95),
                differs="—" if compared is None else (f"{lv.texts_differing_from_first_configuration} texts, "
                                                      f"{lv.decisions_differing_from_first_configuration} decisions "
                                                      f"of {compared}" + _buffers(lv)),
            ))
    return rows


def verify_equality_rows(inputs: ReportInputs) -> list[dict[str, Any]]:
    """Per load run and verify configuration: the bench prompts verified against drafted from scratch."""
    rows = []
    for rel, a in sorted(inputs.of_kind("load"), key=lambda t: t[0]):
        for e in a.verify_equality:
            rows.append(dict(date=a.provenance.date, configuration=configuration(rel, a, e.vllm_mode),
                             synthetic=a.synthetic_weights, prompts=e.prompts, tokens=e.tokens_differ,
                             texts=e.texts_differ, decisions=e.decisions_differ,
                             accepted=f"{e.accepted} of {e.proposed}",
                             rows="—" if e.row_max_abs_diff is None else f"{e.row_max_abs_diff:.2g}"))
    return rows


def verify_equality_notes(inputs: ReportInputs) -> list[str]:
    """A load run whose bench-prompt count failed for a configuration: where, and why."""
    return [f"`{rel}`: {a.verify_equality_note}" for rel, a in sorted(inputs.of_kind("load"), key=lambda t: t[0])
            if a.verify_equality_note]


def configuration_failure_notes(inputs: ReportInputs) -> list[str]:
    """A load run with a configuration that did not run to its end: where, which, and why."""
    return [f"`{rel}`: {'; '.join(a.configurations_failed)}"
            for rel, a in sorted(inputs.of_kind("load"), key=lambda t: t[0]) if a.configurations_failed]


# A capacity target's bounds (params.yaml report.capacity_targets): the level's field, its label, unit, digits.
TARGET_BOUNDS = {"rtt_p50_ms": ("partial_rtt_ms_p50", "RTT p50", "ms", 0),
                 "rtt_p95_ms": ("partial_rtt_ms_p95", "RTT p95", "ms", 0),
                 "lag_max_s": ("lag_s_max", "lag max", "s", 2)}


def _judge(lv: Any, target: dict[str, Any]) -> tuple[bool, list[str]]:
    """Whether one level meets one target, and what was measured against each bound."""
    said, ok = [], True
    for key, (field, label, unit, digits) in TARGET_BOUNDS.items():
        if key in target:
            got = getattr(lv, field)
            ok = ok and got is not None and got <= target[key]
            said.append(f"{label} {_fmt(got, digits)} {unit} (≤ {target[key]} {unit})")
    if target.get("lag_steady"):
        ok = ok and not lv.lag_grows
        said.append("lag grows" if lv.lag_grows else "lag steady")
    if lv.stopped_speakers:  # it fell so far behind that its speakers stopped: no bound can hold
        ok = False
        said.append(f"{lv.stopped_speakers} speakers stopped behind")
    clean = lv.retractions == 0 and lv.finals_in_order and lv.finals_delivered == lv.finals_expected
    ok = ok and clean
    said.append(f"{lv.retractions} retractions, finals {lv.finals_delivered}/{lv.finals_expected}"
                f"{'' if lv.finals_in_order else ' out of order'}")
    return ok, said


def streams_of(a: Any) -> list[str]:
    return list(dict.fromkeys(Path(s).stem for lv in a.levels for s in lv.streams))


def _same_run(a: Any, b: Any, any_stream: bool) -> bool:
    """`b` is the stage's command run again beside `a` with another `--out`: same commit, card, model
    and (unless `any_stream`) streams: a device session too short for every level in one run splits them."""
    from alignatt.report.rows import machine_of

    return (a.provenance.git_commit is not None and b.provenance.git_commit == a.provenance.git_commit
            and machine_of(b) == machine_of(a) and b.config.model == a.config.model
            and (any_stream or streams_of(b) == streams_of(a)))


def _siblings(inputs: Optional[ReportInputs], rel: str, a: Any, any_stream: bool = False) -> list[tuple[str, Any]]:
    return [] if inputs is None else [
        (r, b) for r, b in sorted(inputs.of_kind("load"), key=lambda t: t[0])
        if r != rel and r.rsplit("/", 1)[0] == rel.rsplit("/", 1)[0] and _same_run(a, b, any_stream)]


def stage_levels(inputs: ReportInputs, rel: str, a: Any) -> list[Any]:
    """`a`'s levels, and those its sibling runs (`_same_run`) measured of `a`'s configurations at
    speaker counts `a` did not run."""
    levels, modes = list(a.levels), {lv.vllm_mode for lv in a.levels}
    seen = {(lv.vllm_mode, lv.speakers) for lv in levels}
    for _, b in _siblings(inputs, rel, a):
        for lv in b.levels:
            if lv.vllm_mode in modes and (lv.vllm_mode, lv.speakers) not in seen:
                levels.append(lv)
                seen.add((lv.vllm_mode, lv.speakers))
    return levels


def target_level(inputs: Optional[ReportInputs], rel: str, a: Any, mode: Optional[str],
                 speakers: int, any_stream: bool = False) -> tuple[Any, str]:
    """The level of `a` (the load stage's artifact at `rel`) that ran `mode` at `speakers`, and where it
    is; where `a` did not run it, the one a sibling run in the same folder did (`_same_run`)."""
    for where, b in [(rel, a), *_siblings(inputs, rel, a, any_stream)]:
        level = next((lv for lv in b.levels if lv.vllm_mode == mode and lv.speakers == speakers), None)
        if level is not None:
            return level, where
    return None, rel


def judge_target(a: Any, mode: Optional[str], target: dict[str, Any], inputs: Optional[ReportInputs] = None,
                 rel: str = "") -> tuple[Optional[bool], list[str]]:
    """One target judged on the level that ran `mode` at the target's speakers (`target_level`): met
    (True), missed (False) or not measured (None), with what was measured against each bound, and
    the sibling file it came from when not `rel`."""
    level, where = target_level(inputs, rel, a, mode, target["speakers"])
    if level is None:
        return None, ["not measured"]
    ok, said = _judge(level, target)
    return ok, ([f"in `{where}`"] if where != rel else []) + said


def capacity_targets(inputs: ReportInputs) -> list[dict[str, Any]]:
    """params.yaml's `report.capacity_targets`, judged on each profile's `load` stage artifact
    (`<profile>/load.json`), per configuration: met, missed, or (the run's first configuration) not measured."""
    targets = (inputs.params.get("report") or {}).get("capacity_targets") or []
    for target in targets:  # a misspelt bound would otherwise be judged met without being checked
        unknown = set(target) - set(TARGET_BOUNDS) - {"speakers", "lag_steady"}
        if unknown or "speakers" not in target:
            raise AlignattError(f"report.capacity_targets entry {target}: needs speakers; known bounds are "
                                f"{', '.join(TARGET_BOUNDS)} and lag_steady" + (f", not {sorted(unknown)}" if unknown else ""))
    rows = []
    for rel, a in sorted(inputs.of_kind("load"), key=lambda t: t[0]):
        if not rel.endswith("/load.json") or not a.config.seam.startswith("vllm"):
            continue
        modes = list(dict.fromkeys(lv.vllm_mode for lv in a.levels))
        for target in targets:
            for mode in modes:
                ok, said = judge_target(a, mode, target, inputs, rel)
                if ok is None and mode != modes[0]:  # a later configuration, run at fewer levels (compared_speakers)
                    continue
                served = is_served_default(mode, a.config.seam, a.config.device)
                rows.append(dict(date=a.provenance.date, configuration=configuration(rel, a, mode), served=served,
                                 speakers=target["speakers"], verdict={True: "met", False: "missed", None: "—"}[ok],
                                 measured="; ".join(said)))
    return rows


def capture_cost_rows(inputs: ReportInputs) -> list[dict[str, Any]]:
    rows = []
    for rel, a in sorted(inputs.of_kind("load"), key=lambda t: t[0]):
        for c in a.capture_cost:
            rows.append(dict(source=rel, date=a.provenance.date, vllm_mode=c.vllm_mode or "—", batch=c.batch, captured=f"{c.captured_ms:.1f}",
                             uncaptured=f"{c.uncaptured_ms:.1f}", ratio=f"{c.ratio:.2f}×"))
    return rows


# Words for a recorded configuration (seam, vLLM mode, what it sets): the figure's labels say what ran.
SEAM_WORDS = {"hf_eager": "HF eager attention", "hf_qk_fast": "HF sdpa, rows rebuilt from q/k",
              "vllm_capture": "vLLM capture"}
MODE_WORDS = {"eager": "eager", "cudagraph": "piecewise CUDA graphs", "fullgraph": "full CUDA graphs",
              "compiled": "torch.compile, full CUDA graphs"}


def _setting_words(c: LoadConfiguration) -> list[str]:
    """What a configuration sets, in words, in its label's order."""
    return ([MODE_WORDS.get(c.vllm_mode, c.vllm_mode)] if c.vllm_mode else []) + \
        ([f"settled {c.settle_buffer_tokens} tokens after a hold"] if c.settle_buffer_tokens is not None else []) + \
        (["own engine process"] if c.own_process else []) + \
        ([f"{c.engines} engine processes"] if c.engines is not None else []) + \
        (["verified re-drafts"] if c.verify else []) + (["batch-invariant kernels"] if c.batch_invariant else []) + \
        ([f"{c.quantization.upper()} weights"] if c.quantization else []) + \
        ([f"rows read every {c.settle_every} tokens while settling"] if c.settle_every is not None else []) + \
        (["chunked history"] if c.chunked_history else [])


def configuration_words(artifact: Any, vllm_mode: str | None = None) -> str:
    """A load run's configuration in words, from its recorded config (seam, the configuration its
    label names, prefix caching)."""
    c = artifact.config
    parts = [SEAM_WORDS.get(c.seam, c.seam)] + _setting_words(
        LoadConfiguration.from_label(vllm_mode or c.configurations_label))
    caching = (c.engine_of(vllm_mode)["seam_describe"] or {}).get("enable_prefix_caching")
    if caching is not None:
        parts.append("prefix caching" if caching else "no prefix caching")
    return ", ".join(parts)


# Okabe & Ito's colour-blind-safe palette; black is kept for the served default.
OKABE_ITO = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#F0E442")
MAX_SERIES = 6  # per panel; the capacity table has every level of every run
RTT_PANELS = (("partial_rtt_ms_p50", "rtt_p50_ms", "RTT p50"), ("partial_rtt_ms_p95", "rtt_p95_ms", "RTT p95"))


def prefix_cache_rows(inputs: ReportInputs) -> list[dict[str, Any]]:
    """vLLM's prefix cache over each configuration's whole run, in each profile's `load` stage run and
    in the kernel-profiled runs: the prompt tokens it served, and per draft those it did not, by where
    they sit in the prompt (`core/prompt.py:uncached_by_region`; — where the artifact predates it)."""
    from alignatt.core.prompt import PROMPT_REGIONS

    rows = []
    for rel, a in sorted(inputs.of_kind("load"), key=lambda t: t[0]):
        if not (rel.endswith("/load.json") or any(lv.step_anatomy for lv in a.levels)):
            continue
        for mode in dict.fromkeys(lv.vllm_mode for lv in a.levels):
            d = a.config.engine_of(mode).get("seam_describe") or {}
            total, cached = d.get("prompt_tokens"), d.get("cached_prompt_tokens")
            if not total or cached is None:
                continue
            drafts, regions = d.get("prompt_drafts"), d.get("uncached_prompt_tokens") or {}
            per = (lambda n: f"{n / drafts:.1f}") if drafts else (lambda n: "—")  # noqa: E731
            kv = d.get("kv_cache_tokens")  # per KV-cache group: the smallest bounds what stays cached
            rows.append(dict(date=a.provenance.date, configuration=configuration(rel, a, mode),
                             kv_tokens=f"{min(kv.values()):,}" if kv else "—",
                             drafts=drafts or "—", prompt=per(total), served=f"{cached / total:.1%}",
                             computed=per(total - cached),
                             regions=" / ".join(per(regions[r]) for r in PROMPT_REGIONS) if regions else "—"))
    return rows


def _stage_runs(inputs: ReportInputs) -> list[tuple[str, Any]]:
    """Each profile's `load` stage artifact (`<profile>/load.json`): the runs the figure draws."""
    return [(rel, a) for rel, a in sorted(inputs.of_kind("load"), key=lambda t: t[0]) if rel.endswith("/load.json")]


def solid_pieces(levels: Sequence[int], target_levels: set[int]) -> list[tuple[int, int]]:
    """Index ranges (first, last) of consecutive measured `levels` (ascending) with no target level
    between two neighbours: a line drawn across an unmeasured target level would show a value there
    that nobody measured."""
    pieces, first = [], 0
    for i in range(1, len(levels) + 1):
        if i == len(levels) or any(levels[i - 1] < t < levels[i] for t in target_levels):
            if i - 1 > first:
                pieces.append((first, i - 1))
            first = i
    return pieces


def rtt_against_speakers(inputs: ReportInputs) -> list[Figure]:
    """Per profile's `load` stage run (with its sibling runs' levels, `stage_levels`): RTT p50 and p95
    against speakers, one line per configuration, the served default in black and each target of the
    panel's bound marked. Other load runs (exploratory, historical) are in the capacity table, not here."""
    from alignatt.report.rows import machine_of

    targets = (inputs.params.get("report") or {}).get("capacity_targets") or []
    runs = []
    for rel, a in _stage_runs(inputs):
        series: dict[str, dict] = {}
        for lv in stage_levels(inputs, rel, a):
            key = lv.vllm_mode or ""
            s = series.setdefault(key, dict(label=configuration_words(a, lv.vllm_mode),
                                            served=is_served_default(lv.vllm_mode, a.config.seam, a.config.device),
                                            points=[]))
            s["points"].append(lv)
        if not series:
            continue
        ordered = sorted(series.values(), key=lambda s: (not s["served"], s["label"]))[:MAX_SERIES]
        vllm = a.config.seam.startswith("vllm")
        streams = ", ".join(streams_of(a))
        model = f"{a.config.model}{' (synthetic weights)' if a.synthetic_weights else ''}"
        runs.append(dict(rel=rel, series=ordered, targets=targets if vllm else [],
                         title=f"{machine_of(a)}: {model}, {streams} stream, {a.provenance.date}"))
    if not runs:
        return []
    runs.sort(key=lambda r: not r["targets"])  # the runs the targets judge first

    def draw() -> Figure:
        from matplotlib.lines import Line2D
        from matplotlib.ticker import FuncFormatter

        fig, _ = new_figure(7.5, 3.6 * len(runs))
        fig.clear()
        # per run: two panels, and under them a row that holds the legend (outside the data)
        spec = fig.add_gridspec(2 * len(runs), 2, height_ratios=[3.0, 0.55] * len(runs))
        for i, run in enumerate(runs):
            row, keys = [fig.add_subplot(spec[2 * i, 0]), fig.add_subplot(spec[2 * i, 1])], []
            for ax, (field, bound, name) in zip(row, RTT_PANELS):
                ax.set_yscale("log")  # before anything is drawn: the limits then autoscale in log space
                colors = iter(OKABE_ITO)
                for s in run["series"]:
                    pts = sorted((lv.speakers, getattr(lv, field)) for lv in s["points"] if getattr(lv, field) is not None)
                    if not pts:
                        continue
                    xs, ys = zip(*pts)
                    label = ("served default: " if s["served"] else "") + s["label"]
                    style = dict(color=SERVED_COLOR, linewidth=2.2, zorder=3) if s["served"] else dict(
                        color=next(colors), linewidth=1.2)
                    if ax is row[0]:  # the legend's key: the solid line, whatever this series draws dotted
                        keys.append(Line2D([], [], marker="o", markersize=4, label=label, **style))
                    ax.plot(xs, ys, marker="o", markersize=4, linestyle=":", **style)
                    for first, last in solid_pieces(xs, {t["speakers"] for t in run["targets"]}):
                        ax.plot(xs[first:last + 1], ys[first:last + 1], **style)
                marked = [t for t in run["targets"] if bound in t]
                ticks = sorted({lv.speakers for s in run["series"] for lv in s["points"]}
                               | {t["speakers"] for t in marked})
                for t in marked:
                    ax.plot([t["speakers"]], [t[bound]], marker="v", markersize=9, color="#D55E00",
                            linestyle="none", zorder=4)
                for value in dict.fromkeys(t[bound] for t in marked):  # one label per bound, at its first marker
                    first = min(t["speakers"] for t in marked if t[bound] == value)
                    right = first == ticks[0]  # the label beside the marker, inside the panel
                    ax.annotate(f"target ≤ {value} ms", (first, value), textcoords="offset points",
                                xytext=(6 if right else -6, 5), ha="left" if right else "right", va="bottom",
                                fontsize=7, color="#D55E00")
                low, high = ax.get_ylim()
                ax.set_ylim(low / 1.15, high * 1.3)  # room for a target's label above the highest point
                # levels spread over a wide range (1 .. 256) read best on a linear axis; a few small ones on log2
                if ticks[-1] / ticks[0] <= 16:
                    ax.set_xscale("log", base=2)
                ax.set_xticks(ticks, [str(n) for n in ticks])
                ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
                ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: f"{v:g}" if str(v)[0] in "236" else ""))
                ax.set_xlabel("concurrent real-time speakers", fontsize=8)
                ax.set_ylabel(f"partial-draft {name} (ms)", fontsize=8)
                ax.tick_params(which="both", labelsize=7)
                ax.grid(True, linewidth=0.3)
            row[0].set_title(run["title"], fontsize=8, loc="left")
            key = fig.add_subplot(spec[2 * i + 1, :])
            key.axis("off")
            key.legend(handles=keys, fontsize=7, loc="upper left", frameon=False)
        caption = ("Partial-draft round trip (client side), p50 and p95, against concurrent real-time speakers: "
                   "one row per profile's `load` stage run, one line per configuration, the served default in "
                   "black, each capacity target (`report.capacity_targets`) a ▼ at its speakers and bound. "
                   "A dotted line joins two levels with a target's level between them that was not measured: "
                   "read nothing off it. "
                   "Exploratory and earlier load runs are in the capacity table, not drawn.")
        return Figure("capacity_rtt_p95", "load", "Capacity: RTT against speakers", caption, svg_text(fig))

    return [styled(draw)]
