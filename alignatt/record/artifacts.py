"""The one versioned schema family for every JSON artifact under `outputs/`.

Writer (every measuring command), auditor and report renderer all use these models, so an
artifact that the auditor accepts is one the report can render. Each artifact carries `kind`,
`schema_version` and a full `Provenance` block. The historical artifacts that predate the schema
are read by `alignatt.record.published`.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from alignatt.capture.names import SEAMS, VLLM_MODES
from alignatt.core.errors import AlignattError
from alignatt.record.events import ReplayEvent
from alignatt.record.provenance import Fingerprint, Provenance

ARTIFACT_SCHEMA_VERSION = 1
KNOWN_SEAMS = SEAMS
BENCH_FILE = re.compile(r"^bench_([a-z0-9]+)\.json$")  # outputs/<profile>/bench_<vLLM mode>.json
TIMING_KEYS = ("prefill_ms", "decode_ms", "capture_ms", "reconstruct_ms")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


# ---- benchmark -------------------------------------------------------------------------------


class BenchPrompt(_Strict):
    id: str
    length_bin: str
    source_text: str
    assistant_prefill: str = ""
    accessible_units: int = Field(ge=0)  # committed source words; the rest is the unstable tail


class BenchConfig(_Strict):
    profile: str | None = None  # the params.yaml profile it came from, if any
    model: str
    seams: list[str]
    vllm_mode: Literal[VLLM_MODES] = "eager"  # type: ignore[valid-type]
    device: str = "cpu"
    dtype: str | None = None
    max_new_tokens: int = Field(20, ge=1)
    heads_k: int = Field(8, ge=1)
    warmup: int = Field(1, ge=0)
    repeats: int = Field(3, ge=1)
    prompts_file: str | None = None  # None: the packaged 16 published prompts
    policy: dict[str, int] = Field(default_factory=dict)  # PolicyConfig overrides ({} = defaults)
    # seams the profile expects to be skipped on its machine (vllm_capture on a CPU); a run where
    # every other seam was skipped fails instead of writing a row of skips
    expect_skipped: list[str] = Field(default_factory=list)


class BenchRow(_Strict):
    id: str
    repeat: int
    length_bin: str
    prompt_tokens: int
    generated_tokens: int
    draft_text: str
    emitted_text: str
    emit_count: int
    draft_stop_reason: str  # the seam's: eos | max_new_tokens
    policy_stop_reason: str  # AlignAtt's: alignatt:source_frontier, draft_end, ...
    aligned_words: list[int]  # per drafted token, the source word its heads attend to most
    prefill_ms: float
    decode_ms: float
    capture_ms: float
    reconstruct_ms: float
    total_ms: float
    per_token_ms: float  # Timings.per_token_ms: total_ms / generated_tokens


class MedianSummary(_Strict):
    rows: int
    median_per_token_ms: float
    median_total_ms: float


class PromptSummary(MedianSummary):
    draft_text: str  # the modal draft over repeats
    emitted_text: str  # the modal emitted text over repeats
    unstable_repeats: int  # repeats whose draft or emitted text differs from the modal one


class SeamResult(_Strict):
    seam: str
    status: Literal["ok", "skipped"]
    skip_reason: str | None = None
    heads: list[tuple[int, int]] = Field(default_factory=list)
    load_s: float | None = None  # seam construction (model load) wall time, unmeasured
    variant: str | None = None  # how the seam ran when it has choices, e.g. hf_qk_fast's decode loop
    rows: list[BenchRow] = Field(default_factory=list)
    median_per_token_ms: float | None = None  # the headline: median over every measured row
    median_timings_ms: dict[str, float] = Field(default_factory=dict)
    by_length_bin: dict[str, MedianSummary] = Field(default_factory=dict)
    by_prompt: dict[str, PromptSummary] = Field(default_factory=dict)


class Divergence(_Strict):
    id: str
    kinds: list[Literal["draft", "decision"]]
    drafts_by_seam: dict[str, str]
    emitted_by_seam: dict[str, str]


# ---- server smoke (filled by `alignatt smoke`) -----------------------------------------------


class FastPathEvent(_Strict):
    seq: int
    utterance_id: str | int | None = None
    latency_ms: float  # server-side, update received -> translation sent
    engine_calls: int  # engine calls made for this update (0 on a real fast-path release)
    released_text: str = ""  # committed text newly released by the frontier move


# ---- artifacts -------------------------------------------------------------------------------


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


class BenchArtifact(_Artifact):
    kind: Literal["bench"] = "bench"
    config: BenchConfig
    synthetic_weights: bool
    seam_factory: str  # module:function that built the seams (the default: alignatt's own)
    prompt_count: int
    seams: list[SeamResult]
    divergences: list[Divergence]

    def seam(self, name: str) -> SeamResult | None:
        return next((s for s in self.seams if s.seam == name), None)


class ServerSmokeArtifact(_Artifact):
    kind: Literal["server_smoke"] = "server_smoke"
    config: dict[str, Any]  # model, seam, preset, replay speed, stream file...
    updates: int
    finals: int
    retractions: int
    rtt_ms_p50: float | None  # partial-draft round trip, client side
    rtt_ms_p95: float | None
    fast_path_events: list[FastPathEvent]
    events: list[ReplayEvent] = Field(default_factory=list)  # per-update trace


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


# ---- load benchmark (filled by `alignatt load`) -----------------------------------------------


class LoadEngine(_Strict):
    """One engine of the server over one load level (`Engine.stats()` after less before)."""

    engine: str
    gpu: str | None = None  # the CUDA device its process is pinned to; None: in-process or CPU
    alive: bool = True  # at the end of the level
    sessions: int  # sessions placed on it during the level
    steps: int
    batch_sizes: dict[str, int]  # drafts in the engine at a step -> steps
    failed: int = 0  # drafts that failed on it
    step_ms_mean: float | None = None  # wall inside the seam's step, per step (None: not recorded)
    step_cpu_ms_mean: float | None = None  # the engine thread's CPU time inside it, per step
    # An engine in a process of its own: step_ms_mean is the server's round trip; these are the child's
    # own wall and CPU per step (taking the step's submits and aborts, then stepping). None: in-process.
    child_step_ms_mean: float | None = None
    child_cpu_ms_mean: float | None = None
    # The seam's own step in parts, wall ms per step (vllm_capture: vllm, settle, finish, drafts).
    step_phase_ms: dict[str, float] | None = None


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
    lag_grows: bool  # last third's mean lag exceeds the first third's by more than 0.25 s
    fast_path_events: int
    engine_steps: int  # summed over the engines
    engine_batch_sizes: dict[str, int]  # drafts in an engine at a step -> steps, summed over the engines
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
    verification: LoadVerification | None = None  # None: the seam does not count it, or the artifact predates the field
    # One speaker alone on a later configuration of the run (verification on, say) against the first
    # (off): updates matched by seq, and how many differ in committed text, and in path or released text.
    updates_compared_with_first_configuration: int | None = None
    texts_differing_from_first_configuration: int | None = None
    decisions_differing_from_first_configuration: int | None = None


class CaptureCostRow(_Strict):
    batch: int
    captured_ms: float  # median wall of one draft_many of `batch` prompts, capture on
    uncaptured_ms: float
    ratio: float
    vllm_mode: str | None = None


class LoadArtifact(_Artifact):
    kind: Literal["load"] = "load"
    config: dict[str, Any]  # model, seam, preset, speakers, streams, speed, stagger, engine facts
    synthetic_weights: bool
    levels: list[LoadLevel]
    capture_cost: list[CaptureCostRow] = Field(default_factory=list)
    capture_cost_note: str = ""  # why it is empty (CPU, not vllm_capture) or how it was measured


class EvalInterval(_Strict):
    """sacrebleu's bootstrap 95 % interval of a corpus score (alignatt.evaluate.uncertainty)."""

    score: float
    mean: float  # bootstrap mean
    low: float  # mean - half-width, clipped to [0, 100]
    high: float
    half_width: float
    confidence: float = 0.95
    resamples: int
    n: int  # sentences resampled
    seed: str  # SACREBLEU_SEED
    distinct_resamples: int | None = None  # C(2n-1, n): 3 for n = 2


