"""The options of the measuring commands whose artifacts record them: `alignatt smoke`, `soak`,
`failover`, `replicas` and `load` (all but its configurations), each knob declared once.

They sit in the schema, under `measure/`, because the artifact records them as they are: the CLI
builds a command's options from its model (`cli/options.py:model_options`), params.yaml sections
validate against it, and the artifact's `config` is the same model (smoke, soak and load: a record
model that subclasses it and adds what the run measured). The commands import their model from
here; `load` adds its typed configurations (measure/load_configurations.py), recorded by label.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import AliasChoices, Field, field_validator

from alignatt.capture.names import DEFAULT_SEAM
from alignatt.core.policy import DEFAULT_PRESET
from alignatt.models.presets import DEFAULT_MODEL
from alignatt.record.artifacts.base import _Strict


class ServedModel(_Strict):
    """What a command that serves a model is told about it (smoke and load share these; load's
    configurations name their vLLM modes, measure/load_configurations.py)."""

    model: str = Field(DEFAULT_MODEL, description="model preset or local checkpoint")
    seam: str = Field(DEFAULT_SEAM, description="capture seam: hf_eager | hf_qk_fast | vllm_capture")
    preset: str = Field("balanced", description="latency preset of the sessions")
    device: str = Field("cpu", description="torch device of the served engine (cpu, cuda, cuda:N)")
    dtype: str | None = Field(None, description="float32 | bfloat16 (default: the model's)")
    top_k: int = Field(4, ge=1, description="alignment heads used")
    heads: str | None = Field(None, description="head-set file or bundled name (default: the model's)")


class ServedModelOptions(ServedModel):
    vllm_mode: str | None = Field(None, description="vllm_capture only: eager | cudagraph | fullgraph | compiled "
                                                    "(default: the served one, serve/config.py SERVED_VLLM_OPTIONS)")


class LoadKnobs(ServedModel):
    """`alignatt load`'s knobs but its configurations: `measure/capacity.py:LoadOptions` adds those
    (typed changes to the server, measure/load_configurations.py), and a load artifact records them
    by label beside these (record/artifacts/load.py:LoadRecord)."""

    speakers: list[int] = Field(default_factory=lambda: [1, 2, 4],
                                description="load levels: concurrent speakers, comma-separated")
    streams: list[str] = Field(default_factory=lambda: ["smoke", "long"],
                               description="streams speakers replay in turn: smoke, long, speech:<clip> or paths")
    speed: float = Field(1.0, gt=0, description="replay speed (1.0: real time)")
    stagger_s: float = Field(0.14, ge=0, validation_alias=AliasChoices("stagger_s", "stagger"),
                             description="seconds between speakers' starts (speaker i starts at i x this)")
    pacing: Literal["lockstep", "realtime"] = Field(
        "lockstep", description="lockstep: an update waits for its reply; realtime: sent when due, never waits")
    clients: Literal["processes", "threads"] = Field(
        "processes", description="processes: speakers in client processes of their own (alignatt.replay."
                                 "speakers); threads: in the server's process (contends for its GIL)")
    speakers_per_process: int = Field(16, ge=1, description="speaker threads per client process")
    prefix_caching: bool | None = Field(None, description="vllm_capture: vLLM prefix caching (default: the server's, on)")
    max_num_seqs: int | None = Field(None, ge=1, description="vllm_capture: the engine's batch limit")
    engines: int | Literal["auto"] = Field(1, description="the server's engines per route: a number, or auto (one "
                                                          "per visible GPU on cuda) (ServerConfig.engines)")
    capture_cost: Literal["auto", "on", "off"] = Field(
        "auto", description="captured vs uncaptured wall per batch (auto: on CUDA with vllm_capture)")
    capture_cost_batches: list[int] = Field(default_factory=lambda: [1, 8, 32, 64],
                                            description="batch sizes of the capture-cost measurement")
    capture_cost_tokens: int = Field(16, ge=1, description="tokens each capture-cost draft decodes (fixed length)")
    capture_cost_repeats: int = Field(3, ge=1, description="timed passes per capture-cost batch size (their median is kept)")
    profile_dir: str | None = Field(None, description="capture cost: torch-profile batch 1 and the largest "
                                                      "batch, captured and uncaptured, a folder per configuration")
    engine_profile_dir: str | None = Field(None, description="cProfile each engine process over each level "
                                                             "(alignatt.serve.engine_profile); slows what it profiles")
    kernel_profile_speakers: list[int] = Field(default_factory=list, description="at these levels, trace the GPU "
                                               "kernels of each engine process's steps (alignatt.serve.step_anatomy)")
    kernel_profile_steps: int = Field(100, ge=1, description="steps the kernel profile traces (the engine stops "
                                      "stepping while their trace is reduced)")
    kernel_profile_after_s: float = Field(60.0, ge=0, description="seconds into the level the kernel profile starts")


class SmokeOptions(ServedModelOptions):
    speed: float | None = Field(None, gt=0, description="replay speed (default: the stream file's, 4x)")
    client: Literal["auto", "native", "wlk", "both"] = Field(
        "auto", description="native | wlk | both | auto (both when WhisperLiveKit imports)")
    wlk_latency: Literal["quality", "balanced", "low"] = Field(
        "balanced", description="the WhisperLiveKit client's latency name (its --alignatt-latency)")
    stream: str | None = Field(None, description="stream JSON, or speech:<clip> (a bundled recognised stream); "
                                                 "default: the bundled smoke stream")


class SoakOptions(_Strict):
    model: str = Field(DEFAULT_MODEL, description="model preset or local checkpoint")
    seam: str = Field(DEFAULT_SEAM, description="capture seam: hf_eager | hf_qk_fast | vllm_capture")
    device: str = Field("cpu", description="torch device of the served engine (cpu, cuda, cuda:N)")
    dtype: str | None = Field(None, description="float32 | bfloat16 (default: the model's)")
    heads: str | None = Field(None, description="head-set file or bundled name (default: the model's)")
    preset: str = Field(DEFAULT_PRESET, description="latency preset of the well-formed sessions")
    minutes: float = Field(30.0, gt=0, description="how long sessions keep starting")
    clients: int = Field(3, ge=1, le=8, description="client threads (concurrent sessions)")
    hostile_share: float = Field(0.5, ge=0, le=1, description="share of sessions that are hostile")
    sample_s: float = Field(5.0, gt=0, description="RSS / descriptor sampling period")
    settle_s: float = Field(20.0, ge=0, description="wait after the load before the final RSS")
    reply_timeout_s: float = Field(300.0, gt=0, description="a reply later than this is a silent session")
    init_timeout_s: float = Field(2.0, gt=0, description="the server's init timeout (idle sockets)")
    idle_hold_s: float = Field(60.0, gt=0, description="how long the idle-flood case holds its 32 sockets")
    max_sessions_total: int = Field(100_000, ge=1, description="sessions started, at most")
    seed: int = Field(0, description="seed of the session mix (which case, which sentence)")


class ServersUnderFaults(ServedModelOptions):
    """What a measurement that starts servers and faults them under real-time speakers takes besides
    its own knobs (each declares `streams`, `speed` and `faults`, parsed here)."""

    start_timeout_s: float = Field(600.0, gt=0, description="servers loaded and listening within this (s)")
    seam_factory: str | None = Field(None, description="module:function building the seams (tests: stand-ins); "
                                                       "None: `alignatt serve`'s own")
    seam_options: dict[str, Any] = Field(default_factory=dict, description="the route's seam options "
                                                                           "(vllm_mode joins them)")

    @field_validator("faults", mode="before", check_fields=False)
    @classmethod
    def _faults(cls, value: Any) -> Any:
        return parse_faults(value)

    @field_validator("streams", mode="before", check_fields=False)
    @classmethod
    def _streams(cls, value: Any) -> Any:
        return split_streams(value)


class FailoverOptions(ServersUnderFaults):
    engines: int = Field(3, ge=2, description="engine processes on the one device (3: one survives a kill and "
                                              "a stop)")
    speakers: int = Field(16, ge=1, description="concurrent real-time speakers, each reconnecting when told")
    streams: list[str] = Field(default_factory=lambda: ["long"],
                               description="streams speakers replay in turn: smoke, long, speech:<clip> or paths")
    speed: float = Field(1.5, gt=0, description="replay speed (1.0: real time)")
    stagger_s: float = Field(0.1, ge=0, description="seconds between speakers' starts")
    faults: list[tuple[Literal["kill", "stop"], float]] = Field(
        default_factory=lambda: [("kill", 25.0), ("stop", 50.0)],
        description="action@seconds after the speakers start; kill = SIGKILL, stop = SIGSTOP, each on the "
                    "live engine with most sessions")
    step_deadline_s: float = Field(10.0, gt=0, validation_alias=AliasChoices("step_deadline_s", "step_deadline"),
                                   description="the server's hung-engine deadline (s)")
    heartbeat_s: float = Field(1.0, gt=0, validation_alias=AliasChoices("heartbeat_s", "heartbeat"),
                               description="the server's engine heartbeat (s)")


def parse_faults(value: Any) -> Any:
    """`action@seconds` items, comma-separated or a list ("kill@25,stop@50")."""
    if isinstance(value, str):
        value = value.split(",")
    out = []
    for item in value:
        if isinstance(item, str):  # "kill@25"
            action, _, at = item.strip().partition("@")
            item = (action, float(at))
        out.append(item)
    return out


def split_streams(value: Any) -> Any:
    return [s.strip() for s in value.split(",") if s.strip()] if isinstance(value, str) else value


class ReplicasOptions(ServersUnderFaults):
    """`alignatt replicas`: replicas behind HAProxy, faulted under real-time speakers."""

    replicas: int = Field(3, ge=2, description="`alignatt serve` processes behind the balancer, one engine each")
    speakers: int = Field(12, ge=1, description="concurrent real-time speakers through the balancer, each "
                                                "reconnecting when told")
    streams: list[str] = Field(default_factory=lambda: ["smoke"],
                               description="streams speakers replay in turn: smoke, long, speech:<clip> or paths")
    speed: float = Field(1.0, gt=0, description="replay speed (1.0: real time)")
    stagger_s: float = Field(0.1, ge=0, description="seconds between speakers' starts")
    faults: list[tuple[Literal["kill", "drain", "restart"], float]] = Field(
        default_factory=lambda: [("kill", 8.0), ("drain", 16.0)],
        description="action@seconds after the speakers start; kill = SIGKILL (the replica's process group), "
                    "drain = SIGTERM, restart = SIGTERM then the replica started again (a rolling restart's "
                    "step); each on the live replica holding the most sessions, never one faulted before")
    drain_s: float = Field(10.0, ge=0, description="each replica's ServerConfig.drain_s: how long an open "
                                                   "utterance may finish before its session is handed over")
    reconnect_bound_s: float = Field(5.0, gt=0, description="a session told to reconnect must answer again "
                                                            "within this of the notice (s)")
    health_check: bool = Field(True, description="the balancer checks /health (off: to see what it is for)")
    check_interval_ms: int = Field(500, ge=50, description="the balancer's /health interval")
    haproxy: str = Field("haproxy", description="the HAProxy binary")
    rtt_probes: int = Field(200, ge=10, description="ping round trips each way (direct, balanced), interleaved")
