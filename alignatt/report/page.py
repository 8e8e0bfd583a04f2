"""`alignatt report`: render reports/BENCHMARKS.md from params.yaml and the artifacts.

Everything in the document comes from files: the methodology from params.yaml and the artifacts'
configs, one results row per measurement (historical rows from `outputs/published/`, ours from
`outputs/<profile>/`), notes computed from the rows. Rendering is byte-stable (no render-time
clock, sorted inputs, fixed number formats), so `alignatt report --check` can tell whether the
committed document is stale. Which artifacts make a results row: `alignatt.report.rows`;
the figures (SVG, `reports/figures/`) come from `alignatt.report.figures` and are checked the
same way.
"""

from __future__ import annotations

import re
import statistics
from pathlib import Path
from typing import Any

from alignatt.core.errors import AlignattError
from alignatt.record.artifacts import BENCH_FILE, measured_on_gpu
from alignatt.report import capacity, figures as bench_figures, speech, step_anatomy
from alignatt.measure.load_configurations import LoadConfiguration, served_default_label
from alignatt.report.capacity import (capacity_rows, capacity_targets, capture_cost_rows, prefix_cache_rows,
                                      rtt_split_rows, verification_rows, verify_equality_notes, verify_equality_rows,
                                      configuration_failure_notes)
from alignatt.report.figures import FIGURES_DIR, Figure, FigureFunction, render_figures
from alignatt.report.inputs import ReportInputs, collect_inputs, relative
from alignatt.report.measurements import eager_comparisons, measurement_items
from alignatt.report.rows import ResultRow, load_note, machine_of
from alignatt.report.artifact_table import artifact_list
from alignatt.report.headline import headline
from alignatt.report.served import served_criterion
from alignatt.replay.events import normalized_erasure, shown_buffer_units_mean

TEMPLATE = "BENCHMARKS.md.j2"
# Every figure on the page, in page order: a new figure is one function here.
FIGURES: tuple[FigureFunction, ...] = (bench_figures.latency_by_prompt_length, bench_figures.headline_ratio_history,
                                       capacity.rtt_against_speakers, step_anatomy.step_anatomy_figure,
                                       speech.speech_timeline)


# ---- view model for the template -------------------------------------------------------------


def ms(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}"


def ratio(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}×"


def drafts_setting(a) -> str:
    """Whole or settled drafts, as the smoke's server ran them (artifacts before the field: whole,
    the only setting the server had then)."""
    n = a.config.settle_buffer_tokens
    return "whole drafts" if n is None else f"settled, {n} tokens past the first held"


def shown_text_flicker(a) -> tuple[float | None, float | None]:
    """The headline client's shown buffer (mean words per partial) and Normalized Erasure: from its
    summary, else from its recorded events (artifacts before the summary kept them)."""
    s = a.config.summaries[0] if a.config.summaries else None
    if s is not None and s.normalized_erasure is not None:
        return s.shown_buffer_words_mean, s.normalized_erasure
    events = [e for e in a.events if e.client == a.config.headline_client]
    return shown_buffer_units_mean(events), normalized_erasure(events)


def flicker_notes(inputs: ReportInputs, rows: list[dict[str, Any]]) -> list[str]:
    """Per model and machine: whole against settled drafts where both were replayed, else which
    setting the flicker figure is for (and the buffer lengths a capacity run compared, if any)."""
    notes = []
    measured = [r for r in rows if r["erasure"] != "—"]
    for key in sorted({(r["model_id"], r["machine"]) for r in measured}):
        got = {r["setting"]: r for r in measured if (r["model_id"], r["machine"]) == key}
        if len(got) > 1:
            notes.append(f"{key[0]} on {key[1]}: " + "; ".join(
                f"{k}: shown buffer {r['buffer_words']} words, normalized erasure {r['erasure']}"
                for k, r in sorted(got.items())))
            continue
        (setting, _), = got.items()
        other = "settled" if setting == "whole drafts" else "whole"
        note = (f"{key[0]} on {key[1]}: {setting} only; {other} drafts were not replayed in a smoke there, "
                "so their flicker was not measured")
        for rel, a in sorted(inputs.of_kind("load"), key=lambda t: t[0]):
            if (a.config.model, machine_of(a)) != key:
                continue
            first = (a.config.vllm_modes or [None])[0]
            for lv in a.levels:
                if lv.speakers == 1 and lv.buffer_words_mean is not None:
                    note += (f" (`{rel}` served one speaker as `{first}` and as `{lv.vllm_mode}`: buffers of "
                             f"{lv.first_configuration_buffer_words_mean:.1f} and {lv.buffer_words_mean:.1f} words "
                             "on average over every reply, finals included; a load artifact keeps no per-update "
                             "text, so no erasure)")
        notes.append(note)
    return notes


