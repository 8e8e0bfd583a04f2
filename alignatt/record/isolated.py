"""One pipeline step in a child Python process of its own, so that each vLLM engine has a process.

vLLM does not promise that a second engine starts cleanly in a process that ran one (the bench
and the GPU checks run each engine in its own process for that reason). A step that needs several
engines one after another (the load benchmark's configurations, its capture cost) runs each part
through `run_in_child`: the target is a module-level function that takes and returns plain JSON
data; the child's log goes to this process's stderr, and a failed child raises with its exit code.

    python -m alignatt.record.isolated MODULE:FUNCTION IN_JSON OUT_JSON
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

from alignatt.core.errors import AlignattError


def resolve(target: str) -> Callable[[dict], Any]:
    module, _, name = target.partition(":")
    if not module or not name:
        raise AlignattError(f"isolated target {target!r}: expected MODULE:FUNCTION")
    fn = getattr(importlib.import_module(module), name, None)
    if not callable(fn):
        raise AlignattError(f"isolated target {target!r}: no such function")
    return fn


def run_in_child(target: str, payload: dict, what: str) -> Any:
    """`target(payload)` in a child process; its JSON result. `what` names it in errors."""
    resolve(target)  # a typo fails here, before a child starts
    with tempfile.TemporaryDirectory(prefix="alignatt-isolated-") as tmp:
        given, out = Path(tmp) / "in.json", Path(tmp) / "out.json"
        given.write_text(json.dumps(payload), encoding="utf-8")
        done = subprocess.run([sys.executable, "-m", "alignatt.record.isolated", target, str(given), str(out)])
        if done.returncode != 0 or not out.exists():
            raise AlignattError(f"{what} failed in its own process (exit {done.returncode}; its log is above)")
        return json.loads(out.read_text(encoding="utf-8"))


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 3:
        print("usage: python -m alignatt.record.isolated MODULE:FUNCTION IN_JSON OUT_JSON", file=sys.stderr)
        return 2
    try:
        result = resolve(args[0])(json.loads(Path(args[1]).read_text(encoding="utf-8")))
    except AlignattError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    out = Path(args[2])
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(result), encoding="utf-8")
    tmp.replace(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
