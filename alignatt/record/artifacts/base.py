"""The shared parts of the artifact schema: strict models, the provenance-bearing base, and the
kinds every stage shares (the machine's env and fingerprint, a free-form measurement with checks).

Writer (every measuring command), auditor and report renderer all use these models, so an
artifact that the auditor accepts is one the report can render. Each artifact carries `kind`,
`schema_version` and a full `Provenance` block. The historical artifacts that predate the schema
are read by `alignatt.record.published`.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from alignatt.capture.names import SEAMS
from alignatt.record.provenance import Fingerprint, Provenance

ARTIFACT_SCHEMA_VERSION = 1
KNOWN_SEAMS = SEAMS
BENCH_FILE = re.compile(r"^bench_([a-z0-9]+)\.json$")  # outputs/<profile>/bench_<vLLM mode>.json
TIMING_KEYS = ("prefill_ms", "decode_ms", "capture_ms", "reconstruct_ms")
FINGERPRINT_FILE = "fingerprint.json"  # outputs/<profile>/fingerprint.json, written by the env stage


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _Artifact(_Strict):
    kind: str  # each artifact narrows this to its Literal (kept first in the JSON)
    schema_version: int
    provenance: Provenance


class EnvArtifact(_Artifact):
    kind: Literal["env"] = "env"


class FingerprintArtifact(_Strict):
    """What the DVC stages depend on: the machine and its stack, without a timestamp or load, so
    that it is byte-identical on every run on an unchanged machine. When each measurement was made
    stays in that measurement's own provenance; the audit checks the two agree."""

    kind: Literal["fingerprint"] = "fingerprint"
    schema_version: int
    fingerprint: Fingerprint


class Check(_Strict):
    name: str
    passed: bool
    detail: str = ""


class MeasurementArtifact(_Artifact):
    """Any other measurement (a speed ratio, a correctness check on the GPU...), with provenance.

    For results that are not a bench run: e.g. captured-vs-uncaptured decode ratios or the
    bit-exactness of graphed capture. The report lists its checks; the audit checks its schema and
    provenance like any other artifact.
    """

    kind: Literal["measurement"] = "measurement"
    name: str  # short identifier, e.g. "vllm_graph_capture_overhead"
    description: str
    config: dict[str, Any]
    results: dict[str, Any]
    checks: list[Check] = Field(default_factory=list)
    synthetic_weights: bool = False
