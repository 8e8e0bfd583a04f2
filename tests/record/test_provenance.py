"""The provenance block: every field present, missing pieces explicit, git and model identity."""

from __future__ import annotations

import importlib.metadata
import subprocess
from pathlib import Path

import pytest
import torch
from pydantic import ValidationError

from alignatt.record import provenance
from alignatt.record.provenance import NOT_INSTALLED, Provenance, collect_provenance, git_state, model_identity


def test_collect_records_every_field_and_this_machine():
    p = collect_provenance(model_id="m", model_revision="r")
    data = p.model_dump()
    assert set(data) == set(Provenance.model_fields)  # nothing absent, not even None values
    assert p.torch == importlib.metadata.version("torch")
    assert p.transformers == importlib.metadata.version("transformers")
    assert p.timestamp_utc.endswith("Z") and len(p.timestamp_utc) == 20
    assert (p.model_id, p.model_revision) == ("m", "r")
    assert p.container_image == "host" and p.container_digest is None
    if not torch.cuda.is_available():
        assert (p.gpu_count, p.gpus, p.driver, p.cuda_runtime) == (0, [], None, None)
    else:
        assert p.gpu_count == torch.cuda.device_count() and p.gpus[0].memory_mib > 0


def test_packages_that_are_absent_say_so():
    assert provenance.package_version("surely-not-an-installed-package") == NOT_INSTALLED
    try:
        import vllm  # noqa: F401
    except ImportError:
        assert collect_provenance().vllm == NOT_INSTALLED


def test_a_missing_key_or_an_extra_key_fails_validation():
    data = collect_provenance().model_dump()
    del data["vllm"]
    with pytest.raises(ValidationError, match="vllm"):
        Provenance.model_validate(data)
    data = collect_provenance().model_dump()
    data["gpu"] = "A100"
    with pytest.raises(ValidationError, match="gpu"):
        Provenance.model_validate(data)


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout


