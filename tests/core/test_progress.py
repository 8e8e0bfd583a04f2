"""Progress on stderr: a bar on a terminal; elsewhere a plain line every few percent and at least
every heartbeat, so a DVC or CI log shows what a long command does, how far along, and the time left."""

from __future__ import annotations

import io
import time

from alignatt.core.progress import PlainProgress, progress_bar, timed_bar, track


class _Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_plain_lines_every_few_percent_with_count_and_time_left():
    out, clock = io.StringIO(), _Clock()
    with PlainProgress(40, "eval vllm_capture", "stream", out, heartbeat_s=3600, step_percent=5, clock=clock) as bar:
        for _ in range(40):
            clock.t += 2.0
            bar.update(1)
    lines = out.getvalue().splitlines()
    assert lines[0] == "eval vllm_capture: 0/40 stream (0%), 0:00 elapsed (started)"
    assert "eval vllm_capture: 2/40 stream (5%), 0:04 elapsed, about 1:16 left" in lines
    assert lines[-1] == "eval vllm_capture: 40/40 stream (100%), 1:20 elapsed"
    assert 20 <= len(lines) <= 22  # one per 5 %, not one per step
    assert "\r" not in out.getvalue()


def test_a_heartbeat_line_while_nothing_moves():
    out = io.StringIO()
    with PlainProgress(10, "load fullgraph", "level", out, heartbeat_s=0.05):
        time.sleep(0.4)
    beats = [line for line in out.getvalue().splitlines() if line.startswith("load fullgraph: 0/10 level (0%)")]
    assert len(beats) >= 3  # started, at least one heartbeat, stopped


def test_not_a_terminal_gives_plain_lines_and_a_terminal_gives_a_bar():
    class Tty(io.StringIO):
        def isatty(self):
            return True

    plain = progress_bar(3, "x", file=io.StringIO())
    assert isinstance(plain, PlainProgress)
    plain.close()
    bar = progress_bar(3, "x", file=Tty())
    assert not isinstance(bar, PlainProgress) and type(bar).__name__ == "tqdm"
    bar.close()
    assert progress_bar(3, "x", enabled=False, file=io.StringIO()).disable


def test_track_and_timed_bar_report_on_stderr_only(capsys):
    assert list(track([1, 2, 3], "calibrating heads", "pair")) == [1, 2, 3]
    with timed_bar(2.0, "smoke: native client replays the stream"):
        time.sleep(1.2)
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "calibrating heads: 3/3 pair (100%)" in captured.err
    assert "smoke: native client replays the stream: 1/2 s (50%)" in captured.err