def smoke_rows(inputs: ReportInputs) -> list[dict[str, Any]]:
    rows = []
    for rel, a in inputs.published:
        if a.kind != "server_smoke" or a.smoke is None:
            continue
        s, events = a.smoke.summary, a.smoke.events
        fastest = min(events, key=lambda e: float("inf") if e.rtt_ms is None else e.rtt_ms) if events else None
        note = f"{s.fast_path_events} fast-path events recorded"
        if fastest is not None and s.fast_path_events == 0:
            note = (f"fast_path_events: {s.fast_path_events}: its fastest update "
                    f"({fastest.rtt_ms} ms) is event {events.index(fastest)}, with "
                    f"{fastest.committed_words} committed and {fastest.tail_words} tail "
                    "words, i.e. the first, empty-source update, not a measured commit release")
        note += "; RTT p50 is the published commit_rtt_ms_median"
        rows.append(dict(date=a.date or "unknown", machine=a.gpu or "not recorded", model="not recorded",
                         seam="vllm (published)", updates=s.events, finals=s.finals,
                         retractions=s.retractions, p50=ms(s.commit_rtt_ms_median), p95=ms(s.rtt_ms_p95),
                         fast_events=s.fast_path_events, fast_p50="—", fast_calls="—", source=rel,
                         setting="not recorded", buffer_words="—", erasure="—", model_id=None, note=note))
    for rel, a in inputs.smokes:
        latencies = [e.latency_ms for e in a.fast_path_events]
        synthetic = a.provenance.synthetic_weights
        buffer_words, erasure = shown_text_flicker(a)
        rows.append(dict(
            date=a.provenance.date, machine=machine_of(a),
            model=a.config.model + (" (synthetic weights)" if synthetic else ""),
            seam=a.config.seam + (f" ({mode})" if (mode := a.config.seam_options.get("vllm_mode")) else ""),
            updates=a.updates, finals=a.finals,
            retractions=a.retractions, p50=ms(a.rtt_ms_p50), p95=ms(a.rtt_ms_p95),
            fast_events=f"{len(a.fast_path_events)} ({sum(bool(e.released_text) for e in a.fast_path_events)})",
            fast_p50=ms(statistics.median(latencies) if latencies else None),
            fast_calls=str(sum(e.engine_calls for e in a.fast_path_events)), source=rel,
            setting=drafts_setting(a), buffer_words="—" if buffer_words is None else f"{buffer_words:.2f}",
            erasure="—" if erasure is None else f"{erasure:.2f}", model_id=a.config.model,
            note="; ".join(["fast-path releases measured server-side" if a.fast_path_events
                            else "no commit-only updates released held text", *speech_note(a), *load_note(a)]),
        ))
    return sorted(rows, key=lambda r: (r["date"], r["source"]))


def speech_note(a) -> list[str]:
    """A smoke of a recognised stream: what the recogniser showed and what a viewer waited."""
    speech = a.config.speech  # the recognised stream's figures (replay/stream.py keeps them as a dict)
    if not speech:
        return []
    wer = speech.get("wer_committed")
    return [f"real speech: {a.config.stream}, recognised live by faster-whisper {speech.get('asr_model')} "
            f"under LocalAgreement (real-time factor {speech.get('real_time_factor')}; committed WER "
            + (f"{wer * 100:.1f} %" if wer is not None else "not measured: no transcript")
            + f"; its tail revised in {(speech.get('tail_revisions') or {}).get('revised_share', 0) * 100:.0f} % of "
            f"the steps that showed one); caption delay, a word's audio end to the committed translation that "
            f"covers it: p50 {speech.get('caption_delay_s_p50')} s, p95 {speech.get('caption_delay_s_p95')} s "
            f"over {speech.get('caption_words')} words; quality is not scored (no reference translation)"]


