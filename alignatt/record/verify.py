"""Check the files under `outputs/` against their signed run records (what `alignatt audit` runs).

Every file under `outputs/` (run records themselves and the hand-kept `accepted-findings.yaml`
aside) must be a subject of a run record whose signature verifies with a trusted key, and must
still have the SHA-256 that record gives it. When several records list a file, the newest one
(by the time the run finished) is the file's record: a re-run supersedes the record of the run
before, and an older attested version of a file does not pass for the current one.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from alignatt.core.errors import AlignattError
from alignatt.record.digest import sha256_file
from alignatt.record.attestation import RECORDS_DIR, RunRecord, read_record, record_files, signature_path
from alignatt.record.signing import ALLOWED_SIGNERS, Verifier, trusted_lines

OUTPUTS = Path("outputs")
UNRECORDED = ("outputs/accepted-findings.yaml",)  # kept by hand: every change to it is reviewed in git


@dataclass
class CheckedRecord:
    path: str  # from the checkout
    record: RunRecord | None
    principal: str | None  # the trusted signer the signature verified against
    problem: str | None  # why the record cannot be accepted; None when it is

    @property
    def sort_key(self) -> tuple[str, str]:
        return (self.record.predicate.finished_utc if self.record else "", self.path)


def trusted_signers(root: Path, extra: list[Path] | None = None) -> str:
    """The committed trusted keys, plus those trusted for this audit only."""
    committed = root / ALLOWED_SIGNERS
    return trusted_lines(([committed] if committed.exists() else []) + list(extra or []))


def check_records(root: Path, verifier: Verifier) -> list[CheckedRecord]:
    checked = []
    for path in record_files(root):
        rel = path.relative_to(root).as_posix()
        try:
            record, data = read_record(path)
        except AlignattError as e:
            checked.append(CheckedRecord(rel, None, None, str(e).removeprefix(f"{path}: ")))
            continue
        sig = signature_path(path)
        if not sig.exists():
            checked.append(CheckedRecord(rel, record, None, "unsigned (no .sig beside it)"))
            continue
        principal, why = verifier.signer_of(data, sig)
        claimed = record.predicate.signer
        if principal is not None and (claimed is None or claimed.principal != principal):
            why = f"says it was signed by {claimed.principal if claimed else 'nobody'} but {principal}'s key signed it"
            principal = None
        checked.append(CheckedRecord(rel, record, principal, why or None))
    return checked


def recorded_files(root: Path, targets: list[Path]) -> list[Path]:
    """Every file under the targets that must have a run record."""
    outputs = (root / OUTPUTS).resolve()
    records = (root / RECORDS_DIR).resolve()
    files = set()
    for target in targets:
        target = target.resolve()
        candidates = [target] if target.is_file() else target.rglob("*") if target.is_dir() else []
        for path in candidates:
            if not path.is_file() or (outputs not in path.parents) or records in path.parents or path == records:
                continue
            if path.relative_to(root.resolve()).as_posix() in UNRECORDED:
                continue
            files.add(path)
    return sorted(files)


def record_findings(root: Path, targets: list[Path], records: list[CheckedRecord]) -> list[tuple[str, str]]:
    """(path, message) for every file under the targets that its run record does not vouch for,
    and for every record that cannot be accepted."""
    root = root.resolve()
    findings = [(c.path, f"run record not accepted: {c.problem}") for c in records if c.problem]
    newest: dict[str, CheckedRecord] = {}
    for c in sorted((c for c in records if c.record), key=lambda c: c.sort_key):
        for name in c.record.digests():
            newest[name] = c
    in_scope = {p.relative_to(root).as_posix() for p in recorded_files(root, targets)}
    for name in sorted(in_scope):
        c = newest.get(name)
        if c is None:
            findings.append((name, "no run record lists this file: run measurements through stages/run-stage "
                                   "(files made before run records: `alignatt attest`)"))
            continue
        if c.problem:
            findings.append((name, f"its run record {c.path} is not accepted: {c.problem}"))
            continue
        actual, recorded = sha256_file(root / name), c.record.digests()[name]
        if actual != recorded:
            how = c.record.predicate.recorded
            findings.append((name, f"SHA-256 {actual[:16]}… is not {recorded[:16]}… in its run record {c.path} "
                                   f"(signed {how} by {c.principal}): changed after it was recorded"))
    scope = [t.resolve() for t in targets]
    for name, c in sorted(newest.items()):
        path = root / name
        if name not in in_scope and not path.exists() and any(t == path or t in path.parents for t in scope):
            findings.append((name, f"listed in run record {c.path} but missing"))
    return findings
