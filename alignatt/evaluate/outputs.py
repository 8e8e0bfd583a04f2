"""What the eval stage derives from an `EvalArtifact`: DVC metrics, plot data, and the report's view.

The audit recomputes the metrics and the plot data from the artifact beside them (`eval.json` ->
`eval_metrics.json`, `quality_latency.csv`), so neither can drift from what was measured.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

from alignatt.capture.names import VLLM_CAPTURE
from alignatt.core.policy import PRESET_NAMES
from alignatt.evaluate.units import counting_note
from alignatt.record.artifacts.evaluation import EvalRecord

OFFLINE = "offline"  # the baseline row: the whole source at once, as its preset and its driver
ROW_PRESETS = (*PRESET_NAMES, OFFLINE)

METRIC_KEYS = ("laal_words_read", "al_words_read", "laal_words_committed", "al_words_committed",
               "laal_words", "al_words", "laal_ms", "ca_laal_ms", "al_ms", "ca_al_ms",
               "long_yaal", "ca_long_yaal", "stream_laal", "ca_stream_laal",
               "sim_ca_al_ms", "sim_ca_laal_ms", "sim_ca_long_yaal", "sim_ca_stream_laal")
PLOT_COLUMNS = ("variant", "driver", "preset", "tail", "label", "n", "bleu", "bleu_low", "bleu_high", "chrf",
                "laal_words_read", "laal_words_committed", "laal_ms", "ca_laal_ms")


def tail_key(row) -> str:
    """A row's tail as a key: `asr@0.15` for an ASR-like transcript at 15 % committed WER, `.oracle`
    after a long form closed at the reference ends (the tail alone for older artifacts)."""
    wer = getattr(row, "committed_wer", None)
    key = f"{row.tail}@{wer:g}" if wer is not None else row.tail
    return key + (".oracle" if getattr(row, "segmentation", None) == "oracle" else "")


def eval_metrics(artifact) -> dict[str, Any]:
    """Nested for `dvc metrics show/diff`: variant / driver / form / preset -> figures."""
    out: dict[str, Any] = {}
    for r in artifact.rows:
        figures = {"bleu": r.bleu, "chrf": r.chrf, "n": r.instances, "retractions": r.retractions,
                   "buffer_replaced_share": r.buffer_replaced_share}
        for name, ci in r.quality_intervals.items():
            figures.update({f"{name}_low": ci.low, f"{name}_high": ci.high})
        if r.significance is not None:
            figures.update({"bleu_p_vs_offline": r.significance.bleu_p, "chrf_p_vs_offline": r.significance.chrf_p})
        figures.update({k: r.latency[k] for k in METRIC_KEYS if k in r.latency})
        if r.role == "under_load":
            out.setdefault(r.variant, {}).setdefault("under_load", {})[str(r.concurrency)] = figures
            continue
        out.setdefault(r.variant, {}).setdefault(r.driver, {}).setdefault(r.form, {}).setdefault(
            tail_key(r), {})[r.preset] = figures
    return out


def quality_latency_points(artifact) -> list[dict[str, Any]]:
    """One point per preset and the offline baseline (sentence form), per variant and driver."""
    order = {name: i for i, name in enumerate(ROW_PRESETS)}
    points = []
    for r in artifact.rows:
        if r.form != "sentence" or r.role != "quality":
            continue
        ci = r.quality_intervals.get("bleu")
        points.append({"variant": r.variant, "driver": r.driver, "preset": r.preset, "tail": tail_key(r),
                       "label": r.label, "n": r.instances, "bleu": r.bleu,
                       "bleu_low": ci.low if ci else None, "bleu_high": ci.high if ci else None, "chrf": r.chrf,
                       "laal_words_read": r.latency.get("laal_words_read"),
                       "laal_words_committed": r.latency.get("laal_words_committed", r.latency.get("laal_words")),
                       "laal_ms": r.latency.get("laal_ms"), "ca_laal_ms": r.latency.get("ca_laal_ms")})
    return sorted(points, key=lambda p: (p["variant"], p["driver"], p["tail"], order.get(p["preset"], 9)))


def curve_note(artifact) -> str | None:
    """What the page says over a quality-latency curve that is no result (too few sentences)."""
    # the threshold the eval recorded (alignatt.evaluate.uncertainty.MIN_SENTENCES_FOR_A_CURVE);
    # read from the artifact so that the report stage does not import the scorers
    n = len(artifact.test_set.get("sentence_ids", []))
    MIN_SENTENCES_FOR_A_CURVE = artifact.config.uncertainty.curve_needs if artifact.config.uncertainty else 100
    if artifact.purpose == "scorer smoke":
        return (f"a smoke of the scorer on N = {n} sentences: not a quality result; the curve is not "
                "significant (see the intervals)")
    if n < MIN_SENTENCES_FOR_A_CURVE:
        return f"N = {n} < {MIN_SENTENCES_FOR_A_CURVE} sentences: the curve is not significant (see the intervals)"
    return None


def quality_latency_csv(artifact) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=PLOT_COLUMNS, lineterminator="\n")
    writer.writeheader()
    for p in quality_latency_points(artifact):
        writer.writerow({k: "" if p[k] is None else p[k] for k in PLOT_COLUMNS})
    return buf.getvalue()


def metrics_path(artifact_path: Path) -> Path:
    return artifact_path.with_name(artifact_path.stem + "_metrics.json")


def plot_path(artifact_path: Path) -> Path:
    """eval.json -> quality_latency.csv; eval_<name>.json -> quality_latency_<name>.csv."""
    suffix = artifact_path.stem.removeprefix("eval")
    return artifact_path.with_name(f"quality_latency{suffix}.csv")


def _atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


def write_derived(artifact, metrics: str | Path | None, plot: str | Path | None) -> None:
    if metrics:
        _atomic(Path(metrics), json.dumps(eval_metrics(artifact), indent=1, allow_nan=False) + "\n")
    if plot:
        _atomic(Path(plot), quality_latency_csv(artifact))


def derived_findings(path: Path, artifact) -> list[tuple[str, str]]:
    """(file, message) for metrics / plot data beside an eval artifact that it no longer gives."""
    findings = []
    m = metrics_path(path)
    if m.exists():
        try:
            same = json.loads(m.read_text(encoding="utf-8")) == eval_metrics(artifact)
        except json.JSONDecodeError:
            same = False
        if not same:
            findings.append((str(m), f"metrics do not match {path}: re-run the eval stage"))
    p = plot_path(path)
    if p.exists() and p.read_text(encoding="utf-8") != quality_latency_csv(artifact):
        findings.append((str(p), f"plot data do not match {path}: re-run the eval stage"))
    return findings


# ---- the Benchmarks page ----------------------------------------------------------------------


def _fmt(x, digits=1) -> str:
    return "—" if x is None else f"{x:.{digits}f}"


# The IWSLT 2026 simultaneous track's latency bands, on StreamLAAL (ms): low <= 2 s, high <= 4 s.
IWSLT_BANDS = (("low", 2000.0), ("high", 4000.0))


# A StreamLAAL below zero says output came before the speech it translates: mwerSegmenter placed a
# weak translation's words in the wrong segments. It is in no band.
BELOW_ZERO = "none: below 0"


def iwslt_band(stream_laal_ms: float | None) -> str | None:
    """The IWSLT band a StreamLAAL falls in (low, high), `above 4 s`, BELOW_ZERO, or None without a figure."""
    if stream_laal_ms is None:
        return None
    if stream_laal_ms < 0:
        return BELOW_ZERO
    return next((name for name, limit in IWSLT_BANDS if stream_laal_ms <= limit), "above 4 s")


def tail_label(row) -> str:
    """What a row replayed, as the page names it: the tail (with the committed WER of an ASR-like
    transcript) and, for the long form, how its utterances closed. Rows of an artifact written before
    whole talks (no `segmentation`) say so: 5-pair chunks closed on the gold source's marks."""
    wer = getattr(row, "committed_wer", None)
    label = (f"asr, committed WER {100 * wer:g} %" if row.tail == "asr" and wer is not None
             else "noisy (old tail noise, gold committed words)" if row.tail == "noisy" else row.tail)
    if row.form != "longform":
        return label
    seg = getattr(row, "segmentation", None)
    if seg is None:
        return label + "; old format: 5-pair chunks, closed on the gold source's marks"
    label += ("; whole talks, closed by the client (recognised marks, forced finals)" if seg == "punctuation"
              else "; whole talks, oracle segmentation (reference ends; a comparison)")
    cu, ca = (iwslt_band(row.latency.get(k)) for k in ("stream_laal", "ca_stream_laal"))
    if cu is not None:
        label += f"; IWSLT band {cu} (CU)" + (f", {ca} (CA)" if ca is not None else "")
    return label


