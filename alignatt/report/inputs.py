"""The report's inputs: every valid artifact under `outputs/`, read once, by kind.

The page, its rows and its figures all read this; it imports none of them, so that a figure
module can take `ReportInputs` without importing the page that draws it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from alignatt.core.errors import AlignattError
from alignatt.core.progress import clock_text
from alignatt.record.artifacts import (
    BENCH_FILE,
    BenchArtifact,
    EnvArtifact,
    MeasurementArtifact,
    ServerSmokeArtifact,
    load_artifact,
)
from alignatt.record.published import PublishedArtifact, read_published
from alignatt.report.declared import declared_paths, is_declared
from alignatt.report.rows import ResultRow, our_rows, published_rows


@dataclass
class ReportInputs:
    root: Path
    params: dict[str, Any]
    published: list[tuple[str, PublishedArtifact]]
    runs: dict[str, dict[str, tuple[str, BenchArtifact]]]
    smokes: list[tuple[str, ServerSmokeArtifact]]
    envs: list[tuple[str, EnvArtifact]]
    measurements: list[tuple[str, MeasurementArtifact]]
    # every valid artifact by kind, for figures and for kinds other stages add (load, eval, ...)
    by_kind: dict[str, list[tuple[str, Any]]] = field(default_factory=dict)
    # who signed which run, as each run record says (`alignatt audit` verifies the signatures)
    run_records: list[dict[str, Any]] = field(default_factory=list)

    def of_kind(self, kind: str) -> list[tuple[str, Any]]:
        return self.by_kind.get(kind, [])

    def rows(self) -> list[ResultRow]:
        return sorted(published_rows(self.published) + our_rows(self.runs), key=lambda r: r.sort_key)


def relative(root: Path, path: Path) -> str:
    try:
        return path.resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        return path.as_posix()


def _wall(p) -> str:
    """How long the recorded run took, m:ss (— for a record made at import: it timed no run)."""
    from datetime import datetime

    if p.recorded != "at measurement":
        return "—"
    seconds = (datetime.fromisoformat(p.finished_utc) - datetime.fromisoformat(p.started_utc)).total_seconds()
    return clock_text(round(seconds))


def _command(argv: list[str]) -> str:
    """The command as a reader would type it: `python -m alignatt` is `alignatt`."""
    for i, arg in enumerate(argv[:-1]):
        if arg == "-m" and argv[i + 1] == "alignatt":
            argv = ["alignatt", *argv[i + 2:]]
            break
    text = " ".join(argv)
    return text if len(text) <= 90 else text[:89] + "…"


def run_record_rows(root: Path) -> list[dict[str, Any]]:
    """One row per run record: what it recorded, how, who signed it, and of how many files it is
    the current record (a newer record of the same file supersedes it)."""
    from alignatt.record.attestation import read_record, record_files, signature_path

    records = []
    for path in record_files(root):
        try:
            record, _ = read_record(path)
        except AlignattError:
            continue  # not a run record: `alignatt audit` reports it
        records.append((relative(root, path), record, signature_path(path).exists()))
    newest: dict[str, str] = {}
    for rel, record, _ in sorted(records, key=lambda t: (t[1].predicate.finished_utc, t[0])):
        for name in record.digests():
            newest[name] = rel
    rows = []
    for rel, record, signed in records:
        p = record.predicate
        signer = f"{p.signer.principal} (`{p.signer.key[:19]}…`)" if p.signer and signed else "**unsigned**"
        rows.append(dict(path=rel, recorded=p.recorded, signer=signer,
                         when=p.finished_utc.replace("T", " ").removesuffix("Z"), wall=_wall(p),
                         commit=(p.commit or "—")[:12],
                         command=_command(p.command), files=len(record.subject),
                         current=sum(1 for who in newest.values() if who == rel)))
    return rows


def collect_inputs(root: Path, params: dict[str, Any]) -> ReportInputs:
    report = params.get("report") or {}
    published_dir = root / report.get("published", "outputs/published")
    outputs = published_dir.parent
    published = [(relative(root, p), read_published(p)) for p in sorted(published_dir.glob("*.json"))]
    runs: dict[str, dict[str, tuple[str, BenchArtifact]]] = {}
    smokes, envs, measurements = [], [], []
    by_kind: dict[str, list[tuple[str, Any]]] = {}
    declared = declared_paths(root, params)  # a file neither dvc.yaml nor a run record names is not read
    for path in sorted(outputs.rglob("*.json")):
        if path.parent == published_dir or path.name.endswith("_metrics.json"):
            continue  # historical (read above) / DVC metrics derived from a bench artifact
        if not is_declared(relative(root, path), declared):
            continue  # e.g. what a command run by hand left in outputs/: it must not change the page
        try:
            artifact = load_artifact(path)
        except AlignattError:
            continue  # not a valid artifact: `alignatt audit` reports it; the page shows the rest
        rel = relative(root, path)
        by_kind.setdefault(artifact.kind, []).append((rel, artifact))
        if isinstance(artifact, BenchArtifact):
            # a pipeline folder is one session (its modes share HF figures); any other bench
            # file is a session of its own
            session = relative(root, path.parent) if BENCH_FILE.match(path.name) else rel
            runs.setdefault(session, {})[artifact.config.vllm_mode] = (rel, artifact)
        elif isinstance(artifact, ServerSmokeArtifact):
            smokes.append((rel, artifact))
        elif isinstance(artifact, EnvArtifact):
            envs.append((rel, artifact))
        elif isinstance(artifact, MeasurementArtifact):
            measurements.append((rel, artifact))
    return ReportInputs(root, params, published, runs, smokes, envs, measurements, by_kind, run_record_rows(root))
