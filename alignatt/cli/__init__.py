"""The `alignatt` command: a thin typer layer over typed functions in the modules, one module per group."""

from alignatt.cli import drafting, serving, stages  # noqa: F401 - each registers its commands on `app`
from alignatt.cli.app import app, fail, main, validated  # noqa: F401
