"""Which lock file the environment was installed from, and whether it still matches it.

`make install` (and the container build, and the GPU host's set-up) write the lock's path and
SHA-256 to `<sys.prefix>/alignatt-lock.txt`; `ALIGNATT_LOCK` names a lock file instead. Provenance
records the lock's hash and the installed distributions whose versions differ from its pins, so
an artifact says not only "installed from this lock" but also how far the environment drifted.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import re
import sys
from pathlib import Path

from pydantic import BaseModel, ConfigDict

LOCK_ENV = "ALIGNATT_LOCK"
MARKER = "alignatt-lock.txt"
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s\\;]+)")


class LockState(BaseModel):
    model_config = ConfigDict(extra="forbid")

    path: str  # as installed, relative to the checkout ("requirements/cpu.txt")
    sha256: str
    # "name: pinned != installed" for each pinned distribution installed at another version
    # (or "not installed"); empty when the environment is exactly the lock's
    differing: list[str]


def pins(lock_text: str) -> dict[str, str]:
    """{normalised name: version} of a pip/uv lock file's `name==version` lines."""
    out = {}
    for line in lock_text.splitlines():
        m = _PIN.match(line.strip())
        if m:
            out[_normalise(m.group(1))] = m.group(2)
    return out


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _installed(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def drift(lock_text: str) -> list[str]:
    return [f"{name}: {version} != {installed}"
            for name, version in sorted(pins(lock_text).items())
            if (installed := _installed(name)) != version]


def installed_lock(root: Path | None = None) -> LockState | None:
    """The lock this interpreter's environment was installed from; None when none is recorded."""
    named = os.environ.get(LOCK_ENV)
    if not named:
        marker = Path(sys.prefix) / MARKER
        if not marker.is_file():
            return None
        named = marker.read_text().split()[0]
    path = Path(named)
    if not path.is_absolute():
        path = (root or Path(__file__).resolve().parents[2]) / path
    try:
        data = path.read_bytes()
    except OSError:
        return None
    return LockState(path=named, sha256=hashlib.sha256(data).hexdigest(),
                     differing=drift(data.decode()))
