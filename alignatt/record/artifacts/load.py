"""Serving artifacts: the capacity benchmark (`alignatt load`), the soak, and engine failover."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from alignatt.record.artifacts.base import Check, _Artifact, _Strict
from alignatt.record.artifacts.options import FailoverOptions, LoadKnobs, ReplicasOptions, SoakOptions


class LoadEngine(_Strict):
    """One engine of the server over one load level (`Engine.stats()` after less before)."""

    engine: str
    gpu: str | None = None  # the CUDA device its process is pinned to; None: in-process or CPU
    alive: bool = True  # at the end of the level
    sessions: int  # sessions placed on it during the level
    steps: int  # the server's steps on it (with several front ends: those each one took part in, summed)
    batch_sizes: dict[str, int]  # drafts in the engine at a step -> steps (several front ends: each one's own)
    failed: int = 0  # drafts that failed on it
    step_ms_mean: float | None = None  # wall inside the seam's step, per step (None: not recorded)
    step_cpu_ms_mean: float | None = None  # the engine thread's CPU time inside it, per step
    # An engine in a process of its own: step_ms_mean is the server's round trip; these are the child's
    # own steps (one serves every front end's waiting drafts), the drafts in the engine per such step
    # (every front end's), and its wall and CPU per step (taking the step's submits and aborts, then
    # stepping). None: in-process, or (child_steps, child_batch_mean) predates them.
    child_steps: int | None = None
    child_batch_mean: float | None = None
    child_step_ms_mean: float | None = None
    child_cpu_ms_mean: float | None = None
    # Garbage-collector pauses per step (alignatt.serve.gc_pauses): the server's process (all its
    # threads wait, the engine's too when it runs in that process), and the engine's own process.
    gc_ms_mean: float | None = None
    child_gc_ms_mean: float | None = None
    # The seam's own step in parts, wall ms per step (vllm_capture: its STEP_PHASES; older artifacts:
    # vllm, settle, finish, drafts).
    step_phase_ms: dict[str, float] | None = None
    # Per draft delivered: queued in the server's scheduler, then in the engine until its draft was
    # back on the scheduler's thread (an engine process's pipe both ways included). None: predates them.
    draft_queued_ms_mean: float | None = None
    draft_in_engine_ms_mean: float | None = None


class LoadVerification(_Strict):
    """Verified re-drafts over one load level (`alignatt.core.draft.acceptance_level`)."""

    drafts: int
    proposed: int  # proposal tokens the engine scored
    accepted: int  # of them, kept (the agreeing prefix)
    acceptance_rate: float | None  # accepted / proposed (None: nothing proposed, e.g. verification off)
    tokens_per_draft: float | None
    decoded_tokens_per_update: float | None  # tokens decoded one step each, per draft
    forward_steps_per_draft: float | None
    verify_ms_mean: float | None  # the first forward (prefill + verification), per draft
    extend_ms_mean: float | None  # the steps after it, per draft


class KernelTime(_Strict):
    name: str
    ms_per_step: float
    calls: int


class StepAnatomy(_Strict):
    """Where an engine's GPU step time went over a traced window (alignatt.serve.step_anatomy)."""

    steps: int
    window_s: float
    step_wall_ms: float  # the engine thread's time in a step, mean
    gpu_busy_ms: float  # kernels and copies per step, overlaps counted once
    idle_ms: float  # per step, the window's time that no kernel or copy covers (between steps too)
    parts_ms: dict[str, float]  # GPU time per step by part (step_anatomy.ORDER)
    kernels: dict[str, int]  # kernels by part over the window
    tokens: dict[str, int]  # prefill (uncached prompt) and decode tokens the window computed
    top_kernels: list[KernelTime]
    weight_bytes: int | None = None  # what one forward streams of the weights
    weights_gb_per_s: float | None = None  # weight_bytes x steps / window: a floor on the traffic
    bandwidth_share: float | None = None  # of the device's peak
    weight_read_floor_ms: float | None = None  # weight_bytes at peak bandwidth: the fastest a step can be
    tflops: float | None = None  # 2 x active parameters x tokens / window
    flops_share: float | None = None
    largest_part: str | None = None
    peaks: dict[str, float | None]
    device: str
    weights: dict[str, int]  # the seam's weight_bytes(): total, streamed, active_params
    write_s: float | None = None  # how long the engine stopped to write it (None: the artifact predates the field)
    # The host side (None / {}: the artifact predates the fields), per step on the engine thread:
    gpu_wait_ms: float | None = None  # blocked in CUDA synchronisation calls: waiting on the GPU
    host_ms: float | None = None  # the rest of the step's wall: host work
    between_steps_ms: float | None = None  # the engine loop's own time between two steps
    host_ranges_ms: dict[str, float] = {}  # vLLM's host ranges by name (schedule, model-runner phases)


