"""The options of the commands whose artifacts record them: `alignatt smoke`, `soak`, `failover`,
`replicas`, `load` (all but its configurations) and `eval` (all but the checks that need serve/),
each knob declared once.

They sit in the schema, under `measure/`, because the artifact records them as they are: the CLI
builds a command's options from its model (`cli/options.py:model_options`), params.yaml sections
validate against it, and the artifact's `config` is the same model (smoke, soak, load and eval: a
record model that subclasses it and adds what the run measured). The commands import their model
from here; `load` adds its typed configurations (measure/load_configurations.py), recorded by label.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, field_validator, model_validator

from alignatt.capture.names import DEFAULT_SEAM, HF_QK_FAST
from alignatt.core.policy import DEFAULT_PRESET, PRESET_NAMES
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
    compared_speakers: list[int] | None = Field(
        None, description="the levels of each configuration after the first, some of speakers (default: all); "
                          "at 1 speaker each is matched update by update against the first")
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
    stop_lag_s: float | None = Field(
        30.0, gt=0, description="a speaker this many seconds behind its stream stops: its level cannot keep up, "
                                "and the rest of the stream would only say so for longer (null: every stream to "
                                "its end)")
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

    @field_validator("capture_cost", mode="before")
    @classmethod
    def _switch(cls, value: Any) -> Any:
        """YAML 1.1 reads a bare off/on as a boolean, and DVC's writer (YAML 1.2) drops the quotes."""
        return {True: "on", False: "off"}[value] if isinstance(value, bool) else value


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


# `alignatt eval`: its knobs, and the seeded ASR models of its tails (alignatt/evaluate/tails.py,
# asr_errors.py run them), which an eval artifact records as they were set
TailKind = Literal["gold", "asr", "noisy", "none"]
TAIL_KINDS: tuple[str, ...] = ("gold", "asr", "noisy", "none")


class TailNoise(BaseModel):
    """The seeded tail-noise model of the `noisy` tail (probabilities per shown tail word, per update)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    seed: int = Field(0, description="noisy tail: seeds every draw, with the stream id and the event number")
    p_wrong: float = Field(0.2, ge=0, le=1, description="noisy tail: P(a tail word is shown as another vocabulary word)")
    p_drop: float = Field(0.05, ge=0, le=1, description="noisy tail: P(a tail word is missing from the tail)")
    p_split: float = Field(0.05, ge=0, le=1, description="noisy tail: P(a tail word is shown as two pieces)")
    confusion: Literal["test_set_vocabulary"] = Field(
        "test_set_vocabulary", description="a wrong word is drawn uniformly from the test set's distinct "
                                           "source tokens, the true word excluded")

    @model_validator(mode="after")
    def _exclusive(self) -> "TailNoise":
        if self.p_wrong + self.p_drop + self.p_split > 1:
            raise ValueError("p_wrong + p_drop + p_split must be at most 1 (the outcomes exclude each other)")
        return self




class AsrErrors(BaseModel):
    """The ASR-like transcript's seeded error model (one per row's committed word error rate)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    seed: int = Field(0, description="asr tail: seeds every draw, with the stream id and the word index")
    committed_wer: float = Field(0.05, ge=0, le=0.6, description="expected word error rate of the committed "
                                                                  "words (substitutions, deletions, merges, splits)")
    p_substitute: float = Field(0.55, ge=0, description="share of errors that substitute a confusable word")
    p_delete: float = Field(0.25, ge=0, description="share of errors that drop a function word")
    p_merge: float = Field(0.10, ge=0, description="share of errors that merge a word with the next")
    p_split: float = Field(0.10, ge=0, description="share of errors that split a long word in two")
    p_casing: float = Field(0.02, ge=0, le=1, description="P(a committed word's first letter has the wrong case)")
    p_punct_drop: float = Field(0.15, ge=0, le=1, description="P(a sentence mark is missing in the transcript)")
    p_punct_insert: float = Field(0.01, ge=0, le=1, description="P(a period is added after a word)")
    p_tail_revise: float = Field(0.6, ge=0, le=1, description="P(an early stage of a tail word shows another form "
                                                               "than the committed one)")
    p_tail_missing: float = Field(0.2, ge=0, le=1, description="of the first stage's other forms, the share not "
                                                                "shown at all yet")
    tail_stages: int = Field(3, ge=1, le=4, description="early stages a tail word goes through before it settles")

    @model_validator(mode="after")
    def _mix(self) -> "AsrErrors":
        if self.p_substitute + self.p_delete + self.p_merge + self.p_split <= 0:
            raise ValueError("the error mix p_substitute + p_delete + p_merge + p_split must be > 0")
        return self

    def rate(self, mergeable: float = 1.0, splittable: float = 1.0) -> float:
        """P(a word starts an error), for a stream whose words can be merged with the next and split in
        the given shares: a merge or a split makes two word errors, and where a word cannot take one
        it is substituted instead (one error)."""
        total = self.p_substitute + self.p_delete + self.p_merge + self.p_split
        errors_per_event = (self.p_substitute + self.p_delete + self.p_merge * (1 + mergeable)
                            + self.p_split * (1 + splittable)) / total
        return min(1.0, self.committed_wer / errors_per_event)