def talk_rows_with_asr(artifact) -> list[Any]:
    """Whole talks, closed by the client, ASR-like transcript at the highest committed WER: the field's
    setting. Empty for an artifact without such rows (older ones)."""
    rows = [r for r in artifact.rows if r.role == "quality" and r.form == "longform" and r.tail == "asr"
            and getattr(r, "segmentation", None) == "punctuation" and r.committed_wer is not None]
    worst = max((r.committed_wer for r in rows), default=None)
    return [r for r in rows if r.committed_wer == worst]


def headline_talk_rows(artifact, bands=IWSLT_BANDS) -> list[tuple[str, Any]]:
    """The headline's rows: per IWSLT band, the row of `talk_rows_with_asr` of best BLEU whose
    StreamLAAL (computation-aware, the real-time queue) is within it (never one below zero)."""
    rows = talk_rows_with_asr(artifact)
    out = []
    for name, limit in bands:
        fit = [r for r in rows if 0 <= ca_stream_laal(r) <= limit]
        if fit:
            out.append((name, max(fit, key=lambda r: r.bleu)))
    return out


def ca_stream_laal(row) -> float:
    """A talk row's StreamLAAL (computation-aware, the real-time queue) in ms; inf without one."""
    x = row.latency.get("ca_stream_laal")
    return float("inf") if x is None else x


