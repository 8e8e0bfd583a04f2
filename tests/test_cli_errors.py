"""Expected CLI errors: one line on stderr, exit code 2, before any model loads or anything is measured.

The slow part of each command (serving, the soak, the load run, the bench) is replaced by a function
that fails the test if reached: each case proves its check comes first.
"""

from __future__ import annotations

import socket
import time

import pytest
from typer.testing import CliRunner

from alignatt.cli import app


def _reached(*args, **kwargs):
    raise AssertionError("the slow part ran before the check")


@pytest.fixture(autouse=True)
def _no_slow_part(monkeypatch):
    import alignatt.measure.bench as bench
    import alignatt.measure.capacity as capacity
    import alignatt.measure.soak as soak
    import alignatt.serve.server as server

    monkeypatch.setattr(server, "serve", _reached)
    monkeypatch.setattr(soak, "run_soak", _reached)
    monkeypatch.setattr(capacity, "run_load", _reached)
    monkeypatch.setattr(bench, "run_bench", _reached)


def one_line_error(*argv: str) -> str:
    """Run the command; assert exit 2 and a single stderr line; return that line."""
    result = CliRunner().invoke(app, list(argv))
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert result.exit_code == 2, (result.exit_code, result.output)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


@pytest.mark.parametrize("argv, names", [
    (["--minutes", "0"], "minutes"),
    (["--minutes", "-1"], "minutes"),
    (["--clients", "0"], "clients"),
    (["--clients", "-2"], "clients"),
    (["--seam", "bogus"], "bogus"),
])
def test_soak_bad_option_is_one_line(argv, names):
    assert names in one_line_error("soak", *argv)


def test_load_zero_engines_is_one_line():
    assert "engines" in one_line_error("load", "--engines", "0")


def test_serve_busy_port_names_the_port_fast():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        started = time.monotonic()
        line = one_line_error("serve", "--port", str(port))
        assert time.monotonic() - started < 3
    assert str(port) in line and "in use" in line


def test_serve_port_check_releases_the_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    result = CliRunner().invoke(app, ["serve", "--port", str(port)])
    assert "slow part ran" in str(result.exception)  # the check passed and let go of the port
    with socket.socket() as again:
        again.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        again.bind(("127.0.0.1", port))


def test_serve_missing_config_is_one_line(tmp_path):
    assert "missing.json" in one_line_error("serve", "--config", str(tmp_path / "missing.json"))


def test_serve_unknown_model_says_unknown_model():
    line = one_line_error("serve", "--model", "gemma3-27m")
    assert "unknown model 'gemma3-27m'" in line and "head set" not in line
    assert "did you mean gemma3-270m?" in line


def test_serve_unknown_head_set_is_one_line():
    assert "no-such-heads" in one_line_error("serve", "--heads", "no-such-heads")


@pytest.mark.parametrize("command", ["soak", "load", "smoke"])
def test_served_commands_unknown_model_is_one_line(command, monkeypatch):
    import alignatt.measure.smoke as smoke

    monkeypatch.setattr(smoke, "run_smoke", _reached)
    assert "unknown model" in one_line_error(command, "--model", "gemma3-27m")


def test_bench_add_to_missing_out_fails_before_measuring(tmp_path):
    out = tmp_path / "missing" / "bench.json"
    line = one_line_error("bench", "--add", "--out", str(out), "--params", str(tmp_path / "none.yaml"))
    assert str(out) in line


def test_output_under_a_file_fails_before_measuring(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    assert "a-file" in one_line_error("bench", "--out", str(blocker / "bench.json"),
                                      "--params", str(tmp_path / "none.yaml"))
    assert "a-file" in one_line_error("soak", "--out", str(blocker / "soak.json"))