class MissingAnatomy(_Strict):
    missing: str  # why the engine has no anatomy (the level ended first, or the engine refused)


class LoadLevel(_Strict):
    """N concurrent real-time speakers on one server: what they saw."""

    speakers: int
    streams: list[str]  # stream of each speaker, cycled
    wall_s: float
    updates: int
    partial_drafts: int
    partial_rtt_ms_p50: float | None
    partial_rtt_ms_p95: float | None
    partial_rtt_ms_p99: float | None
    final_rtt_ms_p50: float | None
    final_rtt_ms_p95: float | None
    lag_s_max: float  # how far the replays fell behind real time, worst speaker
    lag_s_first_third: float  # mean lag over the first and last third of every speaker's run
    lag_s_last_third: float
    lag_grows: bool  # last third's mean lag exceeds the first third's by more than 0.25 s, or a speaker stopped
    # Speakers that stopped once they fell `LoadRecord.stop_lag_s` behind, and the earliest stream time one
    # stopped at: the level cannot keep up, and its figures cover the streams until the stops.
    stopped_speakers: int = 0
    stopped_at_stream_s: float | None = None
    fast_path_events: int
    engine_steps: int  # summed over the engines: each one's own steps (`LoadEngine.child_steps` if recorded)
    engine_batch_sizes: dict[str, int]  # `LoadEngine.batch_sizes`, summed over the engines
    superseded: int  # partials superseded by a newer update (queued dropped + running aborted)
    peak_gpu_memory_mib: float | None  # torch's peak allocation in this process during the level
    gpu_memory_used_mib: float | None  # device-wide, at the end of the level
    retractions: int
    finals_expected: int
    finals_delivered: int
    finals_in_order: bool
    error_frames: int
    texts_differing_from_alone: int | None = None  # updates whose committed text differs from N=1
    decisions_differing_from_alone: int | None = None  # updates whose path or released text differs
    vllm_mode: str | None = None  # the configuration (vllm_capture's mode) this level ran on
    engines: list[LoadEngine] = Field(default_factory=list)  # per engine; empty in artifacts that predate the field (they still validate)
    gpu_busy_share: float | None = None  # the GPU's mean utilization over the level (a kernel running); None: not sampled
    # The host's CPUs over the level (alignatt.measure.host_cpu): the share in use, and the share the
    # hypervisor took (steal) from a virtual machine's vCPUs. None: not Linux, or the artifact predates them.
    host_cpu_busy_share: float | None = None
    host_cpu_steal_share: float | None = None
    # The server's process over the level (alignatt.measure.host_cpu.loop_shares): its event-loop thread's
    # CPU time per wall second (of one core; near 1: the loop never waited and paced the level), and all
    # its threads' (in cores; the engine's too where it is not in a process of its own). None: predates them.
    server_loop_cpu_share: float | None = None
    server_process_cpu_cores: float | None = None
    # Each of the server process's threads (by name), its CPU time per wall second of the level, in
    # cores: which one paces the level when the process is near a core (one interpreter lock).
    server_thread_cpu_cores: dict[str, float] | None = None
    # The server's other front ends (ServerConfig.front_ends), each process's CPU time per wall second
    # of the level, in cores (the figures above are the first front end's; None in the list: lost
    # before the level's end). None: one front end.
    front_end_cpu_cores: list[float | None] | None = None
    # A partial's time inside the server (from reading its update to sending the reply, the frame's
    # server_ms); the rest of its RTT is the wire, the client and the server's loop reading it late.
    partial_server_ms_p50: float | None = None
    partial_server_ms_p95: float | None = None
    verification: LoadVerification | None = None  # None: the seam does not count it, or the artifact predates the field
    # One speaker alone on a later configuration of the run (verification on, say) against the first
    # (off): updates matched by seq, and how many differ in committed text, in path or released text,
    # and in the buffer shown (with the mean words of buffer shown by this and by the first configuration).
    updates_compared_with_first_configuration: int | None = None
    texts_differing_from_first_configuration: int | None = None
    decisions_differing_from_first_configuration: int | None = None
    buffers_differing_from_first_configuration: int | None = None  # None: the artifact predates the field
    buffer_words_mean: float | None = None
    first_configuration_buffer_words_mean: float | None = None
    # By engine: the kernel profile of this level (`kernel_profile_speakers`); None: not profiled.
    step_anatomy: dict[str, StepAnatomy | MissingAnatomy] | None = None


