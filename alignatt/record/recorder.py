"""The run record of one stage command: what it wrote, digested as it was written, signed as it ends.

`stages/run-stage` runs every stage command through `record_run`:
- before the command, it notes the size and mtime of every file under `outputs/` and opens a
  journal (`ALIGNATT_RUN_JOURNAL`); `write_artifact` appends each artifact's SHA-256 there as it
  writes it (`note_written`), so an artifact's digest is the one it had when it was written;
- after the command, every file under `outputs/` that is new or changed is a subject of the run
  record: with its journalled digest ("at write"; a file changed since then fails the stage), or,
  for files other code wrote (CSVs, instance logs, logs), its digest as the command ended ("at
  exit");
- the record goes to `outputs/run-records/<profile>/<name>.intoto.jsonl` (name: the stem of the
  command's `--out`) and is signed with the host's key (`alignatt.record.signing`). Without a key
  it is written unsigned, with a warning, and the audit will not accept it.
A command that writes nothing under `outputs/` (doctor, report) leaves no record. A re-run that
writes the same bytes keeps the record it has (the env stage runs on every `dvc repro`), unless the
re-run can sign what was left unsigned: a fresh clone without a key keeps the signed record.
In a container the journal is not passed in: every digest is then taken at exit.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from alignatt.core.errors import AlignattError
from alignatt.record.digest import sha256_file
from alignatt.record.attestation import (AT_MEASUREMENT, RECORDS_DIR, SUFFIX, RunPredicate, RunRecord, Signer,
                                         Subject, read_record, signature_path, write_record)
from alignatt.record.provenance import params_changes, utc_now

JOURNAL_ENV = "ALIGNATT_RUN_JOURNAL"
LOCK_SHA256_ENV = "ALIGNATT_LOCK_SHA256"
OUTPUTS = Path("outputs")


def note_written(path: str | Path) -> None:
    """Called by a writer right after it wrote `path`: journal its digest for this run's record."""
    journal = os.environ.get(JOURNAL_ENV)
    if not journal:
        return
    line = json.dumps({"path": str(Path(path).resolve()), "sha256": sha256_file(path)})
    with open(journal, "a", encoding="utf-8") as f:  # one short append per write: safe across processes
        f.write(line + "\n")


def _journalled(journal: Path) -> dict[str, str]:
    digests: dict[str, str] = {}
    if journal.exists():
        for line in journal.read_text(encoding="utf-8").splitlines():
            entry = json.loads(line)
            digests[entry["path"]] = entry["sha256"]  # the last write wins
    return digests


def snapshot(root: Path) -> dict[Path, tuple[int, int]]:
    """(size, mtime_ns) of every file under outputs/, the run records excluded."""
    records = (root / RECORDS_DIR).resolve()
    state = {}
    for path in (root / OUTPUTS).rglob("*"):
        if path.is_file() and records not in path.resolve().parents:
            st = path.stat()
            state[path.resolve()] = (st.st_size, st.st_mtime_ns)
    return state


def record_name(args: list[str], written: list[Path]) -> str:
    """The stem of the command's `--out`, else of the first file written."""
    for i, arg in enumerate(args):
        if arg == "--out" and i + 1 < len(args):
            return Path(args[i + 1]).stem
        if arg.startswith("--out="):
            return Path(arg.split("=", 1)[1]).stem
    return written[0].stem


def lock_state(root: Path) -> dict[str, Any] | None:
    declared = os.environ.get(LOCK_SHA256_ENV)
    if declared:
        return {"sha256": declared, "source": LOCK_SHA256_ENV}
    try:
        from alignatt.record.lock import installed_lock
    except ImportError:
        return None
    state = installed_lock(root)
    return {"path": state.path, "sha256": state.sha256} if state else None


def fingerprint_seen(root: Path, profile: str) -> dict[str, Any] | None:
    path = root / OUTPUTS / profile / "fingerprint.json"
    try:
        return json.loads(path.read_text(encoding="utf-8")).get("fingerprint")
    except (OSError, ValueError, AttributeError):
        return None