def graph_exactness(inputs: ReportInputs) -> dict[str, dict[str, Any]]:
    """Per graphed vLLM mode, its latest bit-for-bit check against eager (check-vllm exact and
    exact_fullgraph): when, where, how many of the drafts were bit-identical, and the check itself
    (what `served_criterion` judges)."""
    latest: dict[str, dict[str, Any]] = {}
    for rel, a in inputs.measurements:
        for name, raw in ((a.results or {}).get("checks") or {}).items():
            if not (name.startswith("exact") and isinstance(raw, dict)):
                continue
            for mode, cmp in eager_comparisons(raw):
                entry = dict(path=rel, date=a.provenance.date or "", identical=cmp["bit_identical_rows"],
                             rows=cmp["rows"], passed=bool(raw.get("passed")), check=raw)
                if mode not in latest or entry["date"] >= latest[mode]["date"]:
                    latest[mode] = entry
    return latest


def load_independence(inputs: ReportInputs) -> dict[str, Any] | None:
    """The latest load run with a `+batch_invariant` configuration beside its plain mode: at its
    largest common speaker count, how many updates differed from the stream served alone in each,
    and the one-speaker p50 of each (the configuration note's load-independence line)."""
    found = None
    for rel, a in sorted(inputs.of_kind("load"), key=lambda t: (t[1].provenance.date or "", t[0])):
        by = {(lv.vllm_mode, lv.speakers): lv for lv in a.levels}
        for label in {lv.vllm_mode for lv in a.levels if LoadConfiguration.from_label(lv.vllm_mode).batch_invariant}:
            plain = LoadConfiguration.from_label(label).model_copy(update={"batch_invariant": False}).label()
            common = sorted(n for (m, n) in by if m == label and (plain, n) in by and n > 1)
            if not common or (label, 1) not in by or (plain, 1) not in by:
                continue
            n = common[-1]
            found = dict(path=rel, date=a.provenance.date, label=label, mode=plain, speakers=n,
                         differing=by[(label, n)].texts_differing_from_alone,
                         differing_plain=by[(plain, n)].texts_differing_from_alone,
                         p50=by[(label, 1)].partial_rtt_ms_p50, p50_plain=by[(plain, 1)].partial_rtt_ms_p50)
    return found


def _recorded(values: list[Any]) -> str:
    """One recorded setting across the bench runs: its value, or each value when the runs differ."""
    distinct = list(dict.fromkeys(str(v) for v in values))
    return " / ".join(distinct) if distinct else "not recorded"


def methodology(inputs: ReportInputs) -> dict[str, Any]:
    """How the bench stages measured, from what their artifacts recorded (each profile folder's
    `bench_<mode>.json` and its BenchConfig), not from today's params.yaml; only a profile's note,
    prose about the profile, comes from params.yaml."""
    from alignatt.capture.names import VLLM_MODES
    from alignatt.measure.bench import load_prompts

    runs = [a for _, modes in sorted(inputs.runs.items()) for rel, a in modes.values()
            if a.config.profile is not None and BENCH_FILE.match(rel.rsplit("/", 1)[-1])]
    configs = [a.config for a in runs]
    prompts_files = list(dict.fromkeys(c.prompts_file for c in configs)) or [None]
    prompts = load_prompts(prompts_files[0])  # the recorded file (None: the packaged prompts)
    bins: dict[str, int] = {}
    for p in prompts:
        bins[p.length_bin] = bins.get(p.length_bin, 0) + 1
    modes: dict[str, list[str]] = {}
    for mode in VLLM_MODES:
        for c in configs:
            if c.vllm_mode == mode:
                modes.setdefault(mode, [])
                modes[mode] += [s for s in c.seams if s not in modes[mode]]
    notes = {name: (prof or {}).get("note", "") for name, prof in (inputs.params.get("profiles") or {}).items()}
    profiles = []
    for name in sorted({c.profile for c in configs}):
        mine = [c for c in configs if c.profile == name]
        profiles.append(dict(name=name, model=_recorded([c.model for c in mine]),
                             device=_recorded([c.device for c in mine]),
                             dtype=_recorded([c.dtype or "default" for c in mine]),
                             warmup=_recorded([c.warmup for c in mine]), repeats=_recorded([c.repeats for c in mine]),
                             rows=_recorded([c.repeats * len(prompts) for c in mine]), note=notes.get(name, "")))
    return dict(
        prompts=len(prompts), bins=", ".join(f"{n} {b}" for b, n in bins.items()),
        with_prefix=sum(p.assistant_prefill != "" for p in prompts),
        prompts_file=" / ".join(f or "alignatt/data/mt_capture_prompts.json" for f in prompts_files),
        max_new_tokens=_recorded([c.max_new_tokens for c in configs]),
        heads_k=_recorded([c.heads_k for c in configs]), warmup=_recorded([c.warmup for c in configs]),
        policy=_recorded([c.policy or "defaults" for c in configs]), modes=modes, profiles=profiles,
    )


