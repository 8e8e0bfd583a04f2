"""Quality artifacts: `alignatt eval`'s rows, with their intervals and paired tests."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from alignatt.record.artifacts.base import Check, _Artifact, _Strict
from alignatt.record.artifacts.options import AsrErrors, EvalKnobs, TailKind, TailNoise


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
    # BLEU only (sacrebleu's BLEUScore): brevity penalty, hypothesis and reference lengths in the
    # BLEU tokenizer's units; None in artifacts written before they were recorded
    bp: float | None = None
    sys_len: int | None = None
    ref_len: int | None = None


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
    # resolvable and both metrics' Holm-adjusted p < level (the family: every row's test against
    # offline, both metrics, in the artifact); artifacts written before the correction recorded BLEU
    # p < level alone: the page recomputes the verdict from bleu_p and chrf_p
    significant: bool
    level: float = 0.05
    bleu_p_holm: float | None = None  # Holm-Bonferroni adjusted; None in artifacts written before
    chrf_p_holm: float | None = None
    family: int | None = None  # the tests in the family (rows x 2 metrics)
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

    preset: str  # low_latency | balanced | high_latency | offline (the full-sentence reference)
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
    tail: Literal["gold", "asr", "noisy", "none"] = "gold"
    # asr: the word error rate set for the committed words of the ASR-like transcript
    committed_wer: float | None = None
    # long form: where utterances closed. punctuation: a rule a real client follows (the transcript's
    # sentence marks as recognised, the session's forced finals); oracle: the reference segments'
    # ends (a labelled comparison). None: sentence form, or an artifact from before the field
    # (whose long form closed on the gold source's marks, in 5-pair chunks)
    segmentation: Literal["punctuation", "oracle"] | None = None
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
    # Per stream, per emitted target unit: SimulEval's computation-aware time (stream time + all
    # compute since the stream began), ms; empty in artifacts from before it
    simuleval_ca: list[list[float]] = Field(default_factory=list)
    streams: list[str] = Field(default_factory=list)  # long form: each talk's output as emitted, before resegmentation


class TailDescription(_Strict):
    """What a row's tail showed the translator (alignatt.evaluate.tails.TailModel.describe)."""

    tail: TailKind
    description: str
    asr_errors: AsrErrors | None = None  # asr: the row's seeded error model
    tail_noise: TailNoise | None = None  # noisy: the seeded noise model
    vocabulary_size: int | None = None  # asr, noisy: the confusion set's distinct source tokens


class EvalSchedule(_Strict):
    words_per_second: float
    commit_lag_seconds: float
    tail_visible_at: Literal["end", "onset"] = "end"  # artifacts from before it: words reached the tail at their end


class EvalUncertainty(_Strict):
    intervals: str  # the bootstrap intervals, in words
    significance: str  # the paired test, in words
    curve_needs: int  # sentences a row needs for its latency-quality curve point


Settle = int | None  # drafts settled N tokens past the first held token; None: whole drafts


class EvalRecord(EvalKnobs):
    """What an eval artifact records: `alignatt eval`'s knobs as run (`settle_buffer_tokens` the option
    as given, `tails` the kinds asked for) and what the run resolved: the drafts each variant scored,
    each row tail's model, and notes in words on the clock, the units and the long form."""

    tail_descriptions: dict[str, TailDescription] | None = None  # by row tail (asr@0.05); None: gold only
    # settle_buffer_tokens resolved per variant's seam and device (one value when all resolve alike);
    # None: whole drafts (so every eval written before the knob)
    scored_settle_buffer_tokens: Settle | dict[str, Settle] = None
    served_settle_buffer_tokens: dict[str, Settle] | None = None  # `alignatt serve`'s default per variant
    schedule: EvalSchedule
    uncertainty: EvalUncertainty | None = None  # None: before intervals were recorded
    longform: str | None = None
    computation_aware_clock: str
    latency_units: str
    offline_tail: str | None = None
    concurrent_streams: str | None = None
    # per variant, the seam options its engines built: the served route's (`served_route`); None:
    # recorded before, when vllm_capture engines ran without prefix caching, at the eval's batch limit
    engine_options: dict[str, dict[str, Any]] | None = None
    engine_processes: str | None = None
    under_load: str | None = None
    whisperlivekit: str | None = None
    wlk_driver: str | None = None
    # before whole talks: the long form replayed talks in chunks of this many pairs, and
    # longform_talks counted those chunks (kept as the artifact says; None since)
    pairs_per_talk: int | None = None

    @model_validator(mode="before")
    @classmethod
    def _historical(cls, data: Any) -> Any:
        """Artifacts written before the knobs were recorded whole kept the resolved settle under
        `settle_buffer_tokens` and the option under `settle_buffer_tokens_option` (both absent before
        the knob: whole drafts), and each row tail's model under `tails` (absent in the oldest: the
        gold tail alone): they move to their fields, `tails` reads as the kinds of those row tails."""
        if not isinstance(data, dict) or "tail_descriptions" in data:
            return data
        data = dict(data)
        if isinstance(data.get("tails"), dict):
            data["tail_descriptions"] = data["tails"]
            data["tails"] = list(dict.fromkeys(k.partition("@")[0] for k in data["tails"]))
        elif "tails" not in data:
            data["tails"] = ["gold"]
        if "settle_buffer_tokens_option" in data:
            data["scored_settle_buffer_tokens"] = data.pop("settle_buffer_tokens")
            data["settle_buffer_tokens"] = data.pop("settle_buffer_tokens_option")
        elif "settle_buffer_tokens" not in data:
            data["settle_buffer_tokens"] = "none"
        return data

    def settle_of(self, variant: str) -> Settle:
        """The settle_buffer_tokens a variant's drafts were scored with (None: whole drafts)."""
        value = self.scored_settle_buffer_tokens
        return value.get(variant) if isinstance(value, dict) else value


class EvalArtifact(_Artifact):
    kind: Literal["eval"] = "eval"
    config: EvalRecord
    test_set: dict[str, Any]  # name, direction, description, ids of the pairs used
    synthetic_weights: bool
    rows: list[EvalRow]
    comet: dict[str, Any]  # {"status": "ok", ...} or {"status": "skipped", "reason": ...}
    checks: list[Check] = Field(default_factory=list)  # 0 retractions, driver and variant equality
    # quality: a measurement; scorer smoke: a few sentences run to exercise the scorer (the CPU
    # profile), never a quality result
    purpose: Literal["quality", "scorer smoke"] = "quality"
    instance_logs: str | None = None  # SimulEval instance logs, relative to the artifact's folder
