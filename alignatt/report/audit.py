"""`alignatt audit [PATHS]`: check every artifact, its run record, the historical hashes and the report.

Findings, each with the file and a plain message:
- `record`: a file under `outputs/` that no signed run record from a trusted key vouches for: no
  record lists it, its record is unsigned, signed by a key not in `keys/allowed_signers` (nor
  given with `--trust`) or edited after signing, or the file's SHA-256 is not the one its record
  gives (`alignatt.record.verify`); a record's subject that is missing;
- `schema`: an artifact that does not validate against `alignatt.record.artifacts` (or a published
  file that lost its published shape), or an unsupported schema version;
- `provenance`: a provenance block missing what the measurement needs (torch, transformers, git
  commit, model id; vLLM when a vLLM seam ran; GPU and driver when it ran on CUDA; the digest of
  a container image) or measured from uncommitted code;
- `hash`: a historical artifact whose SHA-256 is not the one in its `SHA256SUMS`, a listed file
  that is missing, or any file under a manifest's folder that the manifest does not list;
- `derived`: DVC metrics / plot data that no longer match the bench, load or eval artifact beside them;
- `fingerprint`: a bench, smoke, load or eval artifact whose provenance says it ran on another machine or
  stack than the `fingerprint.json` in its folder (what DVC decided to skip or re-run on);
- `combined-row`: a report row built from several artifacts that disagree on date, GPU, model
  or versions;
- `gpu-suite`: a GPU test suite artifact that records a failing suite, or a measurement on a GPU
  whose commit is not the one at which its folder's GPU suite (`gpu_tests.json`) passed;
- `report`: a `reports/BENCHMARKS.md` that is stale (or that cannot be rendered).
A finding that was examined and explained can be *accepted* in `outputs/accepted-findings.yaml`
(path, check, a substring of the message, and the reason): it is then printed as accepted and
does not fail the audit. An acceptance that matches no finding is itself a finding (`accepted`),
so the list cannot outlive what it explains.
Output: the verdict line first (findings and accepted findings counted), then the findings;
accepted ones only with `--show-accepted`; `--json` gives everything. Exit status: 0 clean, 1 findings.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from pydantic import ValidationError

from alignatt.record.artifacts import (
    BENCH_FILE,
    FINGERPRINT_FILE,
    BenchArtifact,
    EvalArtifact,
    FingerprintArtifact,
    GpuTestsArtifact,
    LoadArtifact,
    ServerSmokeArtifact,
    load_json,
    measured_on_gpu,
    parse_artifact,
    sha256_file,
    validation_line,
)
from alignatt.record.published import read_published
from alignatt.capture.names import VLLM_CAPTURE
from alignatt.core.errors import AlignattError
from alignatt.record.provenance import HOST, NOT_INSTALLED, fingerprint_differences, fingerprint_of

MANIFEST = "SHA256SUMS"
ACCEPTED = "outputs/accepted-findings.yaml"


@dataclass
class Finding:
    path: str
    check: str
    message: str


@dataclass
class Acceptance:
    path: str
    check: str
    message: str  # a substring of the finding's message
    reason: str

    def matches(self, f: Finding, root: Path) -> bool:
        same_file = (root / f.path).resolve() == (root / self.path).resolve()
        return same_file and f.check == self.check and self.message in f.message


@dataclass
class AuditResult:
    checked: list[str] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    accepted: list[tuple[Finding, str]] = field(default_factory=list)
    records: list[dict] = field(default_factory=list)  # each run record: who signed it, how, whether accepted

    @property
    def ok(self) -> bool:
        return not self.findings

    def add(self, path: str, check: str, message: str) -> None:
        self.findings.append(Finding(path, check, message))

    def as_json(self) -> str:
        return json.dumps(
            {"ok": self.ok, "verdict": self.verdict(), "checked": self.checked,
             "findings": [asdict(f) for f in self.findings],
             "accepted": [{**asdict(f), "reason": why} for f, why in self.accepted], "records": self.records},
            indent=1,
        )

    def verdict(self) -> str:
        outcome = "ok" if self.ok else f"FAILED, {len(self.findings)} finding(s)"
        accepted = f", {len(self.accepted)} accepted finding(s) (--show-accepted lists them)" if self.accepted else ""
        files = len({str(Path(p).resolve()) for p in self.checked})
        return f"audit: {outcome}{accepted}; {files} file(s) checked, {len(self.records)} run record(s)"

    def as_text(self, show_accepted: bool = False) -> str:
        """The verdict, then each finding; the accepted ones (and why) only when asked for."""
        lines = [self.verdict()]
        lines += [f"FAIL {f.path}: [{f.check}] {f.message}" for f in self.findings]
        if show_accepted:
            lines += [f"ACCEPTED {f.path}: [{f.check}] {f.message} (why: {why})" for f, why in self.accepted]
        return "\n".join(lines)


def read_manifest(path: Path) -> dict[str, str]:
    """name -> sha256 from a `sha256sum` manifest."""
    entries = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            digest, _, name = line.strip().partition("  ")
            entries[name.lstrip("*")] = digest.lower()
    return entries


# ---- one artifact ----------------------------------------------------------------------------


def provenance_gaps(artifact) -> list[str]:
    p = artifact.provenance
    gaps = []
    for name in ("torch", "transformers"):
        if getattr(p, name) == NOT_INSTALLED:
            gaps.append(f"{name} not recorded (\"{NOT_INSTALLED}\")")
    if not p.git_commit:
        gaps.append("git commit not recorded")
    elif p.git_dirty:
        gaps.append(f"measured from uncommitted changes on top of {p.git_commit[:12]}")
    elif p.git_dirty is None:
        gaps.append(f"unknown whether the code differed from {p.git_commit[:12]} (ALIGNATT_GIT_DIRTY)")
    if p.container_image != HOST and not p.container_digest:
        gaps.append(f"container image {p.container_image!r} without a digest")
    if isinstance(artifact, (BenchArtifact, ServerSmokeArtifact, EvalArtifact, LoadArtifact)) and not p.model_id:
        gaps.append("model id not recorded")
    if isinstance(artifact, BenchArtifact):
        from alignatt.measure.bench import OWN_FACTORIES

        if artifact.seam_factory not in OWN_FACTORIES:
            gaps.append(f"seams built by {artifact.seam_factory!r}, not alignatt's own seams")
        ran = [s.seam for s in artifact.seams if s.status == "ok"]
        if VLLM_CAPTURE in ran and p.vllm == NOT_INSTALLED:
            gaps.append("a vLLM seam ran but the vLLM version is not recorded")
        if artifact.config.device.startswith("cuda"):
            if p.gpu_count == 0:
                gaps.append("ran on CUDA but no GPU is recorded")
            if not p.driver:
                gaps.append("ran on CUDA but the driver version is not recorded")
            if not p.torch_cuda_build:
                gaps.append("ran on CUDA but torch's CUDA build is not recorded")
    return gaps


def _check_derived(path: Path, artifact: BenchArtifact, rel: str, result: AuditResult) -> None:
    """DVC metrics and plot data beside a bench artifact must still be derived from it."""
    from alignatt.measure.bench import bench_metrics, latency_csv

    mode = BENCH_FILE.match(path.name)
    if mode is None:
        return
    metrics = path.with_name(f"bench_{mode[1]}_metrics.json")
    if metrics.exists():
        result.checked.append(str(metrics))
        try:
            same = json.loads(metrics.read_text(encoding="utf-8")) == bench_metrics(artifact)
        except json.JSONDecodeError:
            same = False
        if not same:
            result.add(str(metrics), "derived", f"metrics do not match {rel}: re-run the bench stage")
    plot = path.with_name(f"latency_{mode[1]}.csv")
    if plot.exists():
        result.checked.append(str(plot))
        if plot.read_text(encoding="utf-8") != latency_csv(artifact):
            result.add(str(plot), "derived", f"plot data do not match {rel}: re-run the bench stage")


def _check_load_derived(path: Path, artifact: LoadArtifact, rel: str, result: AuditResult) -> None:
    """A load artifact's DVC metrics (`<stem>_metrics.json`) and plot data (`<stem>_rtt.csv`) must
    still be what the load stage derives from it."""
    import tempfile

    from alignatt.measure.capacity import write_metrics, write_plot

    with tempfile.TemporaryDirectory(prefix="alignatt-audit-") as tmp:
        for derived, write in ((path.with_name(f"{path.stem}_metrics.json"), write_metrics),
                               (path.with_name(f"{path.stem}_rtt.csv"), write_plot)):
            if not derived.exists():
                continue
            result.checked.append(str(derived))
            fresh = Path(tmp) / derived.name
            write(fresh, artifact)
            if fresh.read_bytes() != derived.read_bytes():
                result.add(str(derived), "derived", f"does not match {rel}: re-run the load stage")


def audit_artifact(path: Path, result: AuditResult):
    """Check one artifact; the parsed artifact, or None when it does not validate (a finding)."""
    rel = str(path)
    result.checked.append(rel)
    try:
        artifact = parse_artifact(load_json(path))
    except AlignattError as e:
        result.add(rel, "schema", str(e))
        return None
    except ValidationError as e:  # a recorded config included: one line for the artifact, every problem in it
        result.add(rel, "schema", validation_line(e))
        return None
    if isinstance(artifact, FingerprintArtifact):
        return artifact  # no provenance by design: the stable part of it, which the checks below compare
    for gap in provenance_gaps(artifact):
        result.add(rel, "provenance", gap)
    if isinstance(artifact, BenchArtifact):
        _check_derived(path, artifact, rel, result)
    if isinstance(artifact, LoadArtifact):
        _check_load_derived(path, artifact, rel, result)
    if isinstance(artifact, (BenchArtifact, ServerSmokeArtifact, LoadArtifact, EvalArtifact)):
        _check_fingerprint(path, artifact, rel, result)
    if isinstance(artifact, EvalArtifact):
        from alignatt.evaluate.outputs import derived_findings

        for where, message in derived_findings(path, artifact):
            result.checked.append(where)
            result.add(where, "derived", message)
    return artifact


def audit_gpu_suites(artifacts: list[tuple[Path, object]], result: AuditResult) -> None:
    """A GPU figure stands on its code's GPU suite: the suite must have passed, at the same commit.

    Per folder: the `gpu_tests.json` beside the measurements names the commit whose suite ran; a
    folder without one (a profile's `speech/`, measured by stages of its own) stands on its nearest
    parent's. Every other artifact there that ran on a GPU must carry that commit, and the suite
    must have passed; a GPU folder with no suite above it is a finding too."""
    by_folder: dict[Path, list[tuple[Path, object]]] = {}
    suites_in: dict[Path, list] = {}
    for f, artifact in artifacts:
        by_folder.setdefault(f.parent, []).append((f, artifact))
        if isinstance(artifact, GpuTestsArtifact):
            suites_in.setdefault(f.parent, []).append(artifact)
            if artifact.ran and not artifact.passed:
                c = artifact.counts
                result.add(str(f), "gpu-suite", f"the GPU suite failed at {(artifact.provenance.git_commit or '?')[:12]}: "
                           f"{c['failed']} failed, {c['error']} errors ({artifact.reason})")
    for folder, entries in sorted(by_folder.items()):
        on_gpu = [(f, a) for f, a in entries if measured_on_gpu(a)]
        if not on_gpu:
            continue
        owner = next((d for d in (folder, *folder.parents) if d in suites_in), folder)
        passed = [a for a in suites_in.get(owner, []) if a.passed]
        if not passed:
            result.add(str(folder), "gpu-suite", f"no passing GPU suite in {folder.name}/ (alignatt test-gpu)")
            continue
        commit = passed[0].provenance.git_commit or ""
        for f, a in on_gpu:
            if (a.provenance.git_commit or "") != commit:
                result.add(str(f), "gpu-suite", f"measured at {(a.provenance.git_commit or '?')[:12]}; the GPU suite "
                           f"passed at {commit[:12]} ({passed[0].provenance.timestamp_utc[:10]})")


def _check_fingerprint(path: Path, artifact, rel: str, result: AuditResult) -> None:
    """A stage output must have been measured on what the folder's fingerprint says: otherwise
    DVC skipped (or kept) it on the word of a fingerprint that was not its machine's."""
    beside = path.with_name(FINGERPRINT_FILE)
    if not beside.exists():
        return
    try:
        recorded = parse_artifact(load_json(beside))
    except (AlignattError, ValidationError):
        return  # reported as a schema finding of that file
    if not isinstance(recorded, FingerprintArtifact):
        return
    measured_on = fingerprint_of(artifact.provenance)
    if isinstance(artifact, EvalArtifact):
        # an eval may score a model of its own (the h200 eval's `model:` option: real weights beside
        # a synthetic profile model); the machine and the stack must still be the fingerprint's
        measured_on = measured_on.model_copy(update={"model_id": recorded.fingerprint.model_id,
                                                     "model_revision": recorded.fingerprint.model_revision})
    differ = fingerprint_differences(measured_on, recorded.fingerprint)
    if differ:
        result.add(rel, "fingerprint", f"measured on another machine or stack than {beside.name} records "
                   f"({'; '.join(differ[:4])}): re-run the stage (`dvc repro`)")


def audit_manifest(manifest: Path, result: AuditResult) -> set[Path]:
    """Check every file a manifest lists; return the paths it covers."""
    folder = manifest.parent
    covered = set()
    try:
        entries = read_manifest(manifest)
    except (OSError, UnicodeDecodeError) as e:
        result.add(str(manifest), "hash", f"unreadable manifest: {e}")
        return covered
    for name, digest in sorted(entries.items()):
        path = folder / name
        covered.add(path.resolve())
        result.checked.append(str(path))
        if not path.exists():
            result.add(str(path), "hash", f"listed in {manifest} but missing")
            continue
        actual = sha256_file(path)
        if actual != digest:
            result.add(str(path), "hash", f"SHA-256 {actual[:16]}… is not {digest[:16]}… from {manifest}: "
                       "historical artifacts must stay byte for byte as published")
            continue
        try:
            read_published(path)
        except AlignattError as e:
            result.add(str(path), "schema", str(e))
    for stray in sorted(p for p in folder.rglob("*") if p.is_file() and p.resolve() != manifest.resolve()):
        if stray.resolve() not in covered:
            result.add(str(stray), "hash", f"beside {manifest} but not listed in it")
            covered.add(stray.resolve())
    return covered


# ---- the whole tree --------------------------------------------------------------------------


def _json_files(paths: list[Path]) -> list[Path]:
    files = []
    for p in paths:
        if p.is_dir():
            files += sorted(p.rglob("*.json"))
        elif p.exists():
            files.append(p)
        else:
            raise AlignattError(f"{p}: no such file or directory")
    return files


def audit_report(root: Path, result: AuditResult) -> None:
    """Combined rows must agree; the committed report must equal a fresh render."""
    from alignatt.pipeline.params import load_params
    from alignatt.report.inputs import collect_inputs
    from alignatt.report.page import report_path, stale_report

    try:
        params = load_params(root / "params.yaml")
        for row in collect_inputs(root, params).rows():
            for conflict in row.conflicts:
                where = ", ".join(s.path for s in row.sources)
                result.add(where, "combined-row", f"{row.date} {row.mode} row: {conflict}")
        result.checked.append(str(report_path(root, params)))
        stale = stale_report(root)
    except AlignattError as e:
        result.add(str(root), "report", f"cannot render the report: {e}")
        return
    if stale:
        result.add(str(report_path(root, params)), "report", stale)


def audit_records(root: Path, targets: list[Path], trusted: list[Path] | None, result: AuditResult) -> None:
    """Every file under the targets against its signed run record (alignatt.record.verify)."""
    from alignatt.record.signing import Verifier
    from alignatt.record.verify import check_records, record_findings, recorded_files, trusted_signers

    with Verifier(trusted_signers(root, trusted)) as verifier:
        records = check_records(root, verifier)
    for c in records:
        predicate = c.record.predicate if c.record else None
        result.records.append({
            "path": c.path, "accepted": c.problem is None, "problem": c.problem, "signed_by": c.principal,
            "recorded": predicate.recorded if predicate else None,
            "finished_utc": predicate.finished_utc if predicate else None,
            "files": len(c.record.subject) if c.record else 0})
    base = root.resolve()
    result.checked += [str(root / p.relative_to(base)) for p in recorded_files(root, targets)]
    for path, message in record_findings(root, targets, records):
        result.add(str(root / path), "record", message)


def run_audit(paths: list[str] | None = None, root: str | Path = ".", report: bool = True,
              trusted: list[Path] | None = None) -> AuditResult:
    """The whole audit. `trusted`: allowed_signers files or public keys trusted for this audit only."""
    root = Path(root)
    targets = [Path(p) for p in paths] if paths else [root / "outputs"]
    result = AuditResult()
    files = _json_files(targets)
    audit_records(root, targets, trusted, result)
    covered: set[Path] = set()
    manifests = sorted({f.parent / MANIFEST for f in files if (f.parent / MANIFEST).exists()})
    manifests += [t for t in targets if t.name == MANIFEST and t not in manifests]
    for manifest in manifests:
        covered |= audit_manifest(manifest, result)
    parsed = []  # (file, artifact) of every artifact that validated, for the cross-artifact checks
    for f in files:
        if f.resolve() in covered or f.name.endswith(("_metrics.json", "_verdict.json")) or f.name == MANIFEST:
            continue  # metrics are checked with the bench artifact they derive from; a verdict is a stage's
        artifact = audit_artifact(f, result)
        if artifact is not None:
            parsed.append((f, artifact))
    audit_gpu_suites(parsed, result)
    if (root / "params.yaml").exists():
        from alignatt.pipeline.params import load_params

        audit_images(parsed, load_params(root / "params.yaml"), result)

        published = root / ((load_params(root / "params.yaml").get("report") or {})
                            .get("published", "outputs/published"))
        if published.is_dir() and not (published / MANIFEST).exists():
            result.add(str(published), "hash", f"no {MANIFEST}: the historical artifacts cannot be checked")
        if report:
            audit_report(root, result)
    apply_acceptances(root, result, targets)
    return result


def audit_images(artifacts: list[tuple[Path, object]], params: dict, result: AuditResult) -> None:
    """An artifact measured in the image that params.yaml names must name that image's build, when
    the image is here to compare: a rebuilt image (another config id, or digest) no longer vouches
    for it."""
    from alignatt.pipeline.container import image_identity, load_container_config

    cfg = load_container_config(params)
    if cfg.engine == "none":
        return
    here = None
    for path, artifact in artifacts:
        p = getattr(artifact, "provenance", None)
        if p is None or p.container_image != cfg.image:
            continue
        here = here or image_identity(cfg.engine, cfg.image, must_exist=False)
        if here is None:
            return  # not built here: nothing to compare
        recorded, now = (p.container_image_id, here.image_id) if p.container_image_id else (p.container_digest, here.digest)
        if recorded != now:
            result.add(str(path), "container", f"measured in {cfg.image} {recorded}, but that image here is {now}: "
                                               "rebuilt since; re-run the stage in it")


def load_acceptances(path: Path) -> list[Acceptance]:
    import yaml

    if not path.exists():
        return []
    try:
        entries = yaml.safe_load(path.read_text(encoding="utf-8")) or []
        return [Acceptance(**{k: str(e[k]) for k in ("path", "check", "message", "reason")}) for e in entries]
    except (yaml.YAMLError, KeyError, TypeError) as e:
        raise AlignattError(f"{path}: each entry needs path, check, message and reason ({e})") from None


def apply_acceptances(root: Path, result: AuditResult, targets: list[Path] | None = None) -> None:
    """Move explained findings to `accepted`; an acceptance that explains nothing is a finding (when
    its file is among what was audited: auditing one folder does not make the others' stale)."""
    path = root / ACCEPTED
    scope = [t.resolve() for t in targets or [root / "outputs"]]
    for acc in load_acceptances(path):
        hits = [f for f in result.findings if acc.matches(f, root)]
        accepted_file = (root / acc.path).resolve()
        audited = any(t == accepted_file or t in accepted_file.parents for t in scope)
        if not hits and audited:
            result.add(str(path), "accepted", f"accepts no current finding: {acc.path} [{acc.check}] {acc.message!r}")
        for f in hits:
            result.findings.remove(f)
            result.accepted.append((f, acc.reason))