def cross_day_note(rows: list[ResultRow]) -> str | None:
    """How far the same seam moved between published days (same protocol, same tool)."""
    by_date = {}
    for r in rows:
        if r.historical and r.hf_eager is not None:
            by_date.setdefault(r.date, r.hf_eager)
    if len(by_date) < 2:
        return None
    (d1, lo), (d2, hi) = min(by_date.items(), key=lambda t: t[1]), max(by_date.items(), key=lambda t: t[1])
    return (f"HF eager alone, same prompts and tool, measured {ms(lo)} ms/token on {d1} and "
            f"{ms(hi)} on {d2} ({(hi / lo - 1) * 100:.0f}% apart)")


def eval_sections(inputs: ReportInputs) -> list[dict[str, Any]]:
    from alignatt.evaluate.outputs import report_section

    return report_section(inputs.root, inputs.of_kind("eval"))


def figure_items(figures: list[Figure]) -> dict[str, list[dict[str, str]]]:
    """Figures for the template, by the artifact kind they are drawn from."""
    out: dict[str, list[dict[str, str]]] = {}
    for f in figures:
        out.setdefault(f.kind, []).append(dict(name=f.name, path=f.path, title=f.title, caption=f.caption))
    return out


def _gpu_figures_beside(inputs: ReportInputs, suite_rel: str, commit: str) -> tuple[list[str], list[str]]:
    """The GPU artifacts in a suite's folder: those measured at the suite's commit (they stand on it)
    and the others, each with the commit it was measured at (the audit flags those)."""
    folder = suite_rel.rsplit("/", 1)[0]
    standing, other = [], []
    for _, entries in sorted(inputs.by_kind.items()):
        for rel, a in entries:
            if rel.rsplit("/", 1)[0] != folder or not measured_on_gpu(a):
                continue
            name = rel.rsplit("/", 1)[1]
            at = a.provenance.git_commit or ""
            if at == commit:
                standing.append(name)
            else:
                other.append(f"{name} ({at[:7] or 'no commit'}, {a.provenance.date})")
    return sorted(standing), sorted(other)


def gpu_suites(inputs: ReportInputs) -> list[dict[str, Any]]:
    """Each folder's GPU suite that ran: the commit it passed (or failed) at, its date, its skips,
    and which of the folder's GPU figures were measured at that commit."""
    items = []
    for rel, a in inputs.of_kind("gpu_tests"):
        if not a.ran:
            continue
        standing, other = _gpu_figures_beside(inputs, rel, a.provenance.git_commit or "") if a.passed else ([], [])
        items.append(dict(
            path=rel, machine=machine_of(a), date=a.provenance.date, time=a.provenance.timestamp_utc,
            commit=(a.provenance.git_commit or "unknown")[:12], passed=a.passed, counts=a.counts,
            wall_s=round(a.wall_s), reason=a.reason, lanes=a.lanes,
            skipped=[(t.nodeid, t.message) for t in a.tests if t.outcome == "skipped"],
            failed=[(t.nodeid, t.message) for t in a.tests if t.outcome in ("failed", "error")],
            standing=standing, other=other,
        ))
    return items


def build_context(inputs: ReportInputs, figures: list[Figure] | None = None) -> dict[str, Any]:
    params = inputs.params
    rows = inputs.rows()
    refs = iter(range(1, len(rows) + 1))
    for r in rows:
        r.ref = next(refs) if r.notes or r.conflicts else None
    report = params.get("report") or {}
    scored_mode = report.get("scored_vllm_mode", "cudagraph")
    exactness = graph_exactness(inputs)
    smoke = smoke_rows(inputs)
    return dict(
        profile=params.get("profile"),
        profiles=list(params.get("profiles") or {}),
        scored_mode=scored_mode,
        scored_rows=[r for r in rows if not r.historical and r.mode == scored_mode
                     and r.vllm_status == "ok" and not r.corrupt],
        method=methodology(inputs),
        rows=rows,
        cross_day=cross_day_note(rows),
        smoke_rows=smoke,
        smoke_flicker=flicker_notes(inputs, smoke),
        measurements=measurement_items(inputs),
        gpu_suites=gpu_suites(inputs),
        evals=eval_sections(inputs),
        artifacts=artifact_list(inputs),
        figures=figure_items(figures or []),
        capacity=capacity_rows(inputs),
        rtt_split=rtt_split_rows(inputs),
        verification=verification_rows(inputs),
        verify_equality=verify_equality_rows(inputs),
        verify_equality_notes=verify_equality_notes(inputs),
        configuration_failure_notes=configuration_failure_notes(inputs),
        capacity_targets=capacity_targets(inputs),
        prefix_cache=prefix_cache_rows(inputs),
        served_default=served_default_label(),
        capture_cost=capture_cost_rows(inputs),
        step_anatomy=step_anatomy.step_anatomy_rows(inputs),
        step_bandwidth=step_anatomy.bandwidth_verdicts(inputs),
        drafting_floors=step_anatomy.drafting_floors(inputs),
        exactness=exactness,
        served=served_criterion(exactness, scored_mode),
        independence=load_independence(inputs),
        headline=headline(inputs),  # the page's opening results (alignatt.report.headline)
        run_records=inputs.run_records,  # who signed which run (alignatt.report.inputs)
        speech=speech.speech_section(inputs),  # real speech in (alignatt.report.speech)
    )