class EvalPairedTest(_Strict):
    """sacrebleu's paired test of a row against the offline baseline of its variant, same sentences."""

    against: str  # the baseline row (offline, same variant)
    method: Literal["ar", "bs"]
    description: str
    samples: int
    n: int
    seed: str
    bleu_p: float
    chrf_p: float
    significant: bool  # BLEU p < level
    level: float = 0.05
    no_difference: list[str] = Field(default_factory=list)  # metrics with the baseline's exact score: p = 1
    resolvable: bool = True  # False: too few sentences for any p below the level (N = 2: 3 resamples)


class EvalNegativeLatency(_Strict):
    """A latency figure whose instances include negative lags: reported, not hidden in the mean."""

    metric: str  # a key of the row's `latency`
    instances: int  # instances with a lag below 0
    scored: int  # instances scored
    min: float
    mean: float  # the figure itself (mean over all scored instances, negatives included)
    why: str


class EvalRow(_Strict):
    """One scored configuration of `alignatt eval`: a preset (or the offline baseline), a seam
    variant, a driver, a tail (what the replayed ASR showed beyond the committed words), and
    sentence-level or long-form streams."""

    preset: str  # low_latency | balanced | high_latency | offline (the full-sentence ceiling)
    variant: str  # the seam as run, e.g. hf_qk_fast or vllm_capture:cudagraph
    driver: Literal["inprocess", "websocket", "wlk", "offline"]
    form: Literal["sentence", "longform"]
    # latency only: synthetic weights, BLEU is no translation score; scorer smoke: too few
    # sentences for a quality result (the CPU profile), the figures exercise the scorer
    label: Literal["scored", "latency only", "scorer smoke"]
    instances: int  # sentences (sentence form) or reference segments (long form)
    bleu: float
    chrf: float
    # gold: the gold source as tail; noisy: a seeded noisy ASR tail (config.tail_noise); none: no
    # lookahead (the offline baseline is shown no tail either)
    tail: Literal["gold", "noisy", "none"] = "gold"
    # streams replayed at once through one engine (`alignatt eval --concurrency`): batching can
    # change bf16 drafts; None in artifacts written before it was recorded (one at a time)
    concurrency: int | None = Field(None, ge=1)
    # quality: a row of the whole selection; under_load: the same preset, tail and first sentences
    # replayed at one of `config.load_levels` (how much concurrent streams cost in quality)
    role: Literal["quality", "under_load"] = "quality"
    latency: dict[str, float | int | None] = Field(default_factory=dict)  # OmniSTEval's scores
    quality_intervals: dict[str, EvalInterval] = Field(default_factory=dict)  # bleu, chrf
    significance: EvalPairedTest | None = None  # against offline (preset rows of the sentence form)
    negative_latency: list[EvalNegativeLatency] = Field(default_factory=list)
    retractions: int  # committed text that did not extend what was shown (must be 0)
    buffer_units_shown: int = 0  # held draft units shown, summed over updates
    buffer_units_replaced: int = 0  # of those, units the final text did not keep
    buffer_replaced_share: float | None = None
    updates: int = 0
    engine_calls: int = 0
    wall_ms: float = 0.0  # the driver's round trips, summed
    paths: dict[str, int] = Field(default_factory=dict)
    hypotheses: list[str]  # per sentence, or per resegmented reference segment (long form)
    # Per stream, per emitted target unit: [source words committed, arrived, CU ms, CA ms].
    emissions: list[list[tuple[int, int, float, float]]] = Field(default_factory=list)
    # Per stream, per emitted target unit: source words read (committed + tail shown); empty in
    # artifacts written before it was recorded
    read_words: list[list[int]] = Field(default_factory=list)
    streams: list[str] = Field(default_factory=list)  # long form: each talk's output as emitted, before resegmentation


