"""Progress of a long command on stderr: what it does, how far along, and the time left.

On a terminal, tqdm's bar (count, rate, ETA). Elsewhere (DVC, CI, a log file) a bar's carriage
returns are noise, so a plain line instead, each time another `step_percent` is done and at
least every `heartbeat_s` while nothing moves (a slow first item still says it is alive):

    eval: 12/703 (2%), 0:41 elapsed, about 0:39:10 left

stdout and the artifacts never see any of it.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import IO, Any

HEARTBEAT_S = 30.0
STEP_PERCENT = 5.0


def clock_text(seconds: float) -> str:
    """Seconds as h:mm:ss, or m:ss under an hour."""
    seconds = int(seconds)
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


class PlainProgress:
    """tqdm's `update`/`close`/`set_postfix_str` and context manager, as plain lines."""

    def __init__(self, total: int | None, desc: str, unit: str = "it", file: IO[str] | None = None,
                 heartbeat_s: float = HEARTBEAT_S, step_percent: float = STEP_PERCENT, clock=time.monotonic):
        self.total, self.desc, self.unit = total, desc, unit
        self.file = file if file is not None else sys.stderr
        self.step_percent, self.heartbeat_s, self._clock = step_percent, heartbeat_s, clock
        self.n, self.note = 0, ""
        self._start = self._last_line = clock()
        self._last_percent = 0.0
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._beat = threading.Thread(target=self._heartbeat, daemon=True, name=f"progress:{desc}")
        self._line("started")
        self._beat.start()

    # tqdm's interface -------------------------------------------------------------------------
    def update(self, n: int = 1) -> None:
        with self._lock:
            self.n += n
            percent = 100.0 * self.n / self.total if self.total else 0.0
            if self.total and (percent - self._last_percent >= self.step_percent or self.n >= self.total):
                self._last_percent = percent
                self._line()

    def set_postfix_str(self, note: str) -> None:
        self.note = note

    def close(self) -> None:
        if self._closed.is_set():
            return
        self._closed.set()
        with self._lock:
            if not self.total or self.n < self.total:
                self._line("stopped" if self.total else "done")

    def __enter__(self) -> PlainProgress:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # lines ------------------------------------------------------------------------------------
    def status(self) -> str:
        elapsed = self._clock() - self._start
        where = f"{self.n}/{self.total} {self.unit}" if self.total else f"{self.n} {self.unit}"
        if self.total:
            where += f" ({100.0 * self.n / self.total:.0f}%)"
        text = f"{self.desc}: {where}, {clock_text(elapsed)} elapsed"
        if self.total and 0 < self.n < self.total:
            text += f", about {clock_text(elapsed / self.n * (self.total - self.n))} left"
        return text + (f" [{self.note}]" if self.note else "")

    def _line(self, word: str = "") -> None:
        self._last_line = self._clock()
        print(self.status() + (f" ({word})" if word else ""), file=self.file, flush=True)

    def _heartbeat(self) -> None:
        while not self._closed.wait(min(1.0, self.heartbeat_s)):
            with self._lock:
                if self._clock() - self._last_line >= self.heartbeat_s and not self._closed.is_set():
                    self._line()


def progress_bar(total: int | None, desc: str, unit: str = "it", enabled: bool = True, file: IO[str] | None = None):
    """A progress display for `total` steps: tqdm on a terminal, plain lines elsewhere, nothing
    when not `enabled`. Use as a context manager; call `update(n)` as steps finish."""
    stream = file if file is not None else sys.stderr
    if enabled and not _is_terminal(stream):
        return PlainProgress(total, desc, unit, stream)
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit=unit, disable=not enabled, file=stream, dynamic_ncols=True)


def _is_terminal(stream: IO[str]) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def track(items, desc: str, unit: str = "it", enabled: bool = True, total: int | None = None):
    """Iterate over `items` with `progress_bar` advancing one step per item."""
    with progress_bar(total if total is not None else len(items), desc, unit, enabled) as bar:
        for item in items:
            yield item
            bar.update(1)


class timed_bar:  # noqa: N801 - used like a function, as a context manager
    """A bar over an expected duration (a replay paced in real time): advanced by the clock, once a
    second, up to `expected_s`; it closes when the work ends, early or late."""

    def __init__(self, expected_s: float, desc: str, enabled: bool = True):
        self.total = max(1, round(expected_s))
        self.bar = progress_bar(self.total, desc, "s", enabled)
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._tick, daemon=True, name=f"timed:{desc}")

    def _tick(self) -> None:
        shown = 0
        start = time.monotonic()
        while not self._done.wait(1.0):
            now = min(self.total, int(time.monotonic() - start))
            if now > shown:
                self.bar.update(now - shown)
                shown = now

    def __enter__(self) -> timed_bar:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._done.set()
        self._thread.join()
        self.bar.close()