def below_zero_talk_rows(artifact) -> list[Any]:
    """The rows of `talk_rows_with_asr` that no band may take: StreamLAAL (computation-aware) below 0."""
    return [r for r in talk_rows_with_asr(artifact) if ca_stream_laal(r) < 0]


def _interval(row, name: str) -> str:
    c = row.quality_intervals.get(name)
    return "—" if c is None else f"[{c.low:.1f}, {c.high:.1f}]"


MARK = "†"  # a lag with negative instances inside its mean, or a negative figure


def _lag(value, digits: int, negative: bool) -> str:
    """A lag as the page prints it: marked where instances below 0 are inside it or it is below 0."""
    return _fmt(value, digits) + (MARK if negative or (value is not None and value < 0) else "")


def _negative_keys(row) -> set[str]:
    return {n.metric for n in row.negative_latency}


def holm_section(artifact) -> dict[int, dict]:
    """Row index -> its paired test's Holm verdict, recomputed from the recorded raw p: one family per
    artifact (every row's test against offline, BLEU and chrF). The same as a new artifact records
    (`uncertainty.holm_verdicts`), so an artifact written before the correction reads the same way."""
    from alignatt.evaluate.uncertainty import holm_verdicts

    tested = [(i, r.significance) for i, r in enumerate(artifact.rows)
              if r.role == "quality" and r.significance is not None]
    verdicts = holm_verdicts([{"bleu_p": s.bleu_p, "chrf_p": s.chrf_p, "resolvable": s.resolvable} for _, s in tested],
                             level=tested[0][1].level if tested else 0.05)
    return {i: v for (i, _), v in zip(tested, verdicts)}


def _offline_of(artifact, row):
    return next((b for b in artifact.rows if b.driver == OFFLINE and b.variant == row.variant
                 and b.role == "quality" and b.form == "sentence"), None)


def _verdict(artifact, row, holm: dict) -> str:
    """Significant after Holm in both metrics: above or below offline; otherwise not significant."""
    if not holm["significant"]:
        return "not significant"
    base = _offline_of(artifact, row)
    if base is None:
        return "significant"
    up = [row.bleu > base.bleu, row.chrf > base.chrf]
    return "**above offline**" if all(up) else "**below offline**" if not any(up) else "significant, BLEU and chrF disagree"


