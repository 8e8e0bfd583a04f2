"""The results rows of the Benchmarks page: which artifacts make a row, and what it may claim.

A row is one (date, machine, vLLM mode). The transformers seams do not depend on the vLLM mode,
so a graphed row takes its HF figures from the eager artifact of the same session (same profile
folder; for the published files, the same date), and only beside a measured vLLM figure. A
combined row is trusted only when its artifacts agree on date, GPU, model and versions; otherwise
it gets no speedup (and the audit flags it). A graphed run whose emitted texts differ from the
eager run's is marked corrupt: its speedup cannot be claimed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from alignatt.capture.names import HF_EAGER, HF_QK_FAST, HF_SEAMS, VLLM_CAPTURE, VLLM_MODES
from alignatt.record.artifacts import BenchArtifact, EnvArtifact, ServerSmokeArtifact
from alignatt.record.published import PublishedArtifact

MODE_ORDER = {mode: i for i, mode in enumerate(VLLM_MODES)}


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


def load_note(a: BenchArtifact | ServerSmokeArtifact) -> list[str]:
    """A busy machine inflates timings (most of all a small shared CPU): say so when it was."""
    p = a.provenance
    # the 5-minute average spans a typical run; above the core count, work waited for a core
    # (the measuring process itself accounts for about one core's worth)
    if p.load_average is None or not p.cpu_count or p.load_average[1] <= p.cpu_count:
        return []
    loads = ", ".join(f"{x:g}" for x in p.load_average)
    return [f"machine busy while measuring (load average {loads} over 1/5/15 min on "
            f"{p.cpu_count} cores): timings inflated"]


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
                eager_rows = eager.seam_rows(VLLM_CAPTURE)
        notes = []
        if a.bench is not None and a.bench.config is None:
            notes.append("published without a config: GPU, versions and vLLM mode not recorded")
        graph_notes, corrupt = _graph_check(a.vllm_mode or "eager", a.seam_rows(VLLM_CAPTURE),
                                            eager_rows, eager_rel)
        vllm = a.seam_medians.get(VLLM_CAPTURE)
        rows.append(ResultRow(
            date=a.date or "unknown", machine=a.gpu or "not recorded", mode=a.vllm_mode or "not recorded",
            model=f"rev {own.model[:12]}" if own.model else "not recorded",
            hf_eager=hf[HF_EAGER], hf_qk_fast=hf[HF_QK_FAST], vllm=vllm,
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
            seam = {s: a.seam(s) for s in (*HF_SEAMS, VLLM_CAPTURE)}
            hf = {s: seam[s].median_per_token_ms if seam[s] else None for s in HF_SEAMS}
            eager_rows: list = []
            eager_rel, apart_note = "", None
            v = seam[VLLM_CAPTURE]
            if mode != "eager" and "eager" in by_mode:
                eager_rel, eager = by_mode["eager"]
                # HF figures only to set beside a measured vLLM figure (the row's speedup), and only
                # from the same run (day, machine, stack): a ratio across runs is not a speedup
                if not any(hf.values()) and v is not None and v.status == "ok":
                    twin = _facts_of_bench(eager, eager_rel)
                    apart = disagreements([sources[0], twin])
                    if apart:
                        apart_note = (f"HF seams not shown: they ran in `{eager_rel}`, another run ({apart[0]}); "
                                      "a speedup is taken within one run")
                    else:
                        hf = {s: (eager.seam(s).median_per_token_ms if eager.seam(s) else None) for s in HF_SEAMS}
                        sources.append(twin)
                ev = eager.seam(VLLM_CAPTURE)
                eager_rows = [r.model_dump() for r in ev.rows] if ev else []
            notes = [f"{s.seam} skipped: {s.skip_reason}" for s in a.seams if s.status == "skipped"]
            notes += load_note(a)
            notes += [f"{s.seam}: {s.variant}" for s in a.seams if s.variant]
            notes += [apart_note] if apart_note else []
            graph_notes, corrupt = _graph_check(
                mode, [r.model_dump() for r in v.rows] if v else [], eager_rows, eager_rel)
            if a.synthetic_weights:
                notes.insert(0, "synthetic weights: latency only, the drafts are not translations")
            rows.append(ResultRow(
                date=a.provenance.date, machine=machine_of(a), mode=mode,
                model=a.config.model + (" (synthetic weights)" if a.synthetic_weights else ""),
                hf_eager=hf[HF_EAGER], hf_qk_fast=hf[HF_QK_FAST],
                vllm=v.median_per_token_ms if v else None,
                vllm_status=v.status if v else "not run",
                sources=sources, historical=False, synthetic=a.synthetic_weights,
                notes=notes + graph_notes, corrupt=corrupt, conflicts=disagreements(sources),
            ))
    return rows
