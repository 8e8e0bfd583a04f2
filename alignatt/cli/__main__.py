"""`python -m alignatt.cli`: the command with this interpreter (as `python -m alignatt`)."""

from alignatt.cli import main

main()
