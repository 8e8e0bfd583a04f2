"""One GPU worker (tests/gpu/*_worker.py) run in a process of its own on a JSON spec; its .npz back.

A capturing vLLM engine binds its hooks for the life of its process, so every engine a GPU test
module needs runs in a worker of its own. fp32 workers get IEEE fp32 in vLLM's Triton attention
too, with a fresh kernel cache so no TF32 kernel is reused."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]


def run_worker(module: str, workdir: Path, name: str, spec: dict, fp32: bool) -> dict:
    spec_path, out = workdir / f"{name}.json", workdir / f"{name}.npz"
    spec_path.write_text(json.dumps(spec))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    if fp32:
        env.update(TRITON_F32_DEFAULT="ieee", TRITON_CACHE_DIR=str(workdir / "triton-cache-ieee"))
    done = subprocess.run([sys.executable, "-m", module, str(spec_path), str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    return dict(np.load(out))
