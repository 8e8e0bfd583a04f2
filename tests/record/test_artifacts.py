"""The artifact schema family: validation, deterministic writing, and the published readers."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from alignatt.record.artifacts import (
    Check,
    EnvArtifact,
    FastPathEvent,
    MeasurementArtifact,
    ServerSmokeArtifact,
    artifact_json,
    env_artifact,
    load_artifact,
    measurement_artifact,
    parse_artifact,
    write_artifact,
)
from alignatt.record.published import PUBLISHED_SEAM_NAMES, read_published
from alignatt.core.errors import AlignattError
from alignatt.record.provenance import collect_provenance
from tests.support.report_fixtures import smoke_record

ROOT = Path(__file__).resolve().parents[2]
PUBLISHED = ROOT / "outputs" / "published"


def test_published_manifest_matches_the_committed_files():
    entries = [line.split() for line in (PUBLISHED / "SHA256SUMS").read_text().splitlines() if line]
    assert len(entries) == 4
    for digest, name in entries:
        assert hashlib.sha256((PUBLISHED / name).read_bytes()).hexdigest() == digest, name
    assert sorted(p.name for p in PUBLISHED.glob("*.json")) == sorted(n for _, n in entries)


def test_published_benchmarks_read_as_they_are():
    for path in sorted(PUBLISHED.glob("mt_capture_speed_benchmark_*.json")):
        raw = json.loads(path.read_text())
        a = read_published(path)
        assert a.kind == "bench"
        for published_name, stats in raw["seams"].items():
            ours = PUBLISHED_SEAM_NAMES[published_name]
            assert a.seam_medians[ours] == stats["median_per_generated_token_ms"]
            assert a.seam_rows(ours) == stats["rows"] and len(stats["rows"]) == 48
        if "config" in raw:  # the 2026-07-02 files carry a partial provenance
            cfg = raw["config"]
            assert a.date == cfg["timestamp"][:10] and a.gpu == cfg["gpu_name"]
            assert a.versions == {"vllm": cfg["vllm_version"], "torch": cfg["torch_version"]}
            assert a.vllm_mode == cfg["vllm_mode"]
        else:  # 2026-04-20: only its date, from the file name
            assert (a.date, a.gpu, a.vllm_mode) == ("2026-04-20", None, None)
            assert a.versions == {"vllm": None, "torch": None} and a.provenance_fields == []


def test_published_smoke_reads_summary_and_events():
    path = PUBLISHED / "mt_server_smoke_a100_20260709.json"
    raw = json.loads(path.read_text())
    a = read_published(path)
    assert a.kind == "server_smoke" and a.date == "2026-07-09"
    assert a.gpu.startswith("NVIDIA A100")  # named only by the file
    assert a.smoke.summary.fast_path_events == raw["summary"]["fast_path_events"]
    assert len(a.smoke.events) == raw["summary"]["events"]


def test_a_reshaped_published_file_is_rejected(tmp_path):
    raw = json.loads((PUBLISHED / "mt_capture_speed_benchmark_eager_20260702.json").read_text())
    del raw["seams"]["transformers_eager"]["rows"]
    bad = tmp_path / "x_20260702.json"
    bad.write_text(json.dumps(raw))
    with pytest.raises(AlignattError, match="shape of a published artifact"):
        read_published(bad)


def test_env_artifact_round_trip_and_deterministic_text(tmp_path):
    a = env_artifact("tiny-gemma4")
    assert a.provenance.model_revision == "random weights"
    path = write_artifact(tmp_path / "sub" / "env.json", a)
    assert json.loads(path.read_text())["kind"] == "env"
    again = load_artifact(path)
    assert isinstance(again, EnvArtifact) and again == a
    assert artifact_json(again) == path.read_text()
    assert not list(tmp_path.rglob("*.tmp"))  # written atomically


def test_schema_errors_are_explicit():
    data = json.loads(artifact_json(env_artifact()))
    del data["provenance"]["torch"]
    with pytest.raises(ValidationError, match="torch"):
        parse_artifact(data)
    data = json.loads(artifact_json(env_artifact()))
    data["kind"] = "benchmark"
    with pytest.raises(ValidationError):
        parse_artifact(data)
    data = json.loads(artifact_json(env_artifact()))
    data["schema_version"] = 99
    with pytest.raises(AlignattError, match="schema_version 99"):
        parse_artifact(data)


def test_not_json_is_a_clear_error(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_bytes(b"\xff\xfe{")
    with pytest.raises(AlignattError, match="not valid JSON"):
        load_artifact(bad)
    with pytest.raises(AlignattError, match="no such file"):
        load_artifact(tmp_path / "missing.json")


def test_smoke_and_measurement_artifacts(tmp_path):
    smoke = ServerSmokeArtifact(
        schema_version=1, provenance=collect_provenance(model_id="m"), config=smoke_record(),
        updates=40, finals=6, retractions=0, rtt_ms_p50=120.0, rtt_ms_p95=300.0,
        fast_path_events=[FastPathEvent(seq=7, latency_ms=0.4, engine_calls=0, released_text="Der")],
    )
    assert load_artifact(write_artifact(tmp_path / "s.json", smoke)) == smoke
    m = measurement_artifact("ratio", "captured vs uncaptured decode", {"mode": "cudagraph"},
                             {"ratio": 1.1}, [Check(name="ratio <= 1.15", passed=True)], model="tiny-gemma4")
    assert isinstance(load_artifact(write_artifact(tmp_path / "m.json", m)), MeasurementArtifact)
    assert m.synthetic_weights is True


def test_nan_is_refused():
    smoke = ServerSmokeArtifact(
        schema_version=1, provenance=collect_provenance(), config=smoke_record(), updates=0, finals=0,
        retractions=0, rtt_ms_p50=float("nan"), rtt_ms_p95=None, fast_path_events=[],
    )
    with pytest.raises(ValueError):
        artifact_json(smoke)
