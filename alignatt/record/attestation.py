"""Run records: which files a run wrote, with their SHA-256, and how they were made (in-toto statements).

A run record is an in-toto Statement (https://in-toto.io/Statement/v1): `subject` lists every file
the run wrote, by path from the checkout and SHA-256; `predicate` says how: the command, the
commit, the params, the lock, the machine fingerprint, the host, the times, and whether the digests
were taken when the files were measured (`recorded: "at measurement"`) or later, for files that
predate run records (`"at import"`). It is one line of canonical JSON in
`outputs/run-records/<group>/<name>.intoto.jsonl`, signed beside it (`.intoto.jsonl.sig`,
`alignatt.record.signing`). The JSON glob that finds artifacts does not match `.jsonl`, so a record
is never read as an artifact.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from alignatt.core.errors import AlignattError

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://alignatt.invalid/run-record/v1"  # names this predicate; resolves nowhere (.invalid)
RECORDS_DIR = Path("outputs/run-records")
SUFFIX = ".intoto.jsonl"
AT_MEASUREMENT = "at measurement"
AT_IMPORT = "at import"


class Subject(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str  # path from the checkout, "/"-separated
    digest: dict[str, str]  # {"sha256": hex}
    # when the digest was taken: "at write" (by the writer, as it wrote the file) or "at exit" (by the
    # stage wrapper as the command ended, for files written by other code)
    annotations: dict[str, str] = Field(default_factory=dict)

    @property
    def sha256(self) -> str:
        return self.digest.get("sha256", "")


class Signer(BaseModel):
    model_config = ConfigDict(extra="forbid")

    principal: str
    key: str  # "SHA256:..." fingerprint of the public key


class RunPredicate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    recorded: Literal["at measurement", "at import"]
    command: list[str]
    exit_status: int | None
    commit: str | None
    dirty: bool | None
    params: dict[str, Any]  # profile, sha256 of params.yaml, the keys that differ from the commit
    lock: dict[str, Any] | None  # the environment's lock file: path and sha256 (alignatt.record.lock)
    fingerprint: dict[str, Any] | None  # the profile's fingerprint.json as the run saw it
    host: str
    started_utc: str
    finished_utc: str
    signer: Signer | None
    note: str | None = None


class RunRecord(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    type_: str = Field(STATEMENT_TYPE, alias="_type")
    subject: list[Subject]
    predicateType: str = PREDICATE_TYPE
    predicate: RunPredicate

    def digests(self) -> dict[str, str]:
        return {s.name: s.sha256 for s in self.subject}


def record_bytes(record: RunRecord) -> bytes:
    """Canonical text: sorted keys, no spaces, one line; what is signed."""
    data = record.model_dump(mode="json", by_alias=True)
    return (json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False) + "\n").encode()


def parse_record(data: bytes, where: str | Path) -> RunRecord:
    try:
        record = RunRecord.model_validate(json.loads(data))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise AlignattError(f"{where}: not a run record (not JSON: {e})") from None
    except ValidationError as e:
        first = e.errors()[0]
        raise AlignattError(f"{where}: not a run record ({'.'.join(map(str, first['loc']))}: {first['msg']})") from None
    if record.type_ != STATEMENT_TYPE or record.predicateType != PREDICATE_TYPE:
        raise AlignattError(f"{where}: not a run record (statement {record.type_}, predicate {record.predicateType})")
    return record


def signature_path(record_path: Path) -> Path:
    return record_path.with_name(record_path.name + ".sig")


def record_files(root: Path) -> list[Path]:
    folder = root / RECORDS_DIR
    return sorted(folder.rglob(f"*{SUFFIX}")) if folder.is_dir() else []


def write_record(path: Path, record: RunRecord, signing_key=None) -> Path:
    """Write the record (and its signature when a key is given; a stale signature is removed)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(record_bytes(record))
    tmp.replace(path)
    signature_path(path).unlink(missing_ok=True)
    if signing_key is not None:
        signing_key.sign(path)
    return path


def read_record(path: Path) -> tuple[RunRecord, bytes]:
    data = path.read_bytes()
    return parse_record(data, path), data
