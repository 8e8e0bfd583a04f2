"""A profile of an engine process's own thread (its steps, submits and replies), on request.

The load benchmark asks for one around a level (`alignatt load --engine-profile-dir`): the child
runs `cProfile` from `Profile(path)` to `Profile(None)`, then writes the statistics to `path` (for
`python -m pstats`) and the functions with the most time of their own to `path` + `.txt`. The
profiler's own overhead slows the child, so a profiled level's timings are not comparable with an
unprofiled one's: it says where the time goes, not how much there is.
"""

from __future__ import annotations

import cProfile
import io
import pstats
from pathlib import Path
from typing import Optional

from alignatt.serve.engine_messages import Profiled

TOP = 40  # functions listed in the text summary


class StepProfiler:
    """The child's profile between two `Profile` messages."""

    def __init__(self) -> None:
        self._profile: Optional[cProfile.Profile] = None
        self._path: Optional[Path] = None

    def toggle(self, path: Optional[str]) -> Profiled:
        """Start a profile to be written to `path`, or (None) stop the running one and write it."""
        if path is not None:
            if self._profile is not None:
                raise RuntimeError(f"engine process: a profile to {self._path} is already running")
            self._path = Path(path)
            self._path.parent.mkdir(parents=True, exist_ok=True)
            self._profile = cProfile.Profile()
            self._profile.enable()
            return Profiled(None, "")
        if self._profile is None:
            raise RuntimeError("engine process: no profile is running")
        self._profile.disable()
        profile, written, self._profile = self._profile, self._path, None
        profile.dump_stats(str(written))
        text = io.StringIO()
        pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(TOP)
        written.with_name(written.name + ".txt").write_text(text.getvalue())
        return Profiled(str(written), text.getvalue())
