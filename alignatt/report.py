"""`alignatt report`: render reports/BENCHMARKS.md from params.yaml and the artifacts.

Everything in the document comes from files: the methodology from params.yaml and the artifacts'
configs, one results row per measurement (historical rows from `outputs/published/`, ours from
`outputs/<profile>/`), notes computed from the rows. Rendering is byte-stable (no render-time
clock, sorted inputs, fixed number formats), so `alignatt report --check` can tell whether the
committed document is stale.

Rows and sessions. A row is one (date, machine, vLLM mode). The transformers seams do not depend
on the vLLM mode, so a cudagraph row takes its HF figures from the eager artifact of the same
session (same profile folder; for the published files, the same date). Such a combined row is
only trusted when its artifacts agree on date, GPU and versions; otherwise its speedup is not
computed and the audit flags it. Speedups are computed within a row, never across rows.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from alignatt.artifacts import (
    BENCH_FILE,
    BenchArtifact,
    EnvArtifact,
    MeasurementArtifact,
    PublishedArtifact,
    ServerSmokeArtifact,
    load_artifact,
    read_published,
)
from alignatt.errors import AlignattError

TEMPLATE = "BENCHMARKS.md.j2"
MODE_ORDER = {"eager": 0, "cudagraph": 1, "compiled": 2}
HF_SEAMS = ("hf_eager", "hf_qk_fast")


# ---- what each artifact says about where it was measured -------------------------------------


@dataclass
class SourceFacts:
    """The facts two artifacts of one row must agree on; None = not recorded."""

    path: str
    date: str | None
    gpu: str | None
    versions: dict[str, str | None]
    model: str | None = None


def _facts_of_published(a: PublishedArtifact, rel: str) -> SourceFacts:
    model = a.bench.config.model if a.bench is not None and a.bench.config else None
    return SourceFacts(rel, a.date, a.gpu, dict(a.versions), model)


def _facts_of_bench(a: BenchArtifact, rel: str) -> SourceFacts:
    p = a.provenance
    versions = {"torch": p.torch, "vllm": p.vllm, "transformers": p.transformers}
    return SourceFacts(rel, p.date, machine_of(a), versions, p.model_id)


def disagreements(sources: list[SourceFacts]) -> list[str]:
    """What the artifacts combined into one row disagree on (known values only)."""
    out = []
    first = sources[0]
    for other in sources[1:]:
        pairs = [("date", first.date, other.date), ("GPU", first.gpu, other.gpu),
                 ("model", first.model, other.model)]
        pairs += [(k, first.versions.get(k), other.versions.get(k)) for k in sorted(first.versions)]
        for what, a, b in pairs:
            if a is not None and b is not None and a != b:
                out.append(f"{what}: {first.path} has {a!r}, {other.path} has {b!r}")
    return out


def machine_of(a: BenchArtifact | ServerSmokeArtifact | EnvArtifact) -> str:
    p = a.provenance
    if p.gpus:
        return p.gpus[0].name + (f" x{p.gpu_count}" if p.gpu_count > 1 else "")
    return f"CPU: {p.cpu or 'unknown'} ({p.cpu_count} cores)"


# ---- rows ------------------------------------------------------------------------------------


@dataclass
class ResultRow:
    date: str
    machine: str
    mode: str
    model: str
    hf_eager: float | None
    hf_qk_fast: float | None
    vllm: float | None
    vllm_status: str  # "ok" | "skipped" | "not run"
    sources: list[SourceFacts]
    historical: bool
    synthetic: bool = False
    notes: list[str] = field(default_factory=list)
    conflicts: list[str] = field(default_factory=list)
    corrupt: bool = False  # the vLLM capture of this row disagrees with the eager run's
    ref: int | None = None  # footnote number, assigned when rendering

    @property
    def speedup(self) -> float | None:
        """HF eager / vLLM, within this row only; None when a figure is missing or untrusted."""
        if self.conflicts or not self.hf_eager or not self.vllm:
            return None
        return self.hf_eager / self.vllm

    @property
    def qk_fast_speedup(self) -> float | None:
        if self.conflicts or not self.hf_eager or not self.hf_qk_fast:
            return None
        return self.hf_eager / self.hf_qk_fast

    @property
    def sort_key(self) -> tuple:
        return (self.date, not self.historical, self.machine, MODE_ORDER.get(self.mode, 9))


def _texts(rows: list[dict[str, Any]]) -> dict[tuple[str, int], str]:
    # ours: repeat / emitted_text; the published tool: repeat_index / acceptance_text
    out = {}
    for r in rows:
        key = (r["id"], r.get("repeat", r.get("repeat_index")))
        text = r.get("emitted_text", r.get("acceptance_text"))
        if text is not None:
            out[key] = text
    return out


def emitted_differences(rows: list[dict[str, Any]], eager_rows: list[dict[str, Any]]) -> tuple[int, int]:
    """(differing, compared): emitted (acceptance) texts of matching rows that differ."""
    a, b = _texts(rows), _texts(eager_rows)
    common = sorted(set(a) & set(b))
    return sum(a[k] != b[k] for k in common), len(common)


def _graph_check(mode: str, vllm_rows, eager_vllm_rows, eager_path: str) -> tuple[list[str], bool]:
    """(notes, corrupt): do the graphed run's emitted texts match the eager run's?"""
    if mode == "eager" or not vllm_rows or not eager_vllm_rows:
        return [], False
    differ, compared = emitted_differences(vllm_rows, eager_vllm_rows)
    if differ:
        return [f"capture payload corrupt under {mode}: {differ} of {compared} emitted (acceptance) "
                f"texts differ from the eager run (`{eager_path}`)"], True
    return [f"{mode} capture agrees with the eager run: 0 of {compared} emitted texts differ"], False


def published_rows(published: list[tuple[str, PublishedArtifact]]) -> list[ResultRow]:
    benches = [(rel, a) for rel, a in published if a.kind == "bench"]
    rows = []
    for rel, a in benches:
        own = _facts_of_published(a, rel)
        sources = [own]
        hf = {s: a.seam_medians.get(s) for s in HF_SEAMS}
        eager_rows: list = []
        eager_rel = ""
        if a.vllm_mode not in (None, "eager") and not any(hf.values()):
            # HF seams ran in the eager artifact of the same day
            twin = next((t for t in benches if t[1].date == a.date and t[1].vllm_mode == "eager"), None)
            if twin is not None:
                eager_rel, eager = twin
                hf = {s: eager.seam_medians.get(s) for s in HF_SEAMS}
                sources.append(_facts_of_published(eager, eager_rel))
                eager_rows = eager.seam_rows("vllm_capture")
        notes = []
        if a.bench is not None and a.bench.config is None:
            notes.append("published without a config: GPU, versions and vLLM mode not recorded")
        graph_notes, corrupt = _graph_check(a.vllm_mode or "eager", a.seam_rows("vllm_capture"),
                                            eager_rows, eager_rel)
        vllm = a.seam_medians.get("vllm_capture")
        rows.append(ResultRow(
            date=a.date or "unknown", machine=a.gpu or "not recorded", mode=a.vllm_mode or "not recorded",
            model=f"rev {own.model[:12]}" if own.model else "not recorded",
            hf_eager=hf["hf_eager"], hf_qk_fast=hf["hf_qk_fast"], vllm=vllm,
            vllm_status="ok" if vllm is not None else "not run",
            sources=sources, historical=True, notes=notes + graph_notes, corrupt=corrupt,
            conflicts=disagreements(sources),
        ))
    return rows


def our_rows(runs: dict[str, dict[str, tuple[str, BenchArtifact]]]) -> list[ResultRow]:
    """runs: profile folder -> vLLM mode -> (relative path, artifact)."""
    rows = []
    for profile in sorted(runs):
        by_mode = runs[profile]
        for mode in sorted(by_mode, key=lambda m: MODE_ORDER.get(m, 9)):
            rel, a = by_mode[mode]
            sources = [_facts_of_bench(a, rel)]
            seam = {s: a.seam(s) for s in (*HF_SEAMS, "vllm_capture")}
            hf = {s: seam[s].median_per_token_ms if seam[s] else None for s in HF_SEAMS}
            eager_rows: list = []
            eager_rel = ""
            v = seam["vllm_capture"]
            if mode != "eager" and "eager" in by_mode:
                eager_rel, eager = by_mode["eager"]
                # HF figures only to set beside a measured vLLM figure (the row's speedup)
                if not any(hf.values()) and v is not None and v.status == "ok":
                    hf = {s: (eager.seam(s).median_per_token_ms if eager.seam(s) else None) for s in HF_SEAMS}
                    sources.append(_facts_of_bench(eager, eager_rel))
                ev = eager.seam("vllm_capture")
                eager_rows = [r.model_dump() for r in ev.rows] if ev else []
            notes = [f"{s.seam} skipped: {s.skip_reason}" for s in a.seams if s.status == "skipped"]
            graph_notes, corrupt = _graph_check(
                mode, [r.model_dump() for r in v.rows] if v else [], eager_rows, eager_rel)
            if a.synthetic_weights:
                notes.insert(0, "synthetic weights: latency only, the drafts are not translations")
            rows.append(ResultRow(
                date=a.provenance.date, machine=machine_of(a), mode=mode,
                model=a.config.model + (" (synthetic weights)" if a.synthetic_weights else ""),
                hf_eager=hf["hf_eager"], hf_qk_fast=hf["hf_qk_fast"],
                vllm=v.median_per_token_ms if v else None,
                vllm_status=v.status if v else "not run",
                sources=sources, historical=False, synthetic=a.synthetic_weights,
                notes=notes + graph_notes, corrupt=corrupt, conflicts=disagreements(sources),
            ))
    return rows


# ---- collecting the inputs -------------------------------------------------------------------


@dataclass
class ReportInputs:
    root: Path
    params: dict[str, Any]
    published: list[tuple[str, PublishedArtifact]]
    runs: dict[str, dict[str, tuple[str, BenchArtifact]]]
    smokes: list[tuple[str, ServerSmokeArtifact]]
    envs: list[tuple[str, EnvArtifact]]
    measurements: list[tuple[str, MeasurementArtifact]]

    def rows(self) -> list[ResultRow]:
        return sorted(published_rows(self.published) + our_rows(self.runs), key=lambda r: r.sort_key)


def _rel(root: Path, path: Path) -> str:
    try:
        return path.resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        return path.as_posix()


def collect_inputs(root: Path, params: dict[str, Any]) -> ReportInputs:
    report = params.get("report") or {}
    published_dir = root / report.get("published", "outputs/published")
    outputs = published_dir.parent
    published = [(_rel(root, p), read_published(p)) for p in sorted(published_dir.glob("*.json"))]
    runs: dict[str, dict[str, tuple[str, BenchArtifact]]] = {}
    smokes, envs, measurements = [], [], []
    for path in sorted(outputs.rglob("*.json")):
        if path.parent == published_dir or path.name.endswith("_metrics.json"):
            continue  # historical (read above) / DVC metrics derived from a bench artifact
        try:
            artifact = load_artifact(path)
        except AlignattError:
            continue  # not a valid artifact: `alignatt audit` reports it; the page shows the rest
        rel = _rel(root, path)
        if isinstance(artifact, BenchArtifact):
            # a pipeline folder is one session (its modes share HF figures); any other bench
            # file is a session of its own
            session = _rel(root, path.parent) if BENCH_FILE.match(path.name) else rel
            runs.setdefault(session, {})[artifact.config.vllm_mode] = (rel, artifact)
        elif isinstance(artifact, ServerSmokeArtifact):
            smokes.append((rel, artifact))
        elif isinstance(artifact, EnvArtifact):
            envs.append((rel, artifact))
        else:
            measurements.append((rel, artifact))
    return ReportInputs(root, params, published, runs, smokes, envs, measurements)


# ---- view model for the template -------------------------------------------------------------


def ms(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}"


def ratio(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}×"


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    k = (len(ordered) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def smoke_rows(inputs: ReportInputs) -> list[dict[str, Any]]:
    rows = []
    for rel, a in inputs.published:
        if a.kind != "server_smoke" or a.smoke is None:
            continue
        s, events = a.smoke.summary, a.smoke.events
        fastest = min(events, key=lambda e: e.get("rtt_ms", float("inf"))) if events else None
        note = f"{s.fast_path_events} fast-path events recorded"
        if fastest is not None and s.fast_path_events == 0:
            note = (f"fast_path_events: {s.fast_path_events}: its fastest update "
                    f"({fastest.get('rtt_ms')} ms) is event {events.index(fastest)}, with "
                    f"{fastest.get('committed_words')} committed and {fastest.get('tail_words')} tail "
                    "words, i.e. the first, empty-source update, not a measured commit release")
        note += "; RTT p50 is the published commit_rtt_ms_median"
        rows.append(dict(date=a.date or "unknown", machine=a.gpu or "not recorded", model="not recorded",
                         seam="vllm (published)", updates=s.events, finals=s.finals,
                         retractions=s.retractions, p50=ms(s.commit_rtt_ms_median), p95=ms(s.rtt_ms_p95),
                         fast_events=s.fast_path_events, fast_p50="—", fast_calls="—", source=rel,
                         note=note))
    for rel, a in inputs.smokes:
        latencies = [e.latency_ms for e in a.fast_path_events]
        synthetic = a.provenance.model_revision == "random weights"
        rows.append(dict(
            date=a.provenance.date, machine=machine_of(a),
            model=str(a.config.get("model", "—")) + (" (synthetic weights)" if synthetic else ""),
            seam=str(a.config.get("seam", "—")), updates=a.updates, finals=a.finals,
            retractions=a.retractions, p50=ms(a.rtt_ms_p50), p95=ms(a.rtt_ms_p95),
            fast_events=len(a.fast_path_events), fast_p50=ms(_percentile(latencies, 0.5)),
            fast_calls=str(sum(e.engine_calls for e in a.fast_path_events)), source=rel,
            note="fast-path releases measured server-side" if a.fast_path_events
            else "no commit-only updates released held text",
        ))
    return sorted(rows, key=lambda r: (r["date"], r["source"]))


def artifact_list(inputs: ReportInputs) -> list[dict[str, str]]:
    items = []
    for rel, a in inputs.published:
        items.append(dict(path=rel, kind=a.kind, schema="published (pre-schema)", date=a.date or "—",
                          torch=a.versions.get("torch") or "not recorded",
                          vllm=a.versions.get("vllm") or "not recorded", transformers="not recorded",
                          sha256=_sha256(inputs.root / rel)[:12]))
    ours = [(rel, a) for rel, a in inputs.envs + inputs.smokes + inputs.measurements]
    ours += [v for runs in inputs.runs.values() for v in runs.values()]
    for rel, a in sorted(ours, key=lambda t: t[0]):
        p = a.provenance
        items.append(dict(path=rel, kind=a.kind, schema=f"v{a.schema_version}", date=p.date,
                          torch=p.torch, vllm=p.vllm, transformers=p.transformers,
                          sha256=_sha256(inputs.root / rel)[:12]))
    return items


def measurement_items(inputs: ReportInputs) -> list[dict[str, Any]]:
    items = []
    for rel, a in inputs.measurements:
        scalars = {k: v for k, v in a.results.items() if isinstance(v, (int, float, str, bool))}
        items.append(dict(
            path=rel, name=a.name, date=a.provenance.date, machine=machine_of(a),
            description=a.description, synthetic=a.synthetic_weights,
            results=[f"{k} = {v:.4g}" if isinstance(v, float) else f"{k} = {v}" for k, v in scalars.items()],
            checks=[("✓" if c.passed else "✗", c.name, c.detail) for c in a.checks],
        ))
    return items


def methodology(inputs: ReportInputs) -> dict[str, Any]:
    from alignatt.bench import load_prompts
    from alignatt.params import BenchParams, profile_of

    params = inputs.params
    bench = BenchParams.model_validate(params.get("bench") or {})
    prompts = load_prompts(bench.prompts)
    bins: dict[str, int] = {}
    for p in prompts:
        bins[p.length_bin] = bins.get(p.length_bin, 0) + 1
    profiles = []
    for name in params.get("profiles") or {}:
        _, prof = profile_of(params, name)
        merged = BenchParams.model_validate({**(params.get("bench") or {}), **prof.bench})
        profiles.append(dict(name=name, model=prof.model, device=prof.device, dtype=prof.dtype or "default",
                             warmup=merged.warmup, repeats=merged.repeats,
                             rows=merged.repeats * len(prompts), note=prof.note))
    return dict(
        prompts=len(prompts), bins=", ".join(f"{n} {b}" for b, n in bins.items()),
        with_prefix=sum(p.assistant_prefill != "" for p in prompts),
        prompts_file=bench.prompts or "alignatt/data/mt_capture_prompts.json",
        max_new_tokens=bench.max_new_tokens, heads_k=bench.heads_k, warmup=bench.warmup,
        repeats=bench.repeats, rows=bench.repeats * len(prompts), policy=bench.policy or "defaults",
        modes=bench.modes, profiles=profiles,
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


def build_context(inputs: ReportInputs) -> dict[str, Any]:
    params = inputs.params
    rows = inputs.rows()
    refs = iter(range(1, len(rows) + 1))
    for r in rows:
        r.ref = next(refs) if r.notes or r.conflicts else None
    report = params.get("report") or {}
    scored_mode = report.get("scored_vllm_mode", "cudagraph")
    return dict(
        profile=params.get("profile"),
        profiles=list(params.get("profiles") or {}),
        scored_mode=scored_mode,
        scored_rows=[r for r in rows if not r.historical and r.mode == scored_mode
                     and r.vllm_status == "ok" and not r.corrupt],
        method=methodology(inputs),
        rows=rows,
        cross_day=cross_day_note(rows),
        smoke_rows=smoke_rows(inputs),
        measurements=measurement_items(inputs),
        artifacts=artifact_list(inputs),
    )


# ---- render / write / check ------------------------------------------------------------------


def render_report(root: str | Path = ".", params: dict[str, Any] | None = None) -> str:
    import jinja2

    from alignatt.params import load_params

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
    text = template.render(**build_context(collect_inputs(root, params)))
    return re.sub(r"\n{3,}", "\n\n", text)  # templates' blank-line noise never reaches the page


def report_path(root: Path, params: dict[str, Any]) -> Path:
    return root / (params.get("report") or {}).get("output", "reports/BENCHMARKS.md")


def write_report(root: str | Path = ".") -> Path:
    from alignatt.params import load_params

    root = Path(root)
    params = load_params(root / "params.yaml")
    path = report_path(root, params)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_report(root, params), encoding="utf-8")
    return path


def stale_report(root: str | Path = ".") -> str | None:
    """None when the committed report equals a fresh render; else why not."""
    from alignatt.params import load_params

    root = Path(root)
    params = load_params(root / "params.yaml")
    path = report_path(root, params)
    if not path.exists():
        return f"{_rel(root, path)} does not exist: run `alignatt report`"
    fresh = render_report(root, params)
    current = path.read_text(encoding="utf-8")
    if current == fresh:
        return None
    old, new = current.splitlines(), fresh.splitlines()
    line = next((i for i, (a, b) in enumerate(zip(old, new)) if a != b), min(len(old), len(new)))
    return f"{_rel(root, path)} is stale (first difference at line {line + 1}): run `alignatt report`"
