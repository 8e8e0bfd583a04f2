"""The one versioned schema family for every JSON artifact under `outputs/`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Union

from pydantic import BaseModel, Field, TypeAdapter, ValidationError

from alignatt.core.errors import AlignattError
from alignatt.record.artifacts.base import (ARTIFACT_SCHEMA_VERSION, BENCH_FILE, FINGERPRINT_FILE, KNOWN_SEAMS,
                                            TIMING_KEYS, Check, EnvArtifact, FingerprintArtifact,
                                            MeasurementArtifact)
from alignatt.record.artifacts.bench import (BenchArtifact, BenchConfig, BenchPrompt, BenchRow, ClientSummary,
                                             Divergence, FastPathEvent, MedianSummary, PromptSummary, SeamResult,
                                             ServerSmokeArtifact, SmokeRecord)
from alignatt.record.artifacts.evaluation import (EvalArtifact, EvalInterval, EvalNegativeLatency, EvalPairedTest,
                                                  EvalRecord, EvalRow, TailDescription)
from alignatt.record.artifacts.load import (BalancerRtt, CaptureCostRow, FailoverArtifact, FailoverSession,
                                            LoadArtifact, LoadEngine, LoadLevel, LoadVerification, ReplicasArtifact,
                                            SoakArtifact, SoakRecord, LoadRecord, VerifyEquality)
from alignatt.record.artifacts.options import (EvalKnobs, FailoverOptions, LoadKnobs, ReplicasOptions,
                                              ServedModelOptions, ServersUnderFaults, SmokeOptions, SoakOptions)
from alignatt.record.artifacts.speech import (CAPTION_DELAY, E2EClip, E2EServed, E2EWord, SpeechE2EArtifact,
                                             SpeechE2EOptions)
from alignatt.record.artifacts.suite import GpuTestCase, GpuTestsArtifact, measured_on_gpu
from alignatt.record.digest import sha256_file

__all__ = [  # the schema's public names, wherever they are defined
    "ARTIFACT_SCHEMA_VERSION", "BENCH_FILE", "FINGERPRINT_FILE", "KNOWN_SEAMS", "TIMING_KEYS", "Check", "EnvArtifact",
    "FingerprintArtifact", "MeasurementArtifact", "BenchArtifact", "BenchConfig", "BenchPrompt", "BenchRow",
    "Divergence", "FastPathEvent", "MedianSummary", "PromptSummary", "SeamResult", "ServerSmokeArtifact",
    "ClientSummary", "SmokeRecord", "SoakRecord", "LoadRecord", "LoadKnobs", "FailoverOptions", "ReplicasOptions", "ServedModelOptions",
    "ServersUnderFaults", "SmokeOptions", "SoakOptions",
    "EvalArtifact", "EvalInterval", "EvalNegativeLatency", "EvalPairedTest", "EvalRow", "EvalKnobs", "EvalRecord",
    "TailDescription", "CaptureCostRow",
    "FailoverArtifact", "FailoverSession", "ReplicasArtifact", "BalancerRtt", "LoadArtifact", "LoadEngine", "LoadLevel", "LoadVerification", "VerifyEquality",
    "SoakArtifact", "GpuTestCase", "GpuTestsArtifact", "measured_on_gpu", "Artifact", "AnyArtifact",
    "CAPTION_DELAY", "E2EClip", "E2EServed", "E2EWord", "SpeechE2EArtifact", "SpeechE2EOptions",
    "parse_artifact", "sha256_file", "load_json", "load_artifact", "validation_line", "artifact_json", "env_artifact",
    "fingerprint_artifact", "measurement_artifact", "write_artifact",
]

Artifact = Annotated[
    Union[EnvArtifact, FingerprintArtifact, BenchArtifact, ServerSmokeArtifact, MeasurementArtifact, SoakArtifact,
          EvalArtifact, LoadArtifact, GpuTestsArtifact, FailoverArtifact, ReplicasArtifact, SpeechE2EArtifact],
    Field(discriminator="kind"),
]
AnyArtifact = Union[EnvArtifact, FingerprintArtifact, BenchArtifact, ServerSmokeArtifact, MeasurementArtifact,
                    SoakArtifact, EvalArtifact, LoadArtifact, GpuTestsArtifact, FailoverArtifact, ReplicasArtifact,
                    SpeechE2EArtifact]
_ARTIFACT = TypeAdapter(Artifact)


def parse_artifact(data: Any) -> AnyArtifact:
    """Validate a decoded JSON document; raises pydantic's ValidationError with every problem."""
    if isinstance(data, dict) and data.get("schema_version") not in (None, ARTIFACT_SCHEMA_VERSION):
        raise AlignattError(
            f"schema_version {data.get('schema_version')!r} is not supported "
            f"(this alignatt reads version {ARTIFACT_SCHEMA_VERSION})"
        )
    return _ARTIFACT.validate_python(data)


