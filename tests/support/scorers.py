"""The field's scorers run as their users run them, for tests that re-score instance logs: OmniSTEval's
`longform` CLI and SimulEval's `--score-only`, each in a subprocess of this interpreter."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

CLI = {"simuleval": "simuleval.cli", "omnisteval": "omnisteval.cli"}


def run_scorer(argv: list[str], cwd: Path | None = None) -> str:
    """`simuleval ...` or `omnisteval ...` as a command line gives it, run by this interpreter (the tools'
    console scripts need not be on PATH); its standard output."""
    cmd = [sys.executable, "-c", f"from {CLI[argv[0]]} import main; main()", *argv[1:]]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=cwd,
                       env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout


def simuleval_printed(stdout: str) -> dict[str, float]:
    """The scores `simuleval --score-only` prints: the last two lines, a header and its values."""
    header, values = [line.split() for line in stdout.strip().splitlines()[-2:]]
    return dict(zip(header, map(float, values[-len(header):])))  # the printed DataFrame leads with its index


def omnisteval_scores(out: Path) -> dict[str, str]:
    """`omnisteval longform --output_folder OUT`'s scores.tsv as {metric: value}."""
    return dict(line.split("\t") for line in (out / "scores.tsv").read_text().splitlines()[1:])


def omnisteval_longform(out: Path, *args: str) -> dict[str, str]:
    """`omnisteval longform ARGS --output_folder OUT`: its scores."""
    run_scorer(["omnisteval", "longform", *args, "--output_folder", str(out)])
    return omnisteval_scores(out)


def simuleval_score(folder: Path, *extra: str, tokenizer: str = "13a") -> dict[str, float]:
    """`simuleval --score-only --output FOLDER` (AL, LAAL, BLEU): its printed scores. SimulEval rewrites
    config.yaml in the folder it scores: hand it a copy."""
    return simuleval_printed(run_scorer(["simuleval", "--score-only", "--output", str(folder), "--latency-metrics",
                                         "AL", "LAAL", "--quality-metrics", "BLEU", "--sacrebleu-tokenizer", tokenizer,
                                         *extra]))
