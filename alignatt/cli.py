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
