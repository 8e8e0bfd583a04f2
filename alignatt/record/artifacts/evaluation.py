"""Quality artifacts: `alignatt eval`'s rows, with their intervals and paired tests."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from alignatt.record.artifacts.base import Check, _Artifact, _Strict


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
