"""The `alignatt` command: a thin typer layer over typed functions in the modules.

Each section below belongs to one module; commands parse options, call one function, print.
Expected failures (`AlignattError`) become one clear line on stderr and exit code 2.
"""

from __future__ import annotations

import sys
from typing import NoReturn

import typer

from alignatt.errors import AlignattError

app = typer.Typer(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)


def fail(message: str) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)


# ---- capture core: translate, parity (alignatt.seams / models / prompt) ----

# ---- heads: heads calibrate, heads show (alignatt.heads / calibrate) ----

heads_app = typer.Typer(no_args_is_help=True, help="Alignment head sets: show and calibrate.")
app.add_typer(heads_app, name="heads")


@heads_app.command("show")
def heads_show(
    name: str = typer.Argument(None, help="bundled head-set name or a head-set JSON path; omit to list"),
    model: str = typer.Option(None, "--model", help="show the default head set of this model instead"),
    direction: str = typer.Option("en-de", "--direction"),
    top: int = typer.Option(10, "--top", help="heads to list (0 = all)"),
    as_json: bool = typer.Option(False, "--json", help="print the head set as JSON"),
) -> None:
    """Show a head set (ranked heads and calibration facts), or list the bundled ones."""
    from alignatt import heads

    try:
        if name is None and model is None:
            typer.echo(heads.describe_bundled())
            return
        head_set = heads.default_head_set(model, direction) if model else heads.load_head_set(name)
        if top < 0:
            raise AlignattError(f"--top must be >= 0, got {top}")
        if as_json:
            typer.echo(head_set.to_json(), nl=False)
        else:
            typer.echo(heads.describe_head_set(head_set, top or None))
    except AlignattError as e:
        fail(str(e))


@heads_app.command("calibrate")
def heads_calibrate(
    model: str = typer.Option("gemma3-270m", "--model", help="model preset or local checkpoint"),
    pairs: str = typer.Option(None, "--pairs", help="word-aligned pairs JSON (default: bundled en-de)"),
    max_pairs: int = typer.Option(None, "--max-pairs", help="use only the first N pairs"),
    out: str = typer.Option(..., "--out", help="where to write the head-set JSON"),
    top: int = typer.Option(10, "--top", help="heads to print after calibrating"),
    device: str = typer.Option("cpu", "--device"),
    dtype: str = typer.Option(None, "--dtype", help="float32 | bfloat16 (default: the model's)"),
) -> None:
    """Score every head by how often its source argmax hits the aligned word; write a head set."""
    from alignatt.calibrate import calibrate
    from alignatt.heads import describe_head_set, write_head_set

    try:
        head_set = calibrate(model, pairs, max_pairs=max_pairs, device=device, dtype=dtype)
        path = write_head_set(out, head_set)
    except AlignattError as e:
        fail(str(e))
    typer.echo(describe_head_set(head_set, max(top, 1)))
    typer.echo(f"wrote {path}")


# ---- server: serve, smoke (alignatt.server / smoke) ----

# ---- pipeline: env, bench, report, audit (alignatt.provenance / bench / report / audit) ----


def main() -> None:
    try:
        app()
    except AlignattError as e:  # raised outside a command's own handling
        typer.echo(f"error: {e}", err=True)
        sys.exit(2)


if __name__ == "__main__":
    main()