class EvalArtifact(_Artifact):
    kind: Literal["eval"] = "eval"
    config: dict[str, Any]  # model, variants, presets, drivers, schedule, subset sizes
    test_set: dict[str, Any]  # name, direction, description, ids of the pairs used
    synthetic_weights: bool
    rows: list[EvalRow]
    comet: dict[str, Any]  # {"status": "ok", ...} or {"status": "skipped", "reason": ...}
    checks: list[Check] = Field(default_factory=list)  # 0 retractions, driver and variant equality
    # quality: a measurement; scorer smoke: a few sentences run to exercise the scorer (the CPU
    # profile), never a quality result
    purpose: Literal["quality", "scorer smoke"] = "quality"
    instance_logs: str | None = None  # SimulEval instance logs, relative to the artifact's folder


class SoakArtifact(_Artifact):
    """`alignatt soak`: mixed well-formed and hostile sessions on loopback, memory over time, targets."""

    kind: Literal["soak"] = "soak"
    config: dict[str, Any]  # SoakOptions, the server's limits, the hostile cases
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


class GpuTestCase(_Strict):
    nodeid: str  # as pytest names it: tests/gpu/test_x.py::test_y[param]
    outcome: Literal["passed", "failed", "error", "skipped"]
    duration_s: float  # setup + call + teardown
    message: str = ""  # a skip's reason, a failure's or an error's first line


