"""`alignatt speech-e2e` on bad input: one line, exit 2, no artifact, and no server left running."""

from __future__ import annotations

import shutil
import wave
from pathlib import Path

import pytest
from typer.testing import CliRunner

from alignatt.cli import app


def _wav(path, seconds=1.0):
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(b"\0\0" * int(16000 * seconds))
    return path


def _one_line_error(result, starts: str) -> None:
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {starts}"), result.stderr


def test_an_unknown_clip_is_one_line_and_writes_nothing(tmp_path):
    out = tmp_path / "e2e.json"
    result = CliRunner().invoke(app, ["speech-e2e", "--clip", "no_such_clip", "--out", str(out)])
    _one_line_error(result, "unknown clip 'no_such_clip': not a packaged clip (two_cities")
    assert not out.exists()


def test_a_missing_whisperlivekit_server_is_one_line_before_any_server_starts(tmp_path, monkeypatch):
    from alignatt.measure import speech_e2e
    from alignatt.speech import wlk_server

    monkeypatch.setattr(wlk_server.shutil, "which", lambda *a, **k: None)
    monkeypatch.setattr(speech_e2e, "running_servers", lambda *a, **k: pytest.fail("a server was started"))
    out = tmp_path / "e2e.json"
    result = CliRunner().invoke(app, ["speech-e2e", "--clip", str(_wav(tmp_path / "a.wav")), "--out", str(out)])
    _one_line_error(result, "whisperlivekit-server is not installed: pip install")
    assert not out.exists()


def test_a_server_that_does_not_start_is_one_line_and_both_are_stopped(tmp_path, monkeypatch):
    """whisperlivekit-server exits at once: named with its last log line; `alignatt serve`, started
    beside it, is stopped too (its process group is gone)."""
    from alignatt.measure import speech_e2e
    from alignatt.speech import wlk_server

    fake = tmp_path / "whisperlivekit-server"
    fake.write_text("#!/bin/sh\necho 'no model here' >&2\nexit 3\n")
    fake.chmod(0o755)
    monkeypatch.setattr(wlk_server, "wlk_server_exe", lambda: str(fake))
    started = []

    class Recorded(speech_e2e.ServerProcess):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            started.append(self)

    monkeypatch.setattr(speech_e2e, "ServerProcess", Recorded)
    out = tmp_path / "e2e.json"
    result = CliRunner().invoke(app, ["speech-e2e", "--clip", str(_wav(tmp_path / "a.wav")), "--out", str(out),
                                      "--start-timeout-s", "60"])
    _one_line_error(result, "whisperlivekit-server exited (3) before listening: no model here")
    assert not out.exists()
    log = Path(result.stderr.strip().rsplit("(log: ", 1)[1].rstrip(")"))
    assert log.read_text().strip() == "no model here"  # the servers' logs are kept, and named
    shutil.rmtree(log.parent)
    assert len(started) == 1 and started[0].process.poll() is not None  # alignatt serve stopped
    import os

    with pytest.raises(ProcessLookupError):
        os.killpg(started[0].process.pid, 0)  # nothing of its group is left


def test_a_whisperlivekit_that_goes_away_mid_run_is_one_line_naming_the_logs(tmp_path, monkeypatch):
    from contextlib import contextmanager
    from types import SimpleNamespace

    from alignatt.measure import speech_e2e
    from alignatt.measure.server_process import free_port

    @contextmanager
    def gone(options, warmup, workdir):  # noqa: ANN001, ANN202 - servers that listened, then went away
        yield speech_e2e.Servers(f"ws://127.0.0.1:{free_port()}/asr", SimpleNamespace(frames=[], began=0.0), [],
                                 None)

    monkeypatch.setattr(speech_e2e, "running_servers", gone)
    out = tmp_path / "e2e.json"
    result = CliRunner().invoke(app, ["speech-e2e", "--clip", str(_wav(tmp_path / "a.wav")), "--out", str(out)])
    _one_line_error(result, "feeding WhisperLiveKit failed: ConnectionRefusedError")
    assert "(the servers' logs: " in result.stderr and not out.exists()
    shutil.rmtree(result.stderr.strip().rsplit("(the servers' logs: ", 1)[1].rstrip(")"))