def params_seen(root: Path, profile: str) -> dict[str, Any]:
    params = root / "params.yaml"
    return {"profile": profile, "params_sha256": sha256_file(params) if params.exists() else None,
            "changed_from_commit": params_changes(root)}


def _relative(root: Path, path: Path) -> str:
    return path.resolve().relative_to(root.resolve()).as_posix()


def seal(root: Path, args: list[str], profile: str, before: dict[Path, tuple[int, int]], journal: Path,
         started: str, exit_status: int, signing_key) -> Path | None:
    """Write (and sign) the record of what changed under outputs/ since `before`; None if nothing did."""
    from alignatt.record.provenance import git_state

    after = snapshot(root)
    written = sorted(p for p, st in after.items() if before.get(p) != st)
    if not written:
        return None
    at_write = _journalled(journal)
    subjects = []
    for path in written:
        digest = sha256_file(path)
        noted = at_write.get(str(path))
        if noted is not None and noted != digest:
            raise AlignattError(f"{_relative(root, path)} changed after it was written "
                                f"(SHA-256 {noted[:16]}… at write, {digest[:16]}… at exit): no run record")
        subjects.append(Subject(name=_relative(root, path), digest={"sha256": digest},
                                annotations={"digested": "at write" if noted else "at exit"}))
    commit, dirty = git_state(root)
    record = RunRecord(subject=subjects, predicate=RunPredicate(
        recorded=AT_MEASUREMENT, command=list(args), exit_status=exit_status, commit=commit, dirty=dirty,
        params=params_seen(root, profile), lock=lock_state(root), fingerprint=fingerprint_seen(root, profile),
        host=socket.gethostname(), started_utc=started, finished_utc=utc_now(),
        signer=Signer(principal=signing_key.principal, key=signing_key.fingerprint) if signing_key else None))
    path = root / RECORDS_DIR / profile / f"{record_name(args, written)}{SUFFIX}"
    if _same_run(path, record, signed=signing_key is not None):
        return path
    return write_record(path, record, signing_key)


def _command_key(command: list[str]) -> list[str]:
    """A command as two checkouts run it alike: the interpreter by name, not by its checkout's path."""
    return [Path(command[0]).name, *command[1:]] if command else []


def _same_run(path: Path, record: RunRecord, signed: bool) -> bool:
    """An existing record of the same command over the same bytes stands, if it is signed or this
    run could not sign either: an unsigned re-run never takes a signed record's place."""
    try:
        old, _ = read_record(path)
    except (OSError, AlignattError):
        return False
    return (old.digests() == record.digests()
            and _command_key(old.predicate.command) == _command_key(record.predicate.command)
            and (signature_path(path).exists() or not signed))


def record_run(cmd: list[str], env: dict[str, str], root: Path, params: dict[str, Any]) -> int:
    """Run a stage command and leave its signed run record; the command's exit status (2 if recording fails)."""
    from alignatt.record.signing import load_signing_key, signing_key_path

    profile = str(params.get("profile") or "default")  # the folder under outputs/run-records/
    try:
        key_path = signing_key_path(root)
        signing_key = load_signing_key(key_path) if key_path else None
    except AlignattError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    before = snapshot(root)
    started = utc_now()
    with tempfile.TemporaryDirectory(prefix="alignatt-run-") as tmp:
        journal = Path(tmp) / "journal.jsonl"
        journal.touch()
        env = {**env, JOURNAL_ENV: str(journal)}
        try:
            status = subprocess.run(cmd, env=env).returncode
        except FileNotFoundError:
            print(f"error: command not found: {cmd[0]}", file=sys.stderr)
            return 127
        try:
            path = seal(root, cmd, profile, before, journal, started, status, signing_key)
        except AlignattError as e:
            print(f"error: {e}", file=sys.stderr)
            return status or 2
    if path is not None:
        kept = read_record(path)[0].predicate.signer
        how = f"signed by {kept.principal}" if kept else (
            "UNSIGNED: no signing key (set ALIGNATT_SIGNING_KEY, or make one: alignatt attest --new-key NAME); "
            "the audit will not accept it")
        print(f"run-stage: run record {_relative(root, path)} ({how})", file=sys.stderr, flush=True)
    return status
