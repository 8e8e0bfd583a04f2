"""What the carry's packages require that neither the carry nor the host brings.

Reads the metadata of every distribution in the vLLM bundle (its parts, as build-vllm-bundle.sh
writes them) and in the wheels folder, evaluates each requirement's marker for the GPU host
(CPython 3.12 on Linux x86_64, no extras), and prints each one that no carried distribution
satisfies and that `not-carried.txt` does not name, with who requires it. Exit 1 if any: a gap
found here costs nothing, one found on the host costs a device session (loguru and humming-kernels
were each found there, as an engine that would not start).
Usage: python3 carry_gaps.py BUNDLE_DIR WHEELS_DIR
"""
from __future__ import annotations

import io
import subprocess
import sys
import tarfile
import zipfile
from email.parser import Parser
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

HOST = {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux",
        "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix",
        "implementation_name": "cpython", "platform_python_implementation": "CPython", "extra": ""}
NOT_CARRIED = Path(__file__).with_name("not-carried.txt")


def bundle_metadata(bundle: Path) -> list[str]:
    """Each METADATA file in the bundle's parts (an xz tar split in parts)."""
    parts = sorted(bundle.glob("part*"))
    if not parts:
        raise SystemExit(f"carry_gaps: no part* in {bundle}")
    data = subprocess.run(["xz", "-d", "-c", "-T0"], input=b"".join(p.read_bytes() for p in parts),
                          capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return [tar.extractfile(m).read().decode("utf-8", "replace") for m in tar
                if m.isfile() and m.name.endswith(".dist-info/METADATA")]


def wheel_metadata(wheels: Path) -> list[str]:
    texts = []
    for whl in sorted(wheels.glob("*.whl")):
        with zipfile.ZipFile(whl) as z:
            name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA") and n.count("/") == 1)
            texts.append(z.read(name).decode("utf-8", "replace"))
    return texts


def not_carried() -> dict[str, str]:
    """name -> why the carry leaves it out (the host has it, or no path of alignatt's imports it)."""
    out = {}
    for line in NOT_CARRIED.read_text(encoding="utf-8").splitlines():
        name, _, why = line.partition("#")
        if name.strip():
            out[canonicalize_name(name.strip())] = why.strip()
    return out


def gaps(metadata: list[str], allowed: dict[str, str]) -> list[str]:
    carried: dict[str, Version] = {}
    requires: list[tuple[str, Requirement]] = []
    for text in metadata:
        meta = Parser().parsestr(text, headersonly=True)
        name = canonicalize_name(meta["Name"])
        carried[name] = Version(meta["Version"])
        requires += [(meta["Name"], Requirement(r)) for r in meta.get_all("Requires-Dist") or []]
    found = []
    for who, req in requires:
        if req.marker is not None and not req.marker.evaluate(HOST):
            continue
        name = canonicalize_name(req.name)
        if name in allowed:
            continue
        if name not in carried:
            found.append(f"{req.name}: required by {who} ({req}), not carried")
        elif req.specifier and not req.specifier.contains(carried[name], prereleases=True):
            found.append(f"{req.name}: required by {who} ({req}), carried {carried[name]}")
    return sorted(set(found))


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    bundle, wheels = map(Path, argv)
    found = gaps(bundle_metadata(bundle) + wheel_metadata(wheels), not_carried())
    for line in found:
        print(f"carry gap: {line}", file=sys.stderr)
    if found:
        print(f"carry_gaps: {len(found)} requirement(s) neither carried nor named in {NOT_CARRIED.name}: "
              "add the package to wheels.sh, or say there why the host does without it", file=sys.stderr)
        return 1
    print("carry_gaps: every requirement is carried or named in not-carried.txt")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
