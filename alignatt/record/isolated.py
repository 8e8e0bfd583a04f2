"""The one child-process runner: a step in a Python process of its own, so that each vLLM engine has a process.

vLLM does not promise that a second engine starts cleanly in a process that ran one (the bench
and the GPU checks run each engine in its own process for that reason). A step that needs several
engines one after another (the load benchmark's configurations, its capture cost) runs each part
through `run_in_child`: the target is a module-level function that takes and returns plain JSON
data; the child's log goes to this process's stderr, and a failed child raises with its exit code
and its own error's last line (the child writes it beside OUT_JSON, so it survives a log that a
later run overwrites: the artifact that records the failure names its cause).

    python -m alignatt.record.isolated MODULE:FUNCTION IN_JSON OUT_JSON

`run_module` is the launcher under it, and under the bench's seam worker and the GPU checks'
engine worker too (they keep their own job files): the child's stderr is forwarded live (progress
bars) with its last lines kept for the error message, an optional timeout, and an interrupted
parent never leaves a child running on its own.
"""

from __future__ import annotations

import collections
import importlib
import json
import os
import subprocess
import sys
import tempfile
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from alignatt.core.errors import AlignattError


@dataclass
class ChildExit:
    code: int | None  # None: killed at the timeout
    tail: list[str] = field(default_factory=list)  # the last lines of its stderr

    @property
    def timed_out(self) -> bool:
        return self.code is None


def run_module(module: str, *args: str, env: dict[str, str] | None = None, timeout_s: float | None = None,
               keep: int = 0, stdout: bool = True, python: str | None = None) -> ChildExit:
    """`python -m module args...` in a child; `env` is added to this process's environment.

    keep = 0: the child shares this process's stderr (and stdout unless `stdout=False`) and is
    killed at `timeout_s`. keep > 0: its stderr is forwarded live through a pipe and its last `keep`
    lines kept; no timeout then, because a grandchild (a vLLM engine core) holding the pipe open
    would outlive the kill and keep the reader waiting.
    """
    cmd = [python or sys.executable, "-m", module, *args]
    out = None if stdout else subprocess.DEVNULL
    full_env = dict(os.environ, **(env or {}))
    if keep <= 0:
        proc = subprocess.Popen(cmd, stdout=out, env=full_env)
        try:
            return ChildExit(proc.wait(timeout=timeout_s))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            return ChildExit(None)
        except BaseException:  # interrupted: never leave a child running on its own
            proc.kill()
            proc.wait()
            raise
    if timeout_s is not None:
        raise ValueError("run_module: a timeout needs keep=0 (the child's stderr shared, not piped)")
    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.PIPE, env=full_env)
    assert proc.stderr is not None
    tail: collections.deque[str] = collections.deque(maxlen=keep)
    pending = b""
    try:
        for chunk in iter(lambda: proc.stderr.read1(4096), b""):
            sys.stderr.buffer.write(chunk)
            sys.stderr.flush()
            pending += chunk
            *lines, pending = pending.replace(b"\r", b"\n").split(b"\n")
            tail.extend(line.decode("utf-8", "replace") for line in lines)
    except BaseException:  # interrupted: never leave a child running on its own
        proc.kill()
        proc.wait()
        raise
    if pending:
        tail.append(pending.decode("utf-8", "replace"))
    return ChildExit(proc.wait(), list(tail))


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
        done = run_module("alignatt.record.isolated", target, str(given), str(out))
        if done.code != 0 or not out.exists():
            cause = _error_path(out)
            said = f": {cause.read_text(encoding='utf-8')}" if cause.exists() else ""
            raise AlignattError(f"{what} failed in its own process (exit {done.code}; its log is above){said}")
        return json.loads(out.read_text(encoding="utf-8"))


def _error_path(out: Path) -> Path:
    return out.with_name(out.name + ".error")


def _one_line(error: BaseException, limit: int = 400) -> str:
    text = " ".join(f"{type(error).__name__}: {error}".split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 3:
        print("usage: python -m alignatt.record.isolated MODULE:FUNCTION IN_JSON OUT_JSON", file=sys.stderr)
        return 2
    try:
        result = resolve(args[0])(json.loads(Path(args[1]).read_text(encoding="utf-8")))
    except Exception as e:  # noqa: BLE001 - any failure is reported to the parent, in one line
        expected = isinstance(e, AlignattError)
        if expected:
            print(f"error: {e}", file=sys.stderr)
        else:
            traceback.print_exc()
        _error_path(Path(args[2])).write_text(_one_line(e), encoding="utf-8")
        return 2 if expected else 1
    out = Path(args[2])
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(result), encoding="utf-8")
    tmp.replace(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