DEFAULT_BOOTSTRAP = 1000  # sacrebleu bootstrap resamples of the 95 % intervals


class EvalKnobs(_Strict):
    """`alignatt eval`'s knobs: `evaluate/run.py:EvalOptions` adds the checks that need serve/ and
    evaluate/, and an eval artifact records them beside what the run resolved
    (record/artifacts/evaluation.py:EvalRecord)."""

    model: str = Field("gemma3-270m", description="model preset or local checkpoint")
    variants: list[str] = Field(default_factory=lambda: [HF_QK_FAST],
                                description="seam[:vllm_mode] variants scored on the same sentences, e.g. "
                                            "vllm_capture:cudagraph,vllm_capture:eager")
    presets: list[str] = Field(default_factory=lambda: list(PRESET_NAMES),
                               description="latency presets, a row each (sentence and long-form rows)")
    sentence_presets: list[str] | None = Field(
        None, description="the sentence rows' presets, some of `presets` (default: all): a grid can sweep the "
                          "presets on whole talks and score sentences at fewer")
    drivers: list[Literal["inprocess", "websocket", "wlk"]] = Field(
        default_factory=lambda: ["inprocess"],
        description="inprocess; websocket: through alignatt serve, native client; wlk: through alignatt serve "
                    "by WhisperLiveKit's own client")
    test_set: str = Field("en-de", description="named set (en-de), .jsonl, word-alignment .json, or SOURCE:TARGET files")
    direction: str | None = Field(None, description="source-target, e.g. cs-en (default: the test set's, else en-de)")
    limit: int | None = Field(None, ge=1, description="first N sentences of the test set")
    max_source_words: int | None = Field(None, ge=1, description="only sentences with at most this many words")
    longform_talks: int | Literal["all"] = Field(0, description="long form: the first N whole talks of the test "
                                                                 "set, in id order (all: every talk; 0: none)")
    longform_max_pairs: int | None = Field(None, ge=1, description="long form: only each talk's first N pairs (a "
                                                                   "smoke; default: whole talks)")
    longform_oracle_tails: list[TailKind] = Field(
        default_factory=list, description="tails whose long form is also replayed with utterances closed at the "
                                          "reference segments' ends (oracle segmentation, a labelled comparison)")
    tail_visible_at: Literal["end", "onset"] = Field(
        "end", description="when a word reaches the ASR tail: at the end of its speech (end) or its onset (onset)")
    asr_wers: list[float] = Field(default_factory=lambda: [0.05, 0.15],
                                  description="asr tail: the committed words' word error rates, a row each")
    asr_seed: int = Field(0, description="asr tail: seeds every draw, with the stream id and the word index")
    asr_p_tail_revise: float = Field(0.6, ge=0, le=1, description="asr tail: P(a word shows another early form in "
                                                                  "the tail before it settles)")
    asr_p_punct_drop: float = Field(0.15, ge=0, le=1, description="asr tail: P(a sentence mark is missing from the "
                                                                  "transcript)")
    words_per_second: float = Field(2.4, gt=0, description="ASR word rate")
    commit_lag_seconds: float = Field(2.0, ge=0, validation_alias=AliasChoices("commit_lag_seconds", "commit_lag"),
                                      description="seconds from a word's arrival to its commit")
    device: str = Field("cpu", description="torch device of the seam (cpu, cuda)")
    dtype: str | None = Field(None, description="float32 | bfloat16 (default: the model's)")
    top_k: int = Field(4, ge=1, description="alignment heads used")
    heads: str | None = Field(None, description="head-set file or bundled name (default: the model's)")
    comet_model: str | None = Field(None, description="local COMET checkpoint (unbabel-comet); else COMET is skipped")
    offline_baseline: bool = Field(True, validation_alias=AliasChoices("offline_baseline", "offline"),
                                   description="also the offline full-sentence baseline")
    tails: list[TailKind] = Field(default_factory=lambda: ["gold", "asr", "none"],
                                  description="ASR tails, a row each per preset: gold, asr (an ASR-like transcript, "
                                              "a row per --asr-wers), noisy (the older seeded tail noise), none (no "
                                              "lookahead)")
    longform_tails: list[TailKind] = Field(default_factory=lambda: ["gold", "asr"],
                                           description="tails of the long-form rows")
    tail_noise: TailNoise = Field(default_factory=TailNoise,
                                  description="the noisy tail's seeded noise model (flat knobs: --tail-noise-seed, "
                                              "--tail-p-wrong, --tail-p-drop, --tail-p-split)")
    bootstrap: int = Field(DEFAULT_BOOTSTRAP, ge=1,
                           description="sacrebleu bootstrap resamples for the 95% intervals")
    significance: Literal["ar", "bs"] = Field(
        "bs", description="paired test against offline: bs (bootstrap) or ar (approximate randomization)")
    significance_samples: int = Field(0, ge=0, description="resamples/trials of the paired test (0: sacrebleu's "
                                                           "default, ar 10000, bs 1000)")
    purpose: Literal["quality", "scorer_smoke"] = Field(
        "quality", description="quality, or scorer_smoke: a few sentences that exercise the scorer (CPU CI), "
                               "labelled so, not a quality result")
    isolate_variants: bool | None = Field(None, description="each variant in its own process (default: when vLLM "
                                                            "runs several)")
    concurrency: int = Field(1, ge=1, description="in-process streams replayed at once, their drafts batched by the "
                                                   "engines' draft schedulers (--engines: spread over several) (1: "
                                                   "one after another)")
    engines: int = Field(1, ge=1, description="engine processes sharing the device, a draft scheduler each, the "
                                              "--concurrency streams spread over them (1: the seam in this process)")
    load_levels: list[int] = Field(default_factory=list, description="quality under load: the default preset, "
                                   "gold tail, on the first load_sentences sentences, at each of these concurrencies")
    load_sentences: int = Field(100, ge=1, description="sentences of each quality-under-load row")
    settle_buffer_tokens: int | Literal["auto", "none"] | None = Field(
        "auto", description="drafts settled as `alignatt serve` settles them (its --settle-buffer-tokens): N tokens "
                            "past the first held token; none: whole drafts; auto: the served default of the "
                            "variant's seam and device (serve.config.served_settle)")

    @field_validator("longform_talks")
    @classmethod
    def _talks(cls, talks: int | str) -> int | str:
        if isinstance(talks, int) and talks < 0:
            raise ValueError(f"longform_talks is a number of talks (0: none) or all, not {talks}")
        return talks

    @field_validator("asr_wers")
    @classmethod
    def _wers(cls, wers: list[float]) -> list[float]:
        if not wers or any(not 0 <= w <= 0.6 for w in wers) or len(set(wers)) != len(wers):
            raise ValueError(f"asr_wers must be distinct word error rates in [0, 0.6], not {wers}")
        return wers

    def row_tails(self, kinds: list[str]) -> list[str]:
        """The rows' tail keys: each kind, `asr` once per committed WER (`asr@0.15`)."""
        return [k for kind in kinds for k in ([f"asr@{w:g}" for w in self.asr_wers] if kind == "asr" else [kind])]

    @field_validator("load_levels")
    @classmethod
    def _levels(cls, levels: list[int]) -> list[int]:
        if any(n < 1 for n in levels) or len(set(levels)) != len(levels):
            raise ValueError(f"load levels must be distinct positive concurrencies, not {levels}")
        return sorted(levels)

