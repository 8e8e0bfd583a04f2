"""The typer app every command group registers on, its one error rule, and the shared options.

Commands parse options, check what can be checked (alignatt.cli.preflight), call one function,
print. Expected failures (`AlignattError`, an options model's `ValidationError`) become one clear
line on stderr and exit code 2.
"""

from __future__ import annotations

from typing import NoReturn

import typer
from pydantic import ValidationError
from typer.core import TyperGroup

from alignatt.capture.names import DEFAULT_SEAM
from alignatt.core.errors import AlignattError
from alignatt.core.policy import DEFAULT_PRESET, PRESET_NAMES
from alignatt.models.presets import DEFAULT_MODEL


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


def one_line(error: ValidationError, prefix: str = "") -> str:
    """A pydantic error as one line: the first bad field and why (the rest follow from fixing it)."""
    first = error.errors()[0]
    where = ".".join(map(str, first["loc"]))
    why = first["msg"].removeprefix("Value error, ")  # a validator's own message says it all
    return f"{prefix}{where}: {why}" if where else f"{prefix}{why}"


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


# The options of the commands that serve a model (serve, smoke, load, soak, eval): declared once.
MODEL = typer.Option(DEFAULT_MODEL, help="model preset or local checkpoint")
SEAM = typer.Option(DEFAULT_SEAM, help="capture seam: hf_eager | hf_qk_fast | vllm_capture")
PRESET = typer.Option(DEFAULT_PRESET, help=f"latency preset: {' | '.join(PRESET_NAMES)}")
DEVICE = typer.Option("cpu")
DTYPE = typer.Option(None, help="float32 | bfloat16 (default: the model's)")
TOP_K = typer.Option(4, "--top-k", help="alignment heads used")
HEADS = typer.Option(None, help="head-set file or bundled name (default: the model's)")
VLLM_MODE = typer.Option(None, help="vllm_capture only: eager | cudagraph | fullgraph | compiled (default cudagraph)")


def main() -> None:
    app()
