"""Which files under outputs/ the page may read: those the pipeline declares.

A file is declared when a `dvc.yaml` stage lists it (outs, metrics or plots, expanded over every
profile of params.yaml and every `foreach` item) or a run record under `outputs/run-records/`
names it (a run imported from another host, e.g. the H200's exploratory load runs). Anything
else, such as an artifact a command run by hand left in outputs/, is ignored by the page, so it
cannot change what the page says. A tree without a dvc.yaml (a test fixture) declares everything.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

_VAR = re.compile(r"\$\{([^}]+)\}")


def _lookup(params: dict[str, Any], dotted: str) -> Any:
    value: Any = params
    for part in dotted.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def _stage_paths(stage: dict[str, Any]) -> list[str]:
    paths = []
    for section in ("outs", "metrics", "plots"):
        for entry in stage.get(section) or []:
            paths.extend(entry if isinstance(entry, dict) else [entry])
    return [str(p) for p in paths]


def _expand(path: str, values: dict[str, str]) -> str | None:
    """The path with its ${...} filled in, or None when it names a variable not known here."""
    missing = [m for m in _VAR.findall(path) if m not in values]
    return None if missing else _VAR.sub(lambda m: values[m[1]], path)


def declared_paths(root: Path, params: dict[str, Any]) -> set[str] | None:
    """Repository-relative paths (files or folders) the pipeline declares; None: no dvc.yaml here."""
    import yaml

    dvc = root / "dvc.yaml"
    if not dvc.is_file():
        return None
    stages = (yaml.safe_load(dvc.read_text(encoding="utf-8")) or {}).get("stages") or {}
    profiles = list(params.get("profiles") or {}) or [params.get("profile")]
    declared: set[str] = set()
    for stage in stages.values():
        if "foreach" in stage:
            items = stage["foreach"]
            if isinstance(items, str):
                ref = _VAR.fullmatch(items.strip())
                items = _lookup(params, ref[1]) if ref else None
            keys = list(items) if isinstance(items, (list, dict)) else []
            body = stage.get("do") or {}
            variants = [(body, {"key": str(k), "item": str(k)}) for k in keys]
        else:
            variants = [(stage, {})]
        for body, values in variants:
            for path in _stage_paths(body):
                for profile in profiles:
                    expanded = _expand(path, {**values, "profile": str(profile)})
                    if expanded:
                        declared.add(expanded.rstrip("/"))
    declared |= recorded_paths(root)
    return declared


def recorded_paths(root: Path) -> set[str]:
    """Every file a run record names (its subjects)."""
    from alignatt.core.errors import AlignattError
    from alignatt.record.attestation import read_record, record_files

    names: set[str] = set()
    for path in record_files(root):
        try:
            record, _ = read_record(path)
        except AlignattError:
            continue  # not a run record: `alignatt audit` reports it
        names.update(record.digests())
    return names


def is_declared(rel: str, declared: set[str] | None) -> bool:
    if declared is None:
        return True
    return rel in declared or any(rel.startswith(d + "/") for d in declared)
