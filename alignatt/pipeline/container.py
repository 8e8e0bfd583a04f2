"""The stage wrapper: every DVC stage runs `stages/run-stage CMD...`, which lands here.

With `container.engine: none` (params.yaml) the command runs on the host, with this Python's
bin directory first on PATH, and `alignatt` itself runs as `python -m alignatt` with this Python
(a GPU image's console script can name another interpreter than the one that has the packages). With
`docker`, `podman` or `apptainer` it runs inside the configured image, with the checkout
bind-mounted at the same absolute path and first on PYTHONPATH (the code measured is the code
committed, not an older copy baked into the image), and with the image reference, digest and config
id exported as `ALIGNATT_CONTAINER_IMAGE` / `_DIGEST` / `_ID`, which provenance records.

The wrapper passes the command through unchanged: each stage command reads its own options from
params.yaml (`--profile ${profile}`, pipeline/params.py:stage_options). It reads the selected
profile only for its device: a `cuda` profile gets the GPUs inside the container.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from alignatt.record.artifacts import sha256_file
from alignatt.core.errors import AlignattError
from alignatt.record.provenance import CONTAINER_DIGEST_ENV, CONTAINER_ID_ENV, CONTAINER_IMAGE_ENV

# Host variables a containerised stage still needs: offline switches, caches, device selection.
DEFAULT_PASSTHROUGH = [
    "ALIGNATT_CACHE", "HF_HOME", "HF_HUB_CACHE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE",
    "CUDA_VISIBLE_DEVICES", "PYTHONUNBUFFERED", "VLLM_*",
]


class ContainerConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    engine: Literal["none", "docker", "podman", "apptainer"] = "none"
    image: str = ""  # docker/podman image reference, or path to an Apptainer .sif
    mounts: list[str] = Field(default_factory=list)  # extra host paths bound at the same path
    env: list[str] = Field(default_factory=lambda: list(DEFAULT_PASSTHROUGH))


def load_container_config(params: dict[str, Any]) -> ContainerConfig:
    try:
        cfg = ContainerConfig.model_validate(params.get("container") or {})
    except ValidationError as e:
        raise AlignattError(f"container params: {e}") from None
    if cfg.engine != "none" and not cfg.image:
        raise AlignattError(f"container.engine is {cfg.engine!r} but container.image is empty")
    return cfg


# ---- images -----------------------------------------------------------------------------------


def _require(binary: str) -> str:
    path = shutil.which(binary)
    if path is None:
        raise AlignattError(
            f"container.engine needs {binary!r}, which is not on PATH here; "
            "set container.engine: none in params.yaml to run on the host"
        )
    return path


class ImageIdentity(BaseModel):
    """What names one build of an image: its config id and its digest (a registry's, or podman's
    manifest digest of a local build, which changes on every rebuild; the SIF's SHA-256 for
    apptainer, where both are that)."""

    image_id: str
    digest: str


def image_identity(engine: str, image: str, must_exist: bool = True) -> ImageIdentity | None:
    """The identity of `image` as `engine` has it here; None if it is not there (and not must_exist)."""
    if engine == "apptainer":
        if not Path(image).is_file() and not must_exist:
            return None
        digest = file_digest(image)
        return ImageIdentity(image_id=digest, digest=digest)
    binary = shutil.which(engine) if not must_exist else _require(engine)
    if binary is None:
        return None
    done = subprocess.run([binary, "image", "inspect", image], capture_output=True, text=True)
    if done.returncode != 0:
        if not must_exist:
            return None
        raise AlignattError(
            f"{engine} image {image!r} not found: build it with `{engine} build -f containers/Containerfile "
            f"-t {image} .` (docs/pipeline.md, In a container)"
        )
    info = json.loads(done.stdout)[0]
    image_id = info["Id"] if info["Id"].startswith("sha256:") else f"sha256:{info['Id']}"
    repo_digests = info.get("RepoDigests") or []
    digest = repo_digests[0].split("@", 1)[1] if repo_digests else (info.get("Digest") or image_id)
    return ImageIdentity(image_id=image_id, digest=digest)


def file_digest(path: str) -> str:
    try:
        return "sha256:" + sha256_file(path)
    except OSError as e:
        raise AlignattError(f"apptainer image {path}: {e.strerror}") from None


def _passthrough(names: list[str], environ: dict[str, str]) -> dict[str, str]:
    picked = {}
    for key, value in sorted(environ.items()):
        if any(key == n or (n.endswith("*") and key.startswith(n[:-1])) for n in names):
            picked[key] = value
    return picked


def container_command(
    cfg: ContainerConfig,
    args: list[str],
    root: Path,
    identity: ImageIdentity,
    environ: dict[str, str],
    gpus: bool = False,
    uid_gid: str | None = None,
) -> list[str]:
    """The full docker/podman/apptainer command line that runs `args` inside the image."""
    root_s = str(root)
    env = {
        **_passthrough(cfg.env, environ),
        CONTAINER_IMAGE_ENV: cfg.image,
        CONTAINER_DIGEST_ENV: identity.digest,
        CONTAINER_ID_ENV: identity.image_id,
        "PYTHONPATH": root_s,
    }
    binds = [root_s, *cfg.mounts]
    if cfg.engine in ("docker", "podman"):
        # podman takes docker's command line; its GPUs come through CDI (nvidia-ctk cdi generate)
        cmd = [cfg.engine, "run", "--rm", *(["--init"] if cfg.engine == "docker" else [])]
        if gpus:
            cmd += ["--gpus", "all"] if cfg.engine == "docker" else ["--device", "nvidia.com/gpu=all"]
        if uid_gid:  # outputs in the checkout stay owned by the user, not root
            cmd += ["--user", uid_gid, "-e", "HOME=/tmp"]
        for b in binds:
            cmd += ["-v", f"{b}:{b}"]
        cmd += ["-w", root_s]
        for key, value in env.items():
            cmd += ["-e", f"{key}={value}"]
        return [*cmd, cfg.image, *args]
    if cfg.engine == "apptainer":
        cmd = ["apptainer", "exec"]
        if gpus:
            cmd.append("--nv")
        for b in binds:
            cmd += ["--bind", b]
        cmd += ["--pwd", root_s]
        for key, value in env.items():
            cmd += ["--env", f"{key}={value}"]
        return [*cmd, cfg.image, *args]
    raise AlignattError(f"no container command for engine {cfg.engine!r}")


def host_environment(environ: dict[str, str]) -> dict[str, str]:
    env = dict(environ)
    env.pop(CONTAINER_IMAGE_ENV, None)  # a host run must not inherit a stale image name
    env.pop(CONTAINER_DIGEST_ENV, None)
    env.pop(CONTAINER_ID_ENV, None)
    bindir = str(Path(sys.executable).parent)
    env["PATH"] = bindir + os.pathsep + env.get("PATH", "")
    return env


def stage_command(
    args: list[str], params: dict[str, Any], root: Path, environ: dict[str, str] | None = None
) -> tuple[list[str], dict[str, str]]:
    """(argv, environment) to run one stage command as params.yaml configures it."""
    from alignatt.pipeline.params import profile_of

    environ = dict(os.environ if environ is None else environ)
    if not args:
        raise AlignattError("run-stage: no command given")
    cfg = load_container_config(params)
    if cfg.engine == "none":
        if args[0] == "alignatt":  # this interpreter's CLI: a console script may name another Python
            args = [sys.executable, "-m", "alignatt", *args[1:]]
        return args, host_environment(environ)
    identity = image_identity(cfg.engine, cfg.image)
    uid_gid = f"{os.getuid()}:{os.getgid()}" if hasattr(os, "getuid") else None
    gpus = profile_of(params)[1].device.startswith("cuda")  # a GPU profile gets the GPUs in the container
    return container_command(cfg, args, root, identity, environ, gpus, uid_gid), environ


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="stages/run-stage",
        description="Run one pipeline stage command on the host or in the configured container.",
    )
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    ns = parser.parse_args(argv)
    args = ns.command[1:] if ns.command[:1] == ["--"] else ns.command
    from alignatt.pipeline.params import load_params

    try:
        params = load_params(ns.params)
        cmd, env = stage_command(args, params, Path.cwd().resolve())
    except AlignattError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print("run-stage: " + " ".join(cmd), file=sys.stderr, flush=True)
    from alignatt.record.recorder import record_run  # runs cmd; leaves the signed record of what it wrote

    return record_run(cmd, env, Path.cwd().resolve(), params)


if __name__ == "__main__":
    sys.exit(main())