def test_git_state_clean_dirty_and_generated_paths(tmp_path, monkeypatch):
    assert git_state(tmp_path) == (None, None)  # not a work tree
    monkeypatch.setenv(provenance.GIT_COMMIT_ENV, "a" * 40)  # a copy made elsewhere says which
    monkeypatch.setenv(provenance.GIT_DIRTY_ENV, "0")
    assert git_state(tmp_path) == ("a" * 40, False)
    monkeypatch.setenv(provenance.GIT_DIRTY_ENV, "maybe")
    assert git_state(tmp_path) == ("a" * 40, None)
    _git(tmp_path, "init", "-q")
    (tmp_path / "code.py").write_text("x = 1\n")
    (tmp_path / "outputs").mkdir()
    (tmp_path / "outputs" / "a.json").write_text("{}\n")
    _git(tmp_path, "add", ".")
    _git(tmp_path, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "init")
    monkeypatch.setenv(provenance.GIT_DIRTY_ENV, "0")
    # a commit this .git does not hold: the tree was copied with a stale .git, the declaration wins
    assert git_state(tmp_path) == ("a" * 40, False)
    first = _git(tmp_path, "rev-parse", "HEAD").strip()
    (tmp_path / "code.py").write_text("x = 0\n")
    _git(tmp_path, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qam", "second")
    monkeypatch.setenv(provenance.GIT_COMMIT_ENV, first)  # a commit git knows: git itself wins
    commit, dirty = git_state(tmp_path)
    assert len(commit) == 40 and commit != first and dirty is False
    (tmp_path / "outputs" / "a.json").write_text('{"new": 1}\n')
    assert git_state(tmp_path)[1] is False  # a pipeline output is not a code change
    (tmp_path / "keys").mkdir()
    (tmp_path / "keys" / "allowed_signers").write_text("vm-20261207 ssh-ed25519 AAAA\n")
    assert git_state(tmp_path)[1] is False  # nor is a machine's key that `make pipeline` trusted
    (tmp_path / "new_module.py").write_text("y = 1\n")
    assert git_state(tmp_path)[1] is True  # an untracked module is code that runs
    (tmp_path / "new_module.py").unlink()
    (tmp_path / "code.py").write_text("x = 2\n")
    assert git_state(tmp_path)[1] is True


def test_model_identity_of_presets_paths_and_hf_cache(tmp_path, monkeypatch):
    model_id, rev = model_identity("gemma3-270m")
    assert rev == provenance.package_version(model_id)
    assert model_identity("tiny-gemma4")[1] == "random weights"
    hub = tmp_path / "hub"
    ref = hub / "models--google--gemma-4-E4B-it" / "refs"
    ref.mkdir(parents=True)
    (ref / "main").write_text("0123abcd" * 5)
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    assert model_identity("gemma4-e4b") == ("google/gemma-4-E4B-it", "0123abcd" * 5)
    snapshot = tmp_path / "snapshots" / ("f" * 40)
    snapshot.mkdir(parents=True)
    assert model_identity(str(snapshot)) == (str(snapshot.resolve()), "f" * 40)
    assert model_identity("no/such-model") == ("no/such-model", None)


def test_fingerprint_is_provenance_without_when(monkeypatch):
    from alignatt.record.provenance import Fingerprint, fingerprint_differences, fingerprint_of

    a, b = collect_provenance(model_id="m", model_revision="r"), collect_provenance(model_id="m", model_revision="r")
    assert set(Fingerprint.model_fields) < set(Provenance.model_fields)
    assert not {"timestamp_utc", "load_average", "git_commit", "git_dirty", "params_changed",
                "dvc_experiment"} & set(Fingerprint.model_fields)
    assert fingerprint_of(a) == fingerprint_of(b)  # whatever the clock or the load did in between
    other = fingerprint_of(a.model_copy(update={"torch": "9.9.9"}))
    assert fingerprint_differences(fingerprint_of(a), other) == [f"torch: {a.torch!r} != '9.9.9'"]


def test_params_edits_are_recorded_not_called_uncommitted_code(tmp_path, monkeypatch):
    """`dvc exp run -S profile=h200` (or an edit by hand) changes params.yaml, not the code."""
    monkeypatch.delenv(provenance.GIT_COMMIT_ENV, raising=False)
    _git(tmp_path, "init", "-q")
    (tmp_path / "code.py").write_text("x = 1\n")
    (tmp_path / "params.yaml").write_text("profile: cpu\nbench:\n  repeats: 3\n  modes: {eager: [a]}\n")
    _git(tmp_path, "add", ".")
    _git(tmp_path, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "init")
    assert provenance.params_changes(tmp_path) == {}
    (tmp_path / "params.yaml").write_text("profile: h200\nbench:\n  repeats: 1\n  modes: {eager: [a]}\n")
    assert git_state(tmp_path)[1] is False
    assert provenance.params_changes(tmp_path) == {"bench.repeats": 1, "profile": "h200"}
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(provenance.DVC_EXP_NAME_ENV, "brisk-lynx")
    p = collect_provenance()
    assert (p.dvc_experiment, p.params_changed) == ("brisk-lynx", {"bench.repeats": 1, "profile": "h200"})
    assert p.git_dirty is False
    (tmp_path / "code.py").write_text("x = 2\n")  # code is still code
    assert git_state(tmp_path)[1] is True
    # artifacts written before these fields existed still validate
    old = p.model_dump()
    del old["dvc_experiment"], old["params_changed"]
    assert Provenance.model_validate(old).params_changed == {}


def test_provenance_does_not_import_the_artifact_schema():
    """artifacts imports provenance (the block it embeds); the other way round would be a cycle."""
    import ast

    tree = ast.parse(Path(provenance.__file__).read_text(encoding="utf-8"))
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert not {m for m in imported if m and m.startswith("alignatt.pipeline")}, imported
