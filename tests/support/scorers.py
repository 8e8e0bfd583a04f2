"""The field's scorers run as their users run them, for tests that re-score instance logs: OmniSTEval's
`longform` CLI and SimulEval's `--score-only`, each in a subprocess of this interpreter."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def omnisteval_longform(out: Path, *args: str) -> dict[str, str]:
    """`omnisteval longform ARGS --output_folder OUT`: its scores.tsv as {metric: value}."""
    cmd = [sys.executable, "-c", "from omnisteval.cli import main; main()", "longform", *args,
           "--output_folder", str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    return dict(line.split("\t") for line in (out / "scores.tsv").read_text().splitlines()[1:])


def simuleval_score(folder: Path, *extra: str, tokenizer: str = "13a") -> dict[str, float]:
    """`simuleval --score-only --output FOLDER` (AL, LAAL, BLEU): its printed scores. SimulEval rewrites
    config.yaml in the folder it scores: hand it a copy."""
    cmd = [sys.executable, "-c", "from simuleval.cli import main; main()", "--score-only", "--output", str(folder),
           "--latency-metrics", "AL", "LAAL", "--quality-metrics", "BLEU", "--sacrebleu-tokenizer", tokenizer,
           *extra]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert r.returncode == 0, r.stderr[-2000:]
    header, values = [line.split() for line in r.stdout.strip().splitlines()[-2:]]
    return dict(zip(header, map(float, values[-len(header):])))  # the printed DataFrame leads with its index