class CaptureCostRow(_Strict):
    batch: int
    captured_ms: float  # median wall of one draft_many of `batch` prompts, capture on
    uncaptured_ms: float
    ratio: float
    vllm_mode: str | None = None


class VerifyEquality(_Strict):
    """Verified re-drafts against drafting from scratch on the bench prompts, on the engine of one
    configuration with verification on (`measure/verify_equality.py`): each prompt drafted from
    scratch, then with that draft as its proposal."""

    vllm_mode: str
    prompts: int
    tokens_differ: int  # drafts whose tokens differ
    texts_differ: int  # AlignAtt's emitted text on the draft's top heads
    decisions_differ: int  # its emit count or stop reason
    proposed: int
    accepted: int
    row_max_abs_diff: float | None  # on the tokens both drafts share before their first difference


class LoadRecord(LoadKnobs):
    """What a `load` artifact records: the load's knobs as run, its configurations by label (one
    per server measured, `measure/load_configurations.py` reads them back), the streams, and the
    first configuration's engine facts (each configuration's, in a run of several)."""

    vllm_modes: list[str | None]  # the configurations by label (None: the seam's default, unchanged)
    engine_heads: list[tuple[int, int]]  # the engine's alignment heads (layer, head)
    stream_words: dict[str, int]
    stream_seconds: dict[str, float]
    seam_options: dict[str, Any] = Field(default_factory=dict)  # the first configuration's route
    lag_growth_threshold_s: float  # a level's lag "grows" past this (last third against first)
    # the engine's own description and statistics (the seam's describe(), its scheduler, per engine)
    seam_describe: dict[str, Any] | None = None
    max_batch: int | None = None
    scheduler: dict[str, Any] = Field(default_factory=dict)
    per_engine: list[dict[str, Any]] = Field(default_factory=list)
    engines_by_configuration: dict[str, dict[str, Any]] | None = None  # a run of several: each one's facts

    @model_validator(mode="before")
    @classmethod
    def _historical(cls, data: Any) -> Any:
        """Artifacts written before the knobs were recorded whole kept the engine's heads under
        `heads`, each configuration's engine facts under `engines` and the labels joined under
        `vllm_mode`, and most of them the model's preset under `preset`: the heads and facts move to
        their fields, the joined labels (a copy of `vllm_modes`) and the model's preset go, and a knob
        they did not record (the latency preset among them) reads as its default."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        if isinstance(data.get("heads"), list):
            data["engine_heads"], data["heads"] = data["heads"], None
        if isinstance(data.get("engines"), dict):
            data["engines_by_configuration"] = data.pop("engines")
        if "vllm_mode" in data and "vllm_modes" in data:
            del data["vllm_mode"]
        if isinstance(data.get("preset"), dict):  # the model's preset, recorded by mistake under the latency preset's name
            del data["preset"]
        if "stop_lag_s" not in data:  # before speakers could stop behind: every stream ran to its end
            data["stop_lag_s"] = None
        return data

    @property
    def configurations_label(self) -> str | None:
        """The configurations' labels joined (None: only the seam's default)."""
        return ",".join(m for m in self.vllm_modes if m) or None

    def engine_of(self, label: str | None) -> dict[str, Any]:
        """The engine facts of the configuration a label names (the first's, in a run of one)."""
        return (self.engines_by_configuration or {}).get(str(label)) or {
            "seam_describe": self.seam_describe, "max_batch": self.max_batch, "scheduler": self.scheduler,
            "per_engine": self.per_engine}


class LoadArtifact(_Artifact):
    kind: Literal["load"] = "load"
    config: LoadRecord
    synthetic_weights: bool
    levels: list[LoadLevel]
    capture_cost: list[CaptureCostRow] = Field(default_factory=list)
    capture_cost_note: str = ""  # why it is empty (CPU, not vllm_capture) or how it was measured
    verify_equality: list[VerifyEquality] = Field(default_factory=list)  # per configuration with verification on
    verify_equality_note: str = ""  # a configuration whose count failed, and why
    # A configuration after the first that stopped before its levels ended ("label: error"): the levels
    # are those of the configurations that ran.
    configurations_failed: list[str] = Field(default_factory=list)


class SoakRecord(SoakOptions):
    """What a `soak` artifact records: the soak's options as run, the server's limits, the hostile
    cases, and how the run counted and measured."""

    limits: dict[str, Any]  # the server's ServerLimits (serve/config.py), as JSON
    hostile_cases: list[str]
    warmup: str  # what ran before the start RSS
    rss: str  # whose RSS, read how
    seam_factory: str  # "alignatt", or the stand-in's type


class SoakArtifact(_Artifact):
    """`alignatt soak`: mixed well-formed and hostile sessions on loopback, memory over time, targets."""

    kind: Literal["soak"] = "soak"
    config: SoakRecord
    load_s: float
    sessions: dict[str, int]  # sessions run, by case
    updates: int
    finals: int
    dropped_finals: int
    retractions: int
    silent_sessions: int
    hostile_unexpected: list[str]  # hostile cases answered otherwise than expected (first 50)
    client_errors: dict[str, int]  # error codes the clients received
    server: dict[str, Any]  # the server's own counters (errors, closes by reason, sessions, updates)
    rss_start_mb: float
    rss_end_mb: float
    rss_change_pct: float
    fds_start: int
    fds_end: int
    samples: list[dict[str, Any]]  # {t_s, rss_mb, fds, sessions_active}
    checks: list[Check]
    passed: bool


class FailoverSession(_Strict):
    """One speaker of `alignatt failover`: what it saw across its engine's loss."""

    speaker: int
    connections: int  # 1: never lost its engine
    losses: int  # times it was told its engine was gone (or its connection closed)
    utterances: int
    finals_delivered: int
    retractions: int
    committed_lost: int  # utterances whose final does not extend the text shown before a loss
    notice_after_fault_s: float | None = None  # fault -> the first notice after it
    resumed_after_fault_s: float | None = None  # fault -> a translation on the new connection
    final_wait_s_max: float | None = None  # a final's send -> its answer, or the notice that it was lost
    refused: list[str] = Field(default_factory=list)  # reconnect attempts refused (busy, down...)
    error: str | None = None
    texts: list[dict[str, Any]] = Field(default_factory=list)  # {utterance_id, shown_before_loss, final}


class FailoverArtifact(_Artifact):
    """`alignatt failover`: engine processes killed and stopped under load, what the clients saw."""

    kind: Literal["failover"] = "failover"
    config: FailoverOptions
    synthetic_weights: bool
    load_s: float  # server start, engines loaded
    faults: list[dict[str, Any]]  # {t_s, action, engine, pid, sessions}
    bounds_s: dict[str, float]  # kill / stop: the notice bound checked
    sessions: list[FailoverSession]
    health: list[dict[str, Any]]  # {t_s, http, status, sessions_active, engines_alive, engines_hung, engines_dead}
    engines: list[dict[str, Any]]  # per engine at the end: engine, pid, state, sessions admitted, failed
    checks: list[Check]
    passed: bool


class BalancerRtt(_Strict):
    """Round trips to one replica directly and through the balancer, interleaved in the same run."""

    probes: int
    ping_direct_ms_p50: float  # WebSocket ping -> pong on an open session
    ping_balanced_ms_p50: float
    ping_added_ms_p50: float  # balanced - direct: the balancer's hop
    ping_direct_ms_p95: float
    ping_balanced_ms_p95: float
    open_direct_ms_p50: float  # connect + handshake + init -> init_ok (what a reconnect costs)
    open_balanced_ms_p50: float


class ReplicasArtifact(_Artifact):
    """`alignatt replicas`: `alignatt serve` replicas behind HAProxy, one killed and one drained under
    load, and what the clients saw through the balancer."""

    kind: Literal["replicas"] = "replicas"
    config: ReplicasOptions
    synthetic_weights: bool
    balancer: dict[str, Any]  # {version, config_sha256, health_check}
    load_s: float  # every replica listening, engines loaded
    faults: list[dict[str, Any]]  # {t_s, action, replica, pid, sessions, exit_code, exited_after_s}
    bounds_s: dict[str, float]  # notice bound per action, and `reconnect`: notice -> a session again
    sessions: list[FailoverSession]
    finals_wait_s: float  # how long a speaker waits for its finals past its stream's end
    reopen_s: list[float]  # per loss: the notice -> init_ok on another replica (a session again)
    answered_again_s: list[float]  # per loss: the notice -> the first translation there (adds the engine's queue)
    rtt: BalancerRtt
    rotation: list[dict[str, Any]]  # {t_s, replica: the balancer's status of it (UP, DOWN, ...)}
    replicas: list[dict[str, Any]]  # per replica: {replica, port, sessions_opened, fate}
    checks: list[Check]
    passed: bool