def _p_cell(artifact, row, holm: dict | None) -> str:
    sig = row.significance
    if sig is None:
        return "—"
    text = f"{sig.bleu_p:.3g} / {sig.chrf_p:.3g} (raw); {holm['bleu_p_holm']:.3g} / {holm['chrf_p_holm']:.3g} (Holm)"
    return (text + f" ({sig.method}, N={sig.n}" + ("" if sig.resolvable else ": too few sentences to resolve p < 0.05")
            + f"): {_verdict(artifact, row, holm)}")


def brevity_penalties(artifact) -> list[str]:
    """BLEU's brevity penalty per sentence-form quality row, where the artifact recorded it."""
    out = []
    for r in artifact.rows:
        ci = r.quality_intervals.get("bleu")
        if r.form == "sentence" and r.role == "quality" and ci is not None and ci.bp is not None:
            name = OFFLINE if r.driver == OFFLINE else f"{r.preset} tail={tail_label(r)}"
            out.append(f"{r.variant} {name} {ci.bp:.3f} ({ci.sys_len}/{ci.ref_len})")
    return out


def report_section(root: Path, paths: list[tuple[str, Any]]) -> list[dict[str, Any]]:
    """One entry per eval artifact: its tables (one per preset) and its quality-vs-latency points."""
    sections = []
    for rel, a in paths:
        p = a.provenance
        presets: dict[str, list[dict[str, str]]] = {}
        holm = holm_section(a)
        for index, r in enumerate(a.rows):
            if r.role != "quality":
                continue
            lat = r.latency
            neg = _negative_keys(r)

            def fig(key, digits, fallback=None):
                value = lat.get(key, lat.get(fallback) if fallback else None)
                return _lag(value, digits, key in neg or (fallback is not None and key not in lat and fallback in neg))

            def both(key):
                """A CA figure under both conventions where the row has SimulEval's (newer artifacts)."""
                if lat.get(f"sim_{key}") is None:
                    return fig(key, 0)
                return f"{fig(key, 0)} queue, {fig(f'sim_{key}', 0)} SimulEval"

            presets.setdefault(r.preset, []).append({
                "tail": tail_label(r), "bleu_ci": _interval(r, "bleu"), "chrf_ci": _interval(r, "chrf"),
                "p_offline": _p_cell(a, r, holm.get(index)),
                "al_read": fig("al_words_read", 2), "laal_read": fig("laal_words_read", 2),
                "laal_committed": fig("laal_words_committed", 2, "laal_words"),
                "negatives": ", ".join(f"{n.metric} {n.instances}/{n.scored} (min {n.min:.2f})"
                                       for n in r.negative_latency),
                "variant": r.variant, "driver": r.driver, "form": r.form, "label": r.label,
                "instances": str(r.instances), "bleu": _fmt(r.bleu), "chrf": _fmt(r.chrf),
                "laal_words": _fmt(lat.get("laal_words"), 2), "al_words": _fmt(lat.get("al_words"), 2),
                "laal_ms": fig("laal_ms", 0), "ca_laal_ms": both("ca_laal_ms"),
                "al_ms": fig("al_ms", 0), "ca_al_ms": fig("ca_al_ms", 0),
                "long_yaal": fig("long_yaal", 0), "ca_long_yaal": both("ca_long_yaal"),
                "stream_laal": fig("stream_laal", 0), "ca_stream_laal": both("ca_stream_laal"),
                "retractions": str(r.retractions),
                "replaced": "—" if r.buffer_replaced_share is None else f"{100 * r.buffer_replaced_share:.0f}%",
            })
        cfg = a.config
        sections.append({
            "path": rel, "date": p.date, "machine": p.gpu_name or "CPU", "model": cfg.model,
            "synthetic": a.synthetic_weights, "test_set": a.test_set.get("name"),
            "direction": a.test_set.get("direction"), "description": a.test_set.get("description"),
            "sentences": len(a.test_set.get("sentence_ids", [])),
            "purpose": a.purpose, "curve_note": curve_note(a), "instance_logs": a.instance_logs,
            "tails": {k: v.description + (f" {v.tail_noise.model_dump()}" if v.tail_noise else "")
                      for k, v in cfg.tail_descriptions.items()} if cfg.tail_descriptions else
                     {"gold": "tail = the gold source words"},
            "uncertainty": cfg.uncertainty.model_dump() if cfg.uncertainty else None,
            "talks": len(a.test_set.get("longform_ids", [])),
            "target_units": counting_note(a.test_set.get("direction") or ""),
            "wps": cfg.words_per_second, "lag": cfg.commit_lag_seconds,
            "presets": [(name, presets[name]) for name in ROW_PRESETS if name in presets],
            "points": point_rows(a),
            "holm_note": holm_note(a, holm),
            "brevity_penalties": brevity_penalties(a),
            "under_load": under_load_rows(a), "under_load_note": cfg.under_load,
            "ran": {"variants": ", ".join(cfg.variants), "presets": ", ".join(cfg.presets) + (
                        f" (sentence rows: {', '.join(cfg.sentence_presets)})" if cfg.sentence_presets else ""),
                    "tails": ", ".join(cfg.tail_descriptions or ["gold"]),
                    "streams": cfg.concurrent_streams or (
                        f"{cfg.concurrency} streams at once through one draft scheduler"
                        if cfg.concurrency > 1 else "one stream at a time"),
                    "limit": cfg.limit, "max_source_words": cfg.max_source_words},
            "settle": cfg.scored_settle_buffer_tokens,  # None: every draft whole (all evals before the knob)
            "scored": scored_configuration(cfg),
            "engine": engine_words(cfg),
            "not_served": not_served_default(cfg, p.gpu_name),
            "negative_whys": negative_whys(a),
            "checks": [("✓" if c.passed else "✗", c.name, c.detail) for c in a.checks],
            "comet": a.comet.get("system_score") if a.comet.get("status") == "ok" else
                     f"skipped: {a.comet.get('reason')}",
        })
    return sections


