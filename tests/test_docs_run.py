"""Docs that run: every command of the README's "Use it" list and of docs/server.md's `sh` blocks.

Each documented line is parsed by the CLI as written (its command and every option exist and take
the values given), then run in a small form: the documented options with a few appended that make
it small (the tiny random model, one sentence, a short limit, an output in a temporary folder;
the CLI keeps the last value of a repeated option). `serve` runs until interrupted, a soak's
warm-up takes minutes whatever its length and the repository's audit has its own test, so those
three run as `--help`. A line the doc marks "not runnable in the test suite" must give its install on the
lines above it. JSON blocks of docs/server.md that are a `ServerConfig` must validate.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from alignatt.cli import app

ROOT = Path(__file__).resolve().parents[1]
NOT_RUNNABLE = "not runnable in the test suite"
TINY = ["--model", "tiny-gemma4"]
GROUPS = ("heads", "deploy")  # command groups: their commands are two words


def _use_it_lines() -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    block = re.search(r"\n## Use it\n\n((?:    .*\n)+)", text)[1]  # the indented block under the heading
    return [line[4:] for line in block.splitlines()]


def _server_sh_blocks() -> list[list[str]]:
    text = (ROOT / "docs" / "server.md").read_text(encoding="utf-8")
    return [block.splitlines() for block in re.findall(r"```sh\n(.*?)```", text, flags=re.S)]


def _commands(lines: list[str]) -> list[tuple[list[str], str]]:
    """(argv, the comment lines above it) per command: continuation lines joined, `;` split."""
    out, comments, pending = [], [], ""
    for line in lines:
        if line.lstrip().startswith("#") and not pending:
            comments.append(line)
            continue
        pending += line.rstrip("\\") + " "
        if line.endswith("\\"):
            continue
        for part in pending.split(" #", 1)[0].split(";"):  # a trailing comment off; `a; b` is two commands
            argv = shlex.split(part)
            if argv:
                out.append((argv, "\n".join(comments)))
        pending, comments = "", []
    return out


DOCUMENTED = [argv for argv, _ in _commands(_use_it_lines())] + [
    argv for block in _server_sh_blocks() for argv, _ in _commands(block)]


def _parse(argv: list[str]) -> None:
    """Parse as the CLI would, without running: unknown commands or options, bad values raise."""
    command = typer.main.get_command(app)  # typer's own click: duck-typed, its groups resolve commands
    ctx = command.make_context("alignatt", list(argv))
    while hasattr(command, "resolve_command"):
        protected = getattr(ctx, "_protected_args", None) or getattr(ctx, "protected_args", [])
        name, command, rest = command.resolve_command(ctx, [*protected, *ctx.args])
        ctx = command.make_context(name, rest, parent=ctx)


def _small(argv: list[str], tmp: Path) -> list[str] | None:
    """The documented command with what makes it small appended (None: --help only)."""
    out = ["--out", str(tmp / "out.json")]
    head = argv[:2] if argv[0] in GROUPS else argv[:1]
    small = {
        ("translate",): TINY + ["--max-new-tokens", "4"],
        ("parity",): ["--limit", "1", "--max-new-tokens", "3"],
        ("heads", "show"): [],
        ("heads", "calibrate"): TINY + ["--max-pairs", "2"] + out,
        ("serve",): None,  # runs until interrupted
        ("smoke",): TINY + ["--speed", "40"] + out,
        ("load",): TINY + ["--speakers", "1", "--speed", "40"] + out,
        ("soak",): None,  # its warm-up visits every hostile case, minutes even for --minutes 0.05 (tests/measure)
        ("speech-stream",): ["--clip", "beckett"] + out,
        ("speech-e2e",): None,  # two servers and a clip fed as PCM: minutes (tests/speech/test_wlk_server.py, slow)
        ("replicas",): None,  # three servers and HAProxy, a minute at least (tests/measure/test_replicas.py)
        ("deploy", "haproxy"): ["--out", str(tmp / "haproxy.cfg")],
        ("bench",): TINY + ["--seams", "hf_qk_fast", "--repeats", "1", "--warmup", "0", "--max-new-tokens", "2"] + out,
        ("eval",): TINY + ["--limit", "1", "--longform-talks", "0", "--presets", "balanced", "--tails", "none",
                           "--concurrency", "1", "--load-levels", "1", "--bootstrap", "10"] + out,
        ("doctor",): [],
        ("env",): out,
        ("report",): ["--check"],
        ("audit",): None,  # the whole repository's audit has its own test (tests/report/test_audit.py)
    }
    key = tuple(head)
    assert key in small, f"a documented command without a small form here: {argv}"
    return None if small[key] is None else argv + small[key]


def test_every_documented_command_is_found():
    commands = {a[1] for a in DOCUMENTED if a[0] == "alignatt"}
    assert {"translate", "serve", "smoke", "load", "soak", "bench", "eval", "env", "report", "audit"} <= commands
    assert "whisperlivekit-server" in {a[0] for a in DOCUMENTED}


@pytest.mark.parametrize("argv", [a for a in DOCUMENTED if a[0] == "alignatt"], ids=lambda a: " ".join(a[1:4]))
def test_documented_command_parses_and_runs_small(argv, tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)  # relative paths in the docs are relative to the checkout
    argv = argv[1:]
    _parse(argv)
    if "--pairs" in argv and not (ROOT / argv[argv.index("--pairs") + 1]).exists():
        pytest.skip(f"{argv[argv.index('--pairs') + 1]} is the shared data folder, absent here")
    small = _small(argv, tmp_path)
    result = CliRunner().invoke(app, small if small is not None else [*argv[:2 if argv[0] in GROUPS else 1], "--help"])
    assert result.exit_code == 0, f"{' '.join(small or argv)}\n{result.output[-2000:]}"


@pytest.mark.parametrize("block", _server_sh_blocks(), ids=lambda b: b[0][:40])
def test_a_documented_line_that_cannot_run_here_says_so_and_gives_its_install(block):
    for argv, comments in _commands(block):
        if argv[0] == "alignatt":
            continue
        assert NOT_RUNNABLE in comments and "pip install" in comments, (
            f"`{' '.join(argv)}` runs no alignatt command: mark it '{NOT_RUNNABLE}' with its install")


def test_documented_server_configs_validate():
    from alignatt.serve.config import ServerConfig

    text = (ROOT / "docs" / "server.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```json\n(.*?)```", text, flags=re.S)
    inline = re.findall(r"`(\{\"directions\".*?\})`", text)
    assert blocks or inline
    for raw in blocks + inline:
        ServerConfig.model_validate(json.loads(raw))


def test_a_documented_option_that_does_not_exist_fails_the_parse():
    with pytest.raises(Exception, match="No such option: --settle-seconds"):
        _parse(["soak", "--settle-seconds", "0"])
    with pytest.raises(Exception, match="No such command"):
        _parse(["heads", "shw", "x"])
    with pytest.raises(Exception, match="valid number"):
        _parse(["soak", "--minutes", "soon"])
    _parse(["heads", "show", "gemma-4-E4B-it_en-de", "--top", "8"])
