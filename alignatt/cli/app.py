"""The typer app every command group registers on, and its one error rule.

Commands parse options, check what can be checked (alignatt.cli.preflight), call one function,
print. Expected failures (`AlignattError`, an options model's `ValidationError`) become one clear
line on stderr and exit code 2.
"""

from __future__ import annotations

from typing import NoReturn

import typer
from pydantic import ValidationError
from typer.core import TyperGroup

from alignatt.core.errors import AlignattError
from alignatt.core.options import one_line


def fail(message: str) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)


SCRATCH = "runs"  # git-ignored: what a command run by hand writes, away from the audited outputs/


def scratch_out(out: str | None, command: str, name: str) -> str:
    """`out`, or where a command run by hand writes when no --out is given:
    `runs/<command>-<UTC time>/<name>`, said on stderr. The DVC stages pass --out into outputs/."""
    if out:
        return out
    from datetime import datetime, timezone
    from pathlib import Path

    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    path = Path(SCRATCH) / f"{command}-{stamp}" / name
    typer.echo(f"no --out: writing to {path} (scratch, git-ignored; the pipeline writes outputs/)", err=True)
    return str(path)


class _Commands(TyperGroup):
    """Every command's expected failure becomes one line and exit code 2: an `AlignattError`, or
    a `ValidationError` of an options model built from the command's options."""

    def invoke(self, ctx):  # noqa: ANN001, ANN201 - click's signature
        try:
            return super().invoke(ctx)
        except AlignattError as e:
            fail(str(e))
        except ValidationError as e:
            fail(f"bad option {one_line(e)}")


app = typer.Typer(cls=_Commands, no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)


def validated(options_cls, prefix: str = "", **fields):
    """`options_cls(**fields)`; a bad option is one line (AlignattError), not a traceback."""
    try:
        return options_cls(**fields)
    except ValidationError as e:
        raise AlignattError(one_line(e, prefix)) from None


def main() -> None:
    app()
