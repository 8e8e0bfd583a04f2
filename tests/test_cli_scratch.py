"""A command tried by hand writes to git-ignored runs/<command>-<UTC time>/ and says where; an
explicit --out (what the DVC stages pass) is used as given."""

from __future__ import annotations

import re
from pathlib import Path

from typer.testing import CliRunner

from alignatt.cli import app
from alignatt.cli.app import scratch_out

ROOT = Path(__file__).resolve().parents[1]


def test_env_without_out_writes_to_runs_and_says_where(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["env"])
    assert result.exit_code == 0, result.output
    (written,) = list((tmp_path / "runs").glob("env-*/env.json"))
    assert re.fullmatch(r"env-\d{8}T\d{6}Z", written.parent.name)
    assert f"writing to {written.relative_to(tmp_path)}" in result.output
    assert not (tmp_path / "outputs").exists()


def test_an_explicit_out_is_kept():
    assert scratch_out("outputs/cpu/server_smoke.json", "smoke", "server_smoke.json") == "outputs/cpu/server_smoke.json"


def test_runs_is_git_ignored_and_every_stage_passes_its_out():
    import yaml

    assert "/runs/" in (ROOT / ".gitignore").read_text().splitlines()
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    for name, stage in stages.items():
        body = stage.get("do", stage)
        commands = body["cmd"] if isinstance(body["cmd"], list) else [body["cmd"]]
        for cmd in commands:
            writes = re.search(r"alignatt (env|bench|smoke|load|eval|test-gpu|soak|failover)\b", cmd)
            if writes:
                assert "--out outputs/" in cmd, (name, cmd)
