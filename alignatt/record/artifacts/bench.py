"""Benchmark artifacts: a bench stage's per-seam rows and medians (`alignatt bench`), and the
server smoke's replay through one session (`alignatt smoke`)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from alignatt.capture.names import VLLM_MODES
from alignatt.record.artifacts.base import _Artifact, _Strict
from alignatt.record.artifacts.options import SmokeOptions
from alignatt.record.events import ReplayEvent


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


class ClientSummary(_Strict):
    """One client's replay of the smoke stream (`measure/smoke.py`); rtt: the native client's round
    trip, wlk's its process() call."""

    client: str
    updates: int
    finals: int
    errors: int
    disconnects: int
    retractions: int
    # what the client showed (committed + held draft), in target words: the held buffer's mean length
    # per partial and its flicker (Normalized Erasure); None where the client's events keep no buffer
    # (wlk), or in artifacts written before they were recorded
    shown_buffer_words_mean: float | None = None
    normalized_erasure: float | None = None
    partial_drafts: int
    partial_draft_rtt_ms_p50: float | None
    partial_draft_rtt_ms_p95: float | None
    fast_path_events: int
    fast_path_releases: int
    fast_path_server_ms_p50: float | None
    fast_path_server_ms_p95: float | None
    fast_path_engine_calls: int
    engine_calls: int
    paths: dict[str, int]
    wall_s: float
    max_lag_s: float


class SmokeRecord(SmokeOptions):
    """What a `server_smoke` artifact records: the smoke's options as run, and what the server and
    the stream made of them."""

    engine_heads: list[tuple[int, int]]  # the engine's alignment heads (layer, head)
    seam_options: dict[str, Any] = Field(default_factory=dict)  # the route's, as the server built it
    # how the server ran it (the served defaults server_config chose): None: whole drafts (every
    # artifact before the field, the only setting the server had then)
    settle_buffer_tokens: int | None = None
    engine_process: bool = False
    replay_speed: float
    stream_words: int
    stream_sentences: int
    words_per_second: float
    commit_lag_seconds: float
    clients: list[str]
    headline_client: str
    pacing: str
    whisperlivekit: str | None = None  # its version, when its client ran
    summaries: list[ClientSummary]  # per client, the headline client first
    speech: dict[str, Any] | None = None  # a recognised stream: the recogniser's figures, the caption delay

    @model_validator(mode="before")
    @classmethod
    def _historical(cls, data: Any) -> Any:
        """Artifacts written before the options were recorded whole kept the engine's heads under
        `heads` and no `wlk_latency` when WhisperLiveKit did not run: the heads move to
        `engine_heads`, and an option they did not record reads as its default."""
        if isinstance(data, dict) and isinstance(data.get("heads"), list):
            data = {**data, "engine_heads": data["heads"], "heads": None}
        if isinstance(data, dict) and data.get("wlk_latency", "") is None:
            data = {k: v for k, v in data.items() if k != "wlk_latency"}
        return data


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
    config: SmokeRecord
    updates: int
    finals: int
    retractions: int
    rtt_ms_p50: float | None  # partial-draft round trip, client side
    rtt_ms_p95: float | None
    fast_path_events: list[FastPathEvent]
    events: list[ReplayEvent] = Field(default_factory=list)  # per-update trace
