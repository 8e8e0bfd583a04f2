"""Run records: a stage run through the wrapper leaves a signed record of what it wrote, digested at
write time; an import record says it was made at import; the audit's record checks read both."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from alignatt.core.errors import AlignattError
from alignatt.pipeline.container import main as run_stage
from alignatt.record.attestation import read_record, signature_path
from alignatt.record.importing import attest_imported
from alignatt.record.signing import SIGNING_KEY_ENV, Verifier, trusted_lines
from alignatt.record.verify import check_records, record_findings, trusted_signers
from alignatt.report.inputs import run_record_rows
from tests.record.signing_keys import throwaway_key, trust

ROOT = Path(__file__).resolve().parents[2]

# A measuring command: an artifact through the schema's writer (journalled as written) and a CSV
# written by other code (digested when the command ends).
WRITER = """
import sys
from pathlib import Path
from alignatt.record.artifacts import fingerprint_artifact, write_artifact
write_artifact("outputs/cpu/a.json", fingerprint_artifact())  # no timestamp: a re-run writes the same bytes
Path("outputs/cpu/b.csv").write_text("x,y\\n1,2\\n")
if "--tamper" in sys.argv:
    Path("outputs/cpu/a.json").write_text("{}\\n")
"""


@pytest.fixture(scope="module")
def key(tmp_path_factory):
    return throwaway_key(tmp_path_factory.mktemp("keys"), "ci-ephemeral")


@pytest.fixture
def project(tmp_path, monkeypatch) -> Path:
    shutil.copy(ROOT / "params.yaml", tmp_path / "params.yaml")
    (tmp_path / "outputs" / "cpu").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(SIGNING_KEY_ENV, raising=False)
    return tmp_path


def _stage(project: Path, *extra: str, python: str = sys.executable) -> int:
    return run_stage(["--params", str(project / "params.yaml"), "--", python, "-c", WRITER,
                      "--out", "outputs/cpu/a.json", *extra])


def _findings(project: Path, trusted: list[Path]) -> list[tuple[str, str]]:
    with Verifier(trusted_signers(project, trusted)) as verifier:
        return record_findings(project, [project / "outputs"], check_records(project, verifier))


def test_a_stage_leaves_a_signed_record_of_every_file_it_wrote(project, key, monkeypatch, capsys):
    monkeypatch.setenv(SIGNING_KEY_ENV, str(key.path))
    assert _stage(project) == 0
    path = project / "outputs/run-records/cpu/a.intoto.jsonl"
    record, _ = read_record(path)
    assert [(s.name, s.annotations["digested"]) for s in record.subject] == [
        ("outputs/cpu/a.json", "at write"), ("outputs/cpu/b.csv", "at exit")]
    p = record.predicate
    assert p.recorded == "at measurement" and p.exit_status == 0 and p.command[-2:] == ["--out", "outputs/cpu/a.json"]
    assert p.signer.principal == "ci-ephemeral" and p.params["profile"] == "cpu" and p.params["params_sha256"]
    [row] = run_record_rows(project)  # the page's row: how long the run took, m:ss
    assert re.fullmatch(r"\d+:[0-5]\d", row["wall"]) and row["current"] == 2
    assert "signed by ci-ephemeral" in capsys.readouterr().err
    pub = Path(str(key.path) + ".pub")
    assert _findings(project, [pub]) == []  # its key trusted for this audit only
    untrusted = _findings(project, [])  # not otherwise
    assert {n for n, _ in untrusted} == {"outputs/cpu/a.json", "outputs/cpu/b.csv",
                                         "outputs/run-records/cpu/a.intoto.jsonl"}
    assert all("no trusted keys" in m for _, m in untrusted)
    # the same run again writes the same bytes: the record stands as it was
    before = path.read_bytes(), signature_path(path).read_bytes()
    assert _stage(project) == 0
    assert (path.read_bytes(), signature_path(path).read_bytes()) == before
    # and so it does for a re-run with no key from a user's fresh clone (its own venv's python):
    # unsigned never replaces signed
    monkeypatch.delenv(SIGNING_KEY_ENV)
    clone_python = project.parent / "clone" / ".venv" / "bin" / "python"
    clone_python.parent.mkdir(parents=True)
    clone_python.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    clone_python.chmod(0o755)
    capsys.readouterr()
    assert _stage(project, python=str(clone_python)) == 0
    assert (path.read_bytes(), signature_path(path).read_bytes()) == before
    assert "signed by ci-ephemeral" in capsys.readouterr().err


def test_without_a_key_the_record_is_unsigned_and_the_audit_says_so(project, capsys):
    assert _stage(project) == 0
    assert "UNSIGNED" in capsys.readouterr().err
    path = project / "outputs/run-records/cpu/a.intoto.jsonl"
    assert path.exists() and not signature_path(path).exists()
    found = dict(_findings(project, []))
    assert found["outputs/cpu/a.json"].endswith("is not accepted: unsigned (no .sig beside it)")


def test_a_file_changed_after_it_was_written_fails_the_stage(project, key, monkeypatch, capsys):
    monkeypatch.setenv(SIGNING_KEY_ENV, str(key.path))
    assert _stage(project, "--tamper") == 2
    assert "outputs/cpu/a.json changed after it was written" in capsys.readouterr().err
    assert not (project / "outputs/run-records").exists()


def test_a_missing_signing_key_is_one_line_and_runs_nothing(project, monkeypatch, capsys):
    monkeypatch.setenv(SIGNING_KEY_ENV, str(project / "no-such-key"))
    assert _stage(project) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == f"error: {SIGNING_KEY_ENV}={project / 'no-such-key'}: no such key file"
    assert not (project / "outputs/cpu/a.json").exists()


def test_an_import_record_says_so_and_refuses_uncommitted_files(project, key):
    (project / "outputs/cpu/old.json").write_text("{}\n")
    for args in (["init", "-q"], ["add", "."], ["-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "x"]):
        subprocess.run(["git", *args], cwd=project, check=True)
    trust(project, key)
    [(path, count)] = attest_imported(project, [project / "outputs/cpu"], key)
    record, _ = read_record(path)
    assert count == 1 and record.predicate.recorded == "at import" and "not at measurement" in record.predicate.note
    assert record.predicate.commit and _findings(project, []) == []
    assert [r["wall"] for r in run_record_rows(project)] == ["—"]  # an import timed no run
    (project / "outputs/cpu/new.csv").write_text("1\n")
    with pytest.raises(AlignattError, match="uncommitted change"):
        attest_imported(project, [project / "outputs/cpu"], key)


def test_a_bare_public_key_is_trusted_under_its_comment(key, tmp_path):
    text = trusted_lines([Path(str(key.path) + ".pub")])
    assert text.startswith('ci-ephemeral namespaces="alignatt-run-record" ssh-ed25519 ')
    data = tmp_path / "d.txt"
    data.write_text(json.dumps({"x": 1}))
    sig = key.sign(data)
    with Verifier(text) as v:
        assert v.signer_of(data.read_bytes(), sig) == ("ci-ephemeral", "")
        assert v.signer_of(b"other bytes", sig)[0] is None


def test_attest_from_the_command_line(project, tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from alignatt.cli import app

    runner = CliRunner()
    missing = runner.invoke(app, ["attest"])
    assert missing.exit_code == 2 and "no signing key" in missing.output
    assert len(missing.output.strip().splitlines()) == 1
    made = runner.invoke(app, ["attest", "--new-key", "dev-host"])
    assert made.exit_code == 0 and (project / "keys/private/signing_key").exists()
    assert (project / "keys/allowed_signers").read_text().startswith('dev-host namespaces="alignatt-run-record" ')
    again = runner.invoke(app, ["attest", "--new-key", "dev-host"])
    assert again.exit_code == 2 and "not overwriting a key" in again.output
    (project / "outputs/cpu/old.json").write_text("{}\n")
    done = runner.invoke(app, ["attest"])
    assert done.exit_code == 0 and "outputs/run-records/imported/cpu.intoto.jsonl: 1 file(s)" in done.output
    assert _findings(project, []) == []