LAG_POINT_KEYS = {"laal_words_read": ("laal_words_read",), "laal_words_committed": ("laal_words_committed", "laal_words"),
                  "laal_ms": ("laal_ms",), "ca_laal_ms": ("ca_laal_ms",)}


def point_rows(artifact) -> list[dict[str, Any]]:
    """The quality-latency points as the page prints them, each lag marked as in the preset tables."""
    negs = {(r.variant, r.driver, r.preset, tail_key(r)): _negative_keys(r) for r in artifact.rows
            if r.form == "sentence" and r.role == "quality"}
    out = []
    for pt in quality_latency_points(artifact):
        neg = negs.get((pt["variant"], pt["driver"], pt["preset"], pt["tail"]), set())
        row = {k: (_fmt(v, 2) if isinstance(v, float) or v is None else v) for k, v in pt.items()}
        for key, metrics in LAG_POINT_KEYS.items():
            row[key] = _lag(pt[key], 2, any(m in neg for m in metrics))
        out.append(row)
    return out


def holm_note(artifact, holm: dict[int, dict]) -> str | None:
    """How the p column is corrected: the family and the rule."""
    if not holm:
        return None
    level = next(r.significance.level for r in artifact.rows if r.significance is not None)
    family = next(iter(holm.values()))["family"]
    return (f"p corrected for multiple comparisons by Holm–Bonferroni over the artifact's family (every preset "
            f"row's test against offline, BLEU and chrF: {family} tests); a row is significant only when both "
            f"its adjusted p are below {level:g}, recomputed here from the recorded raw p")


def negative_whys(artifact) -> list[str]:
    """Why a lag falls below 0, said once per artifact rather than once per figure: what a negative
    lag is, then one clause per unit that has one (words read, words committed, ms, long form). The
    wording is the page's, from the metric names, not the `why` an older artifact recorded."""
    from alignatt.evaluate.units import NEGATIVE_UNITS, NEGATIVE_WHY, NEGATIVE_WHY_BY_UNIT, negative_unit

    units = {negative_unit(n.metric) for r in artifact.rows if r.role in ("quality", "under_load")
             for n in r.negative_latency}
    if not units:
        return []
    return [NEGATIVE_WHY, *(NEGATIVE_WHY_BY_UNIT[u] for u in NEGATIVE_UNITS if u in units)]