def load_json(path: str | Path) -> Any:
    path = Path(path)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise AlignattError(f"{path}: no such file") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise AlignattError(f"{path}: not valid JSON ({e})") from None


def validation_line(e: ValidationError) -> str:
    """Every problem pydantic found, on one line: `kind.field.sub: message; ...`."""
    return "; ".join(f"{'.'.join(str(x) for x in err['loc']) or '(document)'}: {err['msg']}" for err in e.errors())


def load_artifact(path: str | Path) -> AnyArtifact:
    try:
        return parse_artifact(load_json(path))
    except ValidationError as e:
        raise AlignattError(f"{path}: not a valid alignatt artifact: {validation_line(e)}") from None


def artifact_json(artifact: BaseModel) -> str:
    """Deterministic text: field order from the schema, no NaN, a trailing newline."""
    data = artifact.model_dump(mode="json")
    return json.dumps(data, indent=1, ensure_ascii=False, allow_nan=False) + "\n"


def env_artifact(model: str | None = None) -> EnvArtifact:
    """What `alignatt env` writes: this machine's provenance (and the model's identity)."""
    from alignatt.record.provenance import collect_provenance, model_identity

    model_id, revision = model_identity(model) if model else (None, None)
    return EnvArtifact(
        schema_version=ARTIFACT_SCHEMA_VERSION,
        provenance=collect_provenance(model_id=model_id, model_revision=revision),
    )


def fingerprint_artifact(model: str | None = None) -> FingerprintArtifact:
    """What the env stage writes: this machine's fingerprint (and the model's identity)."""
    from alignatt.record.provenance import fingerprint_of

    return FingerprintArtifact(schema_version=ARTIFACT_SCHEMA_VERSION,
                               fingerprint=fingerprint_of(env_artifact(model).provenance))


def measurement_artifact(
    name: str,
    description: str,
    config: dict[str, Any],
    results: dict[str, Any],
    checks: list[Check] | None = None,
    model: str | None = None,
) -> MeasurementArtifact:
    """A `MeasurementArtifact` stamped with this machine's provenance (and the model's identity)."""
    from alignatt.record.provenance import collect_provenance, model_identity

    model_id, revision = model_identity(model) if model else (None, None)
    provenance = collect_provenance(model_id=model_id, model_revision=revision)
    return MeasurementArtifact(
        schema_version=ARTIFACT_SCHEMA_VERSION,
        provenance=provenance,
        name=name,
        description=description,
        config=config,
        results=results,
        checks=checks or [],
        synthetic_weights=provenance.synthetic_weights,
    )


def write_artifact(path: str | Path, artifact: BaseModel) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(artifact_json(artifact), encoding="utf-8")
    tmp.replace(path)  # never leave a half-written artifact behind
    from alignatt.record.recorder import note_written

    note_written(path)  # its digest as written, for the stage's run record
    return path