# ---- render / write / check ------------------------------------------------------------------


def render_all(root: str | Path = ".", params: dict[str, Any] | None = None) -> tuple[str, list[Figure]]:
    """The page and its figures, from the same inputs."""
    import jinja2

    from alignatt.pipeline.params import load_params

    root = Path(root)
    params = params if params is not None else load_params(root / "params.yaml")
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(root / "reports"),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )
    env.filters["ms"] = ms
    env.filters["ratio"] = ratio
    try:
        template = env.get_template(TEMPLATE)
    except jinja2.TemplateNotFound:
        raise AlignattError(f"report template {root / 'reports' / TEMPLATE} not found") from None
    inputs = collect_inputs(root, params)
    figures = render_figures(inputs, FIGURES)
    text = template.render(**build_context(inputs, figures))
    return re.sub(r"\n{3,}", "\n\n", text), figures  # templates' blank-line noise never reaches the page


def render_report(root: str | Path = ".", params: dict[str, Any] | None = None) -> str:
    return render_all(root, params)[0]


def report_path(root: Path, params: dict[str, Any]) -> Path:
    return root / (params.get("report") or {}).get("output", "reports/BENCHMARKS.md")


def figures_dir(root: Path, params: dict[str, Any]) -> Path:
    return report_path(root, params).parent / FIGURES_DIR


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


def write_report(root: str | Path = ".") -> Path:
    from alignatt.pipeline.params import load_params

    root = Path(root)
    params = load_params(root / "params.yaml")
    path = report_path(root, params)
    text, figures = render_all(root, params)
    folder = figures_dir(root, params)
    folder.mkdir(parents=True, exist_ok=True)
    for f in figures:
        _write_atomic(folder / f"{f.name}.svg", f.svg)
    made = {f"{f.name}.svg" for f in figures}
    for old in folder.glob("*.svg"):
        if old.name not in made:  # no function draws it any more: it would show stale data
            old.unlink()
    _write_atomic(path, text)
    return path


def stale_report(root: str | Path = ".") -> str | None:
    """None when the committed report and its figures equal a fresh render; else why not."""
    from alignatt.pipeline.params import load_params

    root = Path(root)
    params = load_params(root / "params.yaml")
    path = report_path(root, params)
    if not path.exists():
        return f"{relative(root, path)} does not exist: run `alignatt report`"
    fresh, figures = render_all(root, params)
    current = path.read_text(encoding="utf-8")
    if current != fresh:
        old, new = current.splitlines(), fresh.splitlines()
        line = next((i for i, (a, b) in enumerate(zip(old, new)) if a != b), min(len(old), len(new)))
        return f"{relative(root, path)} is stale (first difference at line {line + 1}): run `alignatt report`"
    folder = figures_dir(root, params)
    for f in figures:
        svg = folder / f"{f.name}.svg"
        if not svg.exists():
            return f"{relative(root, svg)} does not exist: run `alignatt report`"
        if svg.read_text(encoding="utf-8") != f.svg:
            return f"{relative(root, svg)} is stale: run `alignatt report`"
    made = {f"{f.name}.svg" for f in figures}
    extra = sorted(p.name for p in folder.glob("*.svg") if p.name not in made) if folder.is_dir() else []
    if extra:
        return f"{relative(root, folder)} holds figures no artifact draws any more ({', '.join(extra)}): run `alignatt report`"
    return None