class GpuTestsArtifact(_Artifact):
    """`alignatt test-gpu`: the GPU suite run whole in one command, every test's outcome and time.

    A GPU figure measured at a commit is honest only when this artifact says the suite passed at
    that commit: the audit compares the two, and the page names the commit and its date."""

    kind: Literal["gpu_tests"] = "gpu_tests"
    ran: bool  # False where the profile has no GPU (the reason says so); nothing was measured then
    reason: str = ""
    command: list[str]
    exit_code: int | None
    wall_s: float
    counts: dict[str, int]  # passed, failed, error, skipped
    tests: list[GpuTestCase]
    passed: bool  # it ran, nothing failed or errored, and at least one test passed
    lanes: int = 1  # test children run side by side (tests/gpu_isolation.py)


def measured_on_gpu(artifact: BaseModel) -> bool:
    """A measurement made on a GPU, which must stand on its folder's passing GPU suite (the suite
    itself and the fingerprint measure nothing). The audit and the page both ask this."""
    return not isinstance(artifact, (GpuTestsArtifact, FingerprintArtifact)) and artifact.provenance.gpu_count > 0


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
    config: dict[str, Any]  # FailoverOptions
    synthetic_weights: bool
    load_s: float  # server start, engines loaded
    faults: list[dict[str, Any]]  # {t_s, action, engine, pid, sessions}
    bounds_s: dict[str, float]  # kill / stop: the notice bound checked
    sessions: list[FailoverSession]
    health: list[dict[str, Any]]  # {t_s, http, status, sessions_active, engines_alive, engines_hung, engines_dead}
    engines: list[dict[str, Any]]  # per engine at the end: engine, pid, state, sessions admitted, failed
    checks: list[Check]
    passed: bool


Artifact = Annotated[
    Union[EnvArtifact, FingerprintArtifact, BenchArtifact, ServerSmokeArtifact, MeasurementArtifact, SoakArtifact,
          EvalArtifact, LoadArtifact, GpuTestsArtifact, FailoverArtifact],
    Field(discriminator="kind"),
]
AnyArtifact = Union[EnvArtifact, FingerprintArtifact, BenchArtifact, ServerSmokeArtifact, MeasurementArtifact,
                    SoakArtifact, EvalArtifact, LoadArtifact, GpuTestsArtifact, FailoverArtifact]
FINGERPRINT_FILE = "fingerprint.json"  # outputs/<profile>/fingerprint.json, written by the env stage
_ARTIFACT = TypeAdapter(Artifact)


def parse_artifact(data: Any) -> AnyArtifact:
    """Validate a decoded JSON document; raises pydantic's ValidationError with every problem."""
    if isinstance(data, dict) and data.get("schema_version") not in (None, ARTIFACT_SCHEMA_VERSION):
        raise AlignattError(
            f"schema_version {data.get('schema_version')!r} is not supported "
            f"(this alignatt reads version {ARTIFACT_SCHEMA_VERSION})"
        )
    return _ARTIFACT.validate_python(data)


def sha256_file(path: str | Path) -> str:
    """Hex SHA-256 of a file, read in blocks (artifacts here; multi-GB images in the wrapper)."""
    sha = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            sha.update(block)
    return sha.hexdigest()


def load_json(path: str | Path) -> Any:
    path = Path(path)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise AlignattError(f"{path}: no such file") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise AlignattError(f"{path}: not valid JSON ({e})") from None


def load_artifact(path: str | Path) -> AnyArtifact:
    try:
        return parse_artifact(load_json(path))
    except ValidationError as e:
        raise AlignattError(f"{path}: not a valid alignatt artifact:\n{e}") from None


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
    return path
