"""The offline GPU host's stage runner and collector (deploy/offline-host): stages run in order,
detached, a failed one does not stop the next, and what comes back holds each artifact's run record
with its signature and each instance-log folder whole, never a deleted path, even after a later
stage stopped part-way reset the workspace. And the carry is not packed with a requirement unmet."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "deploy" / "offline-host"

pytestmark = pytest.mark.skipif(shutil.which("git") is None or shutil.which("setsid") is None,
                                reason="needs git and setsid")

# stands in for DVC: writes an artifact and its run record's signature; the stage `bad` fails, and
# `stopped` fails after resetting the workspace, as `dvc exp run` does when it is stopped part-way
FAKE_DVC = """#!/bin/bash
printf '%s\\n' "$@"  # to the stage's log: the options it was given, one a line
sed 's/^/params: /' params.yaml; echo "x: 1" >> params.yaml  # as `dvc exp run -S` leaves its change
args=("$@"); for i in "${!args[@]}"; do [ "${args[$i]}" = -s ] && stage="${args[$((i + 1))]}"; done
if [ "$stage" = stopped ]; then git checkout -q -- outputs; git clean -fdq outputs; exit 143; fi
echo "$stage" > "outputs/h200/$stage.json"; echo sig > "outputs/run-records/$stage.intoto.jsonl.sig"
echo "$stage" > "outputs/h200/eval_instances/index.jsonl"  # its instance logs: one file changed
[ "$stage" != bad ]
"""


def _host(tmp_path: Path) -> Path:
    prefix = tmp_path / "host"
    (prefix / "bin").mkdir(parents=True)
    checkout = prefix / "checkout"
    for d in ("outputs/h200/eval_instances/row", "outputs/run-records"):
        (checkout / d).mkdir(parents=True)
    (checkout / "outputs/h200/eval_instances/row/instances.log").write_text("the same after the run")
    (checkout / "outputs/h200/old.json").write_text("old")
    (checkout / "outputs/h200/gone.json").write_text("gone")
    (checkout / "params.yaml").write_text("profile: cpu\n")
    git = ["git", "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run(["git", "init", "-q"], cwd=checkout, check=True)
    subprocess.run(["git", "add", "-A"], cwd=checkout, check=True)
    subprocess.run([*git, "commit", "-qm", "carried"], cwd=checkout, check=True)
    (checkout / "outputs/h200/gone.json").unlink()  # a stage's out, removed before it runs
    dvc = prefix / "bin" / "dvc"
    dvc.write_text(FAKE_DVC)
    dvc.chmod(0o755)
    (prefix / "env.sh").write_text(f"export PATH={prefix / 'bin'}:$PATH\n")
    return prefix


def test_stages_run_in_order_detached_and_collect_brings_back_records_with_signatures(tmp_path):
    prefix = _host(tmp_path)
    env = {**os.environ, "PREFIX": str(prefix)}
    subprocess.run(["bash", str(SCRIPTS / "stages.sh"), "bad", "good", "stopped"], env=env, check=True)
    log = prefix / "logs" / "stages.log"
    for _ in range(100):
        if log.exists() and "done" in log.read_text():
            break
        time.sleep(0.1)
    lines = [line.split()[:-1] for line in log.read_text().splitlines()]  # less the time
    assert lines[:6] == [["start", "bad", "->", "bad.log"], ["exit", "bad", "1"], ["start", "good", "->", "good.log"],
                         ["exit", "good", "0"], ["start", "stopped", "->", "stopped.log"], ["exit", "stopped", "143"]]
    assert not (prefix / "checkout/outputs/h200/good.json").exists()  # the workspace was reset
    out = tmp_path / "back.tgz"
    subprocess.run(["bash", str(SCRIPTS / "collect.sh"), str(out)], env=env, check=True, capture_output=True)
    names = set(subprocess.run(["tar", "-tzf", str(out)], capture_output=True, text=True, check=True).stdout.split())
    assert {"outputs/h200/good.json", "outputs/run-records/good.intoto.jsonl.sig", "outputs/h200/bad.json"} <= names
    assert "outputs/h200/gone.json" not in names and "outputs/h200/old.json" not in names
    # an instance-log folder whole, the files the run wrote the same too
    assert {"outputs/h200/eval_instances/index.jsonl", "outputs/h200/eval_instances/row/instances.log"} <= names
    assert any(n.endswith("logs/good.log") for n in names)


def test_a_stage_may_carry_more_dvc_options_in_shell_quoting(tmp_path):
    prefix = _host(tmp_path)
    env = {**os.environ, "PREFIX": str(prefix)}
    entry = "good -S 'profiles.h200.load.configurations=[{a: 1}, {b: 2}]' -S profiles.h200.load.speakers=\"128\""
    subprocess.run(["bash", str(SCRIPTS / "stages.sh"), entry], env=env, check=True)
    log = prefix / "logs" / "stages.log"
    for _ in range(100):
        if log.exists() and "done" in log.read_text():
            break
        time.sleep(0.1)
    assert "exit good 0" in log.read_text()
    assert (prefix / "logs" / "good.log").read_text().splitlines()[:10] == [
        "exp", "run", "-S", "profile=h200", "-s", "good", "-S", "profiles.h200.load.configurations=[{a: 1}, {b: 2}]",
        "-S", "profiles.h200.load.speakers=128"]


def test_a_stage_run_twice_keeps_both_logs_and_each_starts_from_the_commits_params(tmp_path):
    prefix = _host(tmp_path)
    env = {**os.environ, "PREFIX": str(prefix)}
    subprocess.run(["bash", str(SCRIPTS / "stages.sh"), "good -S streams=smoke", "good"], env=env, check=True)
    log = prefix / "logs" / "stages.log"
    for _ in range(100):
        if log.exists() and "done" in log.read_text():
            break
        time.sleep(0.1)
    first, second = (prefix / "logs" / "good.log").read_text(), (prefix / "logs" / "good.2.log").read_text()
    assert "streams=smoke" in first and "streams=smoke" not in second
    # the first run changed params.yaml; the second saw the commit's, not the first's change
    assert [line for line in second.splitlines() if line.startswith("params: ")] == ["params: profile: cpu"]
    assert "-> good.2.log" in log.read_text()


def test_stages_without_a_stage_is_a_usage_error(tmp_path):
    done = subprocess.run(["bash", str(SCRIPTS / "stages.sh")], env={**os.environ, "PREFIX": str(tmp_path)},
                          capture_output=True, text=True)
    assert done.returncode == 2 and "usage" in done.stderr


def _dist(name: str, version: str, *requires: str) -> str:
    return "".join([f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
                    *(f"Requires-Dist: {r}\n" for r in requires)])


def _carry(tmp_path: Path, wheels: dict[str, str]) -> tuple[Path, Path]:
    """A bundle (an xz tar in parts, as build-vllm-bundle.sh writes) holding vLLM, and a wheels folder."""
    import io
    import tarfile
    import zipfile
    site, bundle, folder = tmp_path / "site", tmp_path / "bundle", tmp_path / "wheels"
    (site / "vllm-0.22.1.dist-info").mkdir(parents=True)
    (site / "vllm-0.22.1.dist-info/METADATA").write_text(_dist(
        "vllm", "0.22.1", "torch==2.11.0", "loguru", "bar>=2", "winonly; sys_platform == 'win32'", "x; extra == 'y'"))
    bundle.mkdir()
    tar = io.BytesIO()
    with tarfile.open(fileobj=tar, mode="w") as t:
        t.add(site, arcname=".")
    packed = subprocess.run(["xz", "-c"], input=tar.getvalue(), capture_output=True, check=True).stdout
    (bundle / "part0").write_bytes(packed[: len(packed) // 2])
    (bundle / "part1").write_bytes(packed[len(packed) // 2:])
    folder.mkdir()
    for name, version in wheels.items():
        with zipfile.ZipFile(folder / f"{name}-{version}-py3-none-any.whl", "w") as z:
            z.writestr(f"{name}-{version}.dist-info/METADATA", _dist(name, version))
    return bundle, folder


@pytest.mark.skipif(shutil.which("xz") is None, reason="needs xz")
def test_carry_gaps_names_each_requirement_neither_carried_nor_explained(tmp_path):
    gaps = [sys.executable, str(SCRIPTS / "carry_gaps.py")]
    bundle, wheels = _carry(tmp_path / "a", {"bar": "1.0"})
    done = subprocess.run([*gaps, str(bundle), str(wheels)], capture_output=True, text=True)
    assert done.returncode == 1
    # loguru is not carried, bar is too old; torch is the host's (not-carried.txt), the rest do not apply
    assert sum(line.startswith("carry gap:") for line in done.stderr.splitlines()) == 2
    assert "loguru: required by vllm (loguru), not carried" in done.stderr
    assert "bar: required by vllm (bar>=2), carried 1.0" in done.stderr
    bundle, wheels = _carry(tmp_path / "b", {"bar": "2.1", "loguru": "0.7.3"})
    done = subprocess.run([*gaps, str(bundle), str(wheels)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
