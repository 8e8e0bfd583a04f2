"""The kernel profile of one load level: where the engine's GPU step time goes, at that level's load.

`alignatt load --kernel-profile-speakers N,M` arms a `KernelWindow` in every engine process some
seconds into each of those levels (so the batch is at its steady size); each child traces its next
steps and writes their anatomy (`alignatt.serve.step_anatomy`), which the level's record holds.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Any

from alignatt.core.errors import AlignattError


class KernelProfiles:
    """The kernel profile of one level (`kernel_profile_speakers`): armed in every engine process
    `kernel_profile_after_s` into the level, read back after it (alignatt.serve.step_anatomy)."""

    def __init__(self, options: Any, mode: str | None, engines: list, speakers: int) -> None:
        self.armed = speakers in options.kernel_profile_speakers
        self._options = options
        self._seams = {e.name: e.seam for e in engines if callable(getattr(e.seam, "kernel_profile", None))}
        if options.kernel_profile_speakers and not self._seams:  # said at the first level, before any is measured
            raise AlignattError(f"kernel_profile_speakers: configuration {mode or options.seam!r} has no engine in a "
                                "process of its own to profile (set own_process=true or engines=N)")
        self._folder = Path(tempfile.mkdtemp(prefix="alignatt-kernels-")) if self.armed else None
        self._timer: threading.Timer | None = None
        self._errors: dict[str, str] = {}

    def _arm(self) -> None:
        for name, seam in self._seams.items():
            try:
                seam.kernel_profile(str(self._folder / f"engine{name}.json"), self._options.kernel_profile_steps)
            except Exception as e:  # noqa: BLE001 - the level goes on; the artifact says why it has no profile
                self._errors[name] = f"{type(e).__name__}: {e}"

    def __enter__(self) -> "KernelProfiles":
        if self.armed:
            self._timer = threading.Timer(self._options.kernel_profile_after_s, self._arm)
            self._timer.daemon = True
            self._timer.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer.join()
            for seam in self._seams.values():  # a window the level did not fill stops here
                try:
                    seam.kernel_profile(None)
                except Exception:  # noqa: BLE001 - a dead engine has no window left to drop
                    pass

    def results(self) -> dict[str, Any]:
        """Each engine's anatomy, or why it has none (the level ended before its window did)."""
        out: dict[str, Any] = {}
        for name in self._seams:
            path = self._folder / f"engine{name}.json"
            if name in self._errors:
                out[name] = {"missing": self._errors[name]}
            elif path.exists():
                out[name] = json.loads(path.read_text())
            else:
                out[name] = {"missing": f"the level ended before {self._options.kernel_profile_steps} steps were "
                                        f"traced from {self._options.kernel_profile_after_s:g} s in"}
        shutil.rmtree(self._folder, ignore_errors=True)
        return out
