"""Run records for files measured before run records existed: `alignatt attest`, recorded at import.

Such a record says less than one made at measurement, and says so: its predicate is
`recorded: "at import"`, its command is the attest command, its commit the one that holds the files,
and its note says that the digests were taken at import. It vouches that the files have not changed
since they were imported, not how they were measured. Only files as git holds them are imported
(uncommitted changes under a folder are refused), and a file that already has a signed record made
at measurement, with its current digest, is left to that record.
"""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path

from alignatt.core.errors import AlignattError
from alignatt.record.digest import sha256_file
from alignatt.record.attestation import (AT_IMPORT, AT_MEASUREMENT, RECORDS_DIR, SUFFIX, RunPredicate, RunRecord,
                                         Signer, Subject, read_record, record_files, signature_path, write_record)
from alignatt.record.provenance import git_state, utc_now
from alignatt.record.verify import OUTPUTS, recorded_files

IMPORTED = "imported"


def _uncommitted(root: Path, folder: Path) -> list[str]:
    done = subprocess.run(["git", "-c", "safe.directory=*", "status", "--porcelain", "--untracked-files=all", "--",
                           str(folder)], cwd=root, capture_output=True, text=True)
    if done.returncode != 0:
        return []  # not a git checkout: nothing to compare with (the predicate's commit is then None)
    return [line[3:] for line in done.stdout.splitlines() if line.strip()]


def _measured(root: Path) -> dict[str, str]:
    """name -> digest of files that a signed record made at measurement lists."""
    digests: dict[str, str] = {}
    for path in record_files(root):
        try:
            record, _ = read_record(path)
        except AlignattError:
            continue
        if record.predicate.recorded == AT_MEASUREMENT and signature_path(path).exists():
            digests.update(record.digests())
    return digests


def import_record_path(root: Path, folder: Path) -> Path:
    name = folder.resolve().relative_to((root / OUTPUTS).resolve()).as_posix().replace("/", "-")
    return root / RECORDS_DIR / IMPORTED / f"{name}{SUFFIX}"


def attest_imported(root: Path, folders: list[Path], signing_key, note: str | None = None) -> list[tuple[Path, int]]:
    """One signed import record per folder; [(record path, files in it)]."""
    root = root.resolve()
    outputs = (root / OUTPUTS).resolve()
    for folder in folders:
        if not folder.is_dir() or outputs not in folder.resolve().parents:
            raise AlignattError(f"{folder}: not a folder under {OUTPUTS}/")
        if (root / RECORDS_DIR).resolve() in [folder.resolve(), *folder.resolve().parents]:
            raise AlignattError(f"{folder}: run records are not attested themselves")
        changed = _uncommitted(root, folder)
        if changed:
            raise AlignattError(f"{folder}: {len(changed)} uncommitted change(s) (first: {changed[0]}); "
                                "import attests files as git holds them: commit them first")
    commit, dirty = git_state(root)
    measured = _measured(root)
    written = []
    for folder in folders:
        subjects = []
        for path in recorded_files(root, [folder]):
            name = path.relative_to(root).as_posix()
            digest = sha256_file(path)
            if measured.get(name) == digest:
                continue  # its record made at measurement stands
            subjects.append(Subject(name=name, digest={"sha256": digest}, annotations={"digested": "at import"}))
        if not subjects:
            continue
        now = utc_now()
        record = RunRecord(subject=subjects, predicate=RunPredicate(
            recorded=AT_IMPORT, command=["alignatt", "attest", folder.resolve().relative_to(root).as_posix()],
            exit_status=None, commit=commit, dirty=dirty, params={}, lock=None, fingerprint=None,
            host=socket.gethostname(), started_utc=now, finished_utc=now,
            signer=Signer(principal=signing_key.principal, key=signing_key.fingerprint),
            note=note or (f"measured before run records existed: these digests were taken at import, from the files "
                          f"as committed at {(commit or 'an unknown commit')[:12]}, not at measurement; the record "
                          "vouches that they have not changed since, not how they were made")))
        path = import_record_path(root, folder)
        write_record(path, record, signing_key)
        written.append((path, len(subjects)))
    return written