def under_load_rows(artifact) -> list[dict[str, str]]:
    """The quality-under-load rows of an artifact, each with how many of its texts differ from
    the lowest level's (the same sentences, preset and tail)."""
    rows = [r for r in artifact.rows if r.role == "under_load"]
    out = []
    for r in rows:
        first = next(x for x in rows if x.variant == r.variant)
        differ = sum(a != b for a, b in zip(r.hypotheses, first.hypotheses))
        lat = r.latency
        neg = _negative_keys(r)
        out.append({"variant": r.variant, "level": str(r.concurrency), "preset": r.preset, "tail": r.tail,
                    "n": str(r.instances), "bleu": _fmt(r.bleu), "bleu_ci": _interval(r, "bleu"),
                    "chrf": _fmt(r.chrf), "laal_read": _lag(lat.get("laal_words_read"), 2, "laal_words_read" in neg),
                    "laal_ms": _lag(lat.get("laal_ms"), 0, "laal_ms" in neg),
                    "ca_laal_ms": _lag(lat.get("ca_laal_ms"), 0, "ca_laal_ms" in neg),
                    "retractions": str(r.retractions),
                    "rtt_ms": _fmt(r.wall_ms / r.updates if r.updates else None, 0),
                    "differ": "—" if r is first else f"{differ}/{r.instances} (vs {first.concurrency} at once)"})
    return out


def _served_of(cfg: EvalRecord, variant: str, gpu_name: str | None) -> int | None:
    """What `alignatt serve` serves by default on the variant's seam and the eval's device."""
    from alignatt.serve.config import served_settle

    device = cfg.device or ("cuda" if gpu_name else "cpu")
    return served_settle("auto", str(variant).partition(":")[0], device)


def _drafts(settle: int | None) -> str:
    return "whole drafts (max_new_tokens)" if settle is None else f"drafts settled {settle} tokens past the first held token"


def scored_configuration(cfg: EvalRecord) -> str:
    """Which server configuration the rows scored, per variant when they differ."""
    said = {v: _drafts(cfg.settle_of(v)) for v in cfg.variants}
    if len(set(said.values())) <= 1:
        return next(iter(said.values()), _drafts(cfg.settle_of("")))
    return "; ".join(f"{v}: {d}" for v, d in said.items())


def engine_words(cfg: EvalRecord) -> str | None:
    """The vLLM engine settings the rows ran with, beside the server's (None: no vllm_capture variant)."""
    vllm = [v for v in cfg.variants if v.partition(":")[0] == VLLM_CAPTURE]
    if not vllm:
        return None
    if cfg.engine_options is None:  # before the eval built the served route
        return ("the eval's vLLM engines ran without prefix caching, which `alignatt serve` turns on, and with a "
                "batch limit (`max_num_seqs`) of their own. Neither changes the model's math, only the GEMM shapes "
                "a key is computed with: in float32, rows with the cache on and off agree to the cross-engine "
                "bound with identical tokens (`tests/gpu/test_vllm_batching.py`); in bfloat16 the difference, "
                "like that of two batch compositions, can part a served stream from the scored one where two "
                "tokens are that close")
    from alignatt.serve.config import SERVED_VLLM_OPTIONS

    said = []
    for v in vllm:
        got = cfg.engine_options.get(v, {})
        # the mode is the variant's own (its name says it); every other served option is compared
        other = [k for k, served in SERVED_VLLM_OPTIONS.items() if k != "vllm_mode" and got.get(k) != served]
        said.append(f"`{v}`: " + ", ".join(f"{k} {o}" for k, o in sorted(got.items()))
                    + (f" (**not the server's {', '.join(other)}**: the protocol drivers' replays are checked "
                       "against the in-process ones for identical emissions, which needs the same engine state)"
                       if other else " (the server's)"))
    return "; ".join(said)


def not_served_default(cfg: EvalRecord, gpu_name: str | None) -> bool:
    """Whether the eval scored another draft length than `alignatt serve` serves by default for one of
    its variants on its device (the recorded settle_buffer_tokens against `served_settle("auto", ...)`)."""
    return any(cfg.settle_of(v) != _served_of(cfg, v, gpu_name) for v in cfg.variants)
