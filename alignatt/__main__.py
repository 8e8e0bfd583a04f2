"""`python -m alignatt ...`: the CLI with this interpreter, whatever a console script names."""

from alignatt.cli import main

main()
