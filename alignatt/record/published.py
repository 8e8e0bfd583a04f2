"""The historical artifacts in `outputs/published/`, read as they are (never rewritten).

They predate the artifact schema (`alignatt.record.artifacts`); `read_published` turns each into a
small normalised view with whatever provenance it carries (often only a date).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from alignatt.capture.names import VLLM_MODES
from alignatt.core.errors import AlignattError
from alignatt.record.artifacts import load_json
from alignatt.record.events import ReplayEvent

# The published tool named its seams differently; ours are the same three measurements.
PUBLISHED_SEAM_NAMES = {
    "transformers_eager": "hf_eager",
    "transformers_qk_fast": "hf_qk_fast",
    "vllm_qk_fast": "vllm_capture",
}
KNOWN_GPU_TOKENS = {  # a GPU named only in a published file's name
    "a100": "NVIDIA A100 (per file name)",
    "h100": "NVIDIA H100 (per file name)",
    "h200": "NVIDIA H200 (per file name)",
}


class _Loose(BaseModel):
    model_config = ConfigDict(extra="allow")


class PublishedSeamStats(_Loose):
    median_per_generated_token_ms: float
    median_total_ms: float
    by_length_bin: dict[str, dict[str, Any]]
    by_spec: dict[str, dict[str, Any]]
    rows: list[dict[str, Any]]


class PublishedBenchConfig(_Loose):
    vllm_mode: str
    model: str
    vllm_version: str
    torch_version: str
    gpu_name: str
    timestamp: str


class PublishedBenchFile(_Loose):
    seams: dict[str, PublishedSeamStats]
    divergences: list[dict[str, Any]]
    config: PublishedBenchConfig | None = None


class PublishedSmokeSummary(_Loose):
    events: int
    finals: int
    retractions: int
    fast_path_events: int
    fast_path_rtt_ms_median: float | None
    commit_rtt_ms_median: float | None
    rtt_ms_p95: float | None


class PublishedSmokeFile(_Loose):
    summary: PublishedSmokeSummary
    events: list[ReplayEvent]


@dataclass
class PublishedArtifact:
    """A normalised, read-only view of one historical artifact."""

    path: Path
    kind: Literal["bench", "server_smoke"]
    date: str | None  # from config.timestamp, else from the file name
    gpu: str | None
    vllm_mode: str | None
    versions: dict[str, str | None]  # vllm / torch as recorded, None where not recorded
    provenance_fields: list[str]  # which provenance facts the file itself records
    bench: PublishedBenchFile | None = None
    smoke: PublishedSmokeFile | None = None
    seam_medians: dict[str, float] = field(default_factory=dict)  # our seam names

    def seam_rows(self, seam: str) -> list[dict[str, Any]]:
        if self.bench is None:
            return []
        for published, ours in PUBLISHED_SEAM_NAMES.items():
            if ours == seam and published in self.bench.seams:
                return self.bench.seams[published].rows
        return []


def _date_from_name(name: str) -> str | None:
    m = re.search(r"(\d{4})(\d{2})(\d{2})\.json$", name)
    return f"{m[1]}-{m[2]}-{m[3]}" if m else None


def _name_token(name: str, choices) -> str | None:
    tokens = re.split(r"[_.\-]", name.lower())
    return next((t for t in tokens if t in choices), None)


def read_published(path: str | Path) -> PublishedArtifact:
    path = Path(path)
    data = load_json(path)
    try:
        if isinstance(data, dict) and "summary" in data:
            smoke = PublishedSmokeFile.model_validate(data)
            gpu_token = _name_token(path.name, KNOWN_GPU_TOKENS)
            return PublishedArtifact(
                path=path,
                kind="server_smoke",
                date=_date_from_name(path.name),
                gpu=KNOWN_GPU_TOKENS[gpu_token] if gpu_token else None,
                vllm_mode=None,
                versions={"vllm": None, "torch": None},
                provenance_fields=[],
                smoke=smoke,
            )
        bench = PublishedBenchFile.model_validate(data)
    except ValidationError as e:
        raise AlignattError(f"{path}: not in the shape of a published artifact:\n{e}") from None
    cfg = bench.config
    return PublishedArtifact(
        path=path,
        kind="bench",
        date=cfg.timestamp[:10] if cfg else _date_from_name(path.name),
        gpu=cfg.gpu_name if cfg else None,
        vllm_mode=cfg.vllm_mode if cfg else _name_token(path.name, VLLM_MODES),
        versions={"vllm": cfg.vllm_version if cfg else None, "torch": cfg.torch_version if cfg else None},
        provenance_fields=sorted(cfg.model_dump(exclude_unset=True)) if cfg else [],
        bench=bench,
        seam_medians={
            PUBLISHED_SEAM_NAMES.get(name, name): stats.median_per_generated_token_ms
            for name, stats in bench.seams.items()
        },
    )
