"""`alignatt eval`: replay a test set on each seam variant, score the rows, write the artifact.

Everything that can be wrong with the input is refused here, before a model loads. Then each seam
variant (e.g. `hf_qk_fast`, or `vllm_capture:cudagraph` and `vllm_capture:eager` on the same
instances) replays its rows (`alignatt.evaluate.variant`): the sentence rows (each sentence its own
stream, closed at its last word) at `sentence_presets`, once per tail (`alignatt.evaluate.tails`:
gold, asr once per committed WER, none) and driver; the long-form rows (whole talks,
`alignatt.evaluate.talks`) at every preset, closed by the client's rule or, in the labelled oracle
rows, at the reference ends, then resegmented against the references; and the offline baseline,
each whole sentence in one final update. Every row carries sacrebleu's bootstrap intervals of BLEU
and chrF, every sentence row a paired test against the offline row of its variant (Holm within
the artifact, `alignatt.evaluate.uncertainty`); the SimulEval instance logs are written beside the
artifact (`alignatt.evaluate.instance_log`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import ValidationInfo, field_validator

from alignatt.core.errors import AlignattError
from alignatt.core.policy import DEFAULT_PRESET
from alignatt.evaluate import engines as eval_engines, scoring, uncertainty
from alignatt.evaluate.asr_errors import AsrErrors
from alignatt.evaluate.instance_log import logs_dir, write_instance_logs
from alignatt.evaluate.outputs import OFFLINE
from alignatt.evaluate.replay import Schedule
from alignatt.evaluate.rows import talks_of
from alignatt.evaluate.shared_engine import streams_note
from alignatt.evaluate.tails import TailModel, vocabulary
from alignatt.evaluate.testsets import load_test_set, select
from alignatt.evaluate.variant import LOAD_TAIL, Variant, eval_route, run_variant, variant_settle
from alignatt.evaluate.wlk_driver import CLIENT_LATENCY
from alignatt.models.presets import SYNTHETIC_REVISION
from alignatt.record.artifacts.options import EvalKnobs
from alignatt.replay.wlk_client import load_wlk_client, wlk_version

RETRACTION_CHECK = "0 retractions in every replay"


class EvalOptions(EvalKnobs):
    """The eval's knobs (declared in record/artifacts/options.py:EvalKnobs, which an eval artifact
    records) with the checks that need serve/ and evaluate/: `alignatt eval`'s options
    (`--field-name`, or an older name its validation_alias lists) and a params.yaml
    `eval:`/`eval_directions:` section's keys. The noisy tail's model (`tail_noise`) is nested: its
    knobs are `--tail-noise-seed` and `--tail-p-*` (`alignatt.evaluate.tails.TAIL_NOISE_KNOBS`)."""

    @field_validator("settle_buffer_tokens", mode="before")
    @classmethod
    def _settle(cls, value: Any) -> Any:
        if value is None or value in ("auto", "none"):
            return value
        from alignatt.serve.config import served_settle

        try:
            return served_settle(value, "", "")  # N as serve parses it (at least 0)
        except AlignattError as e:
            raise ValueError(str(e)) from None

    def asr_errors(self, wer: float) -> AsrErrors:
        return AsrErrors(seed=self.asr_seed, committed_wer=wer, p_tail_revise=self.asr_p_tail_revise,
                         p_punct_drop=self.asr_p_punct_drop)

    @field_validator("engines")
    @classmethod
    def _engines(cls, engines: int, info: ValidationInfo) -> int:
        return eval_engines.check_engines(engines, info.data.get("concurrency", 1), info.data.get("drivers", []))


def parse_variant(variant: str) -> tuple[str, dict[str, Any]]:
    from alignatt.capture.names import SEAMS as KNOWN_SEAMS, VLLM_MODES

    seam, _, mode = variant.partition(":")
    if seam not in KNOWN_SEAMS:
        raise AlignattError(f"unknown seam {seam!r} in variant {variant!r}: use one of {', '.join(KNOWN_SEAMS)}")
    if mode and (seam != "vllm_capture" or mode not in VLLM_MODES):
        raise AlignattError(f"variant {variant!r}: only vllm_capture takes a mode ({', '.join(VLLM_MODES)})")
    return seam, ({"vllm_mode": mode} if mode else {})


def settle_config(options: EvalOptions, variants: list[tuple[str, str, dict[str, Any]]]) -> dict[str, Any]:
    """The artifact config's record of the drafts scored: `settle_buffer_tokens` resolved (one value when
    every variant resolves alike, else one per variant; the option as given is the knob) and per
    variant what `alignatt serve` serves there by default (the page says whether the eval scored it)."""
    from alignatt.serve.config import served_settle

    resolved = {v: variant_settle(options, seam) for v, seam, _ in variants}
    served = {v: served_settle("auto", seam, options.device) for v, seam, _ in variants}
    values = set(resolved.values())
    return {"scored_settle_buffer_tokens": values.pop() if len(values) == 1 else resolved,
            "served_settle_buffer_tokens": served}


def _variant_in_child(options: EvalOptions, variant: str):
    """One variant in a child process of its own (alignatt.record.isolated); its rows and checks."""
    from alignatt.record.artifacts import Check, EvalRow
    from alignatt.record.isolated import run_in_child

    child = options.model_copy(update={"variants": [variant], "isolate_variants": False, "comet_model": None})
    got = run_in_child("alignatt.evaluate.run:variant_in_child", {"options": child.model_dump(mode="json")},
                       f"the eval of variant {variant}")
    return [EvalRow.model_validate(r) for r in got["rows"]], [Check.model_validate(c) for c in got["checks"]]


def variant_in_child(payload: dict) -> dict:
    """`run_eval` of one variant, for `alignatt.record.isolated` (payload: the options)."""
    import sys

    artifact = run_eval(EvalOptions.model_validate(payload["options"]), None,
                        progress=lambda m: print(m, file=sys.stderr, flush=True))
    return {"rows": [r.model_dump(mode="json") for r in artifact.rows],
            "checks": [c.model_dump(mode="json") for c in artifact.checks if c.name != RETRACTION_CHECK]}


def run_eval(options: EvalOptions, out: str | Path | None = None, seam_factory=None, progress=print):
    """Run the whole evaluation; returns the `EvalArtifact` (written atomically to `out`)."""
    from alignatt.record.artifacts import ARTIFACT_SCHEMA_VERSION, Check, EvalArtifact, EvalRecord, write_artifact
    from alignatt.record.provenance import collect_provenance, model_identity
    from alignatt.serve.config import default_seam_factory, resolve_preset
    from alignatt.serve.protocol import ProtocolError

    # Everything that can be wrong with the input fails here, before a model loads.
    ts = load_test_set(options.test_set, options.direction)
    pairs = select(ts, options.limit, options.max_source_words)
    talks = talks_of(ts.pairs, None if options.longform_talks == "all" else options.longform_talks,
                     options.longform_max_pairs)
    if options.longform_talks and not talks:
        progress(f"test set {ts.name}: no talks (alignatt/data/eval/README.md), so no long-form rows")
    try:
        presets = [resolve_preset(p).name for p in options.presets]
        sentence_presets = [resolve_preset(p).name for p in options.sentence_presets or options.presets]
    except ProtocolError as e:
        raise AlignattError(e.message) from None
    if not set(sentence_presets) <= set(presets):
        raise AlignattError(f"sentence_presets must be some of presets ({', '.join(presets)}), "
                            f"not {', '.join(sentence_presets)}")
    variants = [(v, *parse_variant(v)) for v in options.variants]
    if "wlk" in options.drivers:
        load_wlk_client()  # not installed: one line naming the package, before any model loads
    schedule = Schedule(options.words_per_second, options.commit_lag_seconds, options.tail_visible_at)
    direction = f"{ts.source_lang}-{ts.target_lang}"
    try:
        model_id, revision = model_identity(options.model)
    except Exception:  # identity is best effort (a local path without metadata)
        model_id, revision = options.model, None
    synthetic = revision == SYNTHETIC_REVISION
    smoke = options.purpose == "scorer_smoke"
    label = "latency only" if synthetic else "scorer smoke" if smoke else "scored"
    factory = seam_factory or default_seam_factory
    vocab = vocabulary([p.source for p in ts.pairs])
    try:
        keys = options.row_tails([*options.tails, *options.longform_tails, *options.longform_oracle_tails,
                                  *([LOAD_TAIL] if options.load_levels else [])])
        tail_models = {k: TailModel(k.partition("@")[0], options.tail_noise, vocab,
                                    options.asr_errors(float(k.partition("@")[2] or 0)), options.commit_lag_seconds)
                       for k in dict.fromkeys(keys)}
    except ValueError as e:
        raise AlignattError(f"tail: {e}") from None

    rows, checks = [], []
    # vLLM engines each get a process of their own (as in the bench and the GPU checks): a second
    # engine in the same process is not something vLLM promises to support.
    isolate = options.isolate_variants
    if isolate is None:
        isolate = len(variants) > 1 and any(seam == "vllm_capture" for _, seam, _ in variants)
    for variant, seam_name, seam_options in variants:
        if isolate and seam_factory is None:
            got_rows, got_checks = _variant_in_child(options, variant)
        else:
            v = Variant(options, variant, ts, pairs, talks, presets, sentence_presets, schedule, label, tail_models,
                         progress)
            got_rows, got_checks = run_variant(v, seam_name, seam_options, factory)
        rows += got_rows
        checks += got_checks
    _paired_tests(rows, ts.target_lang, options, [p.reference for p in pairs])
    by_variant = {(r.variant, r.preset, _tail_key(r)): r.hypotheses for r in rows
                  if r.form == "sentence" and r.driver in ("inprocess", OFFLINE) and r.role == "quality"}

    checks.append(Check(name=RETRACTION_CHECK, passed=all(r.retractions == 0 for r in rows),
                        detail=", ".join(f"{r.preset}/{r.variant}/{r.driver}/{r.form}: {r.retractions}"
                                         for r in rows if r.retractions) or "none"))
    if len(variants) > 1:
        first = variants[0][0]
        for variant, _, _ in variants[1:]:
            for preset, tail in [*((p, t) for p in sentence_presets for t in options.row_tails(options.tails)),
                                 *([(OFFLINE, "none")] if options.offline_baseline else [])]:
                a, b = by_variant.get((first, preset, tail)), by_variant.get((variant, preset, tail))
                if a is None or b is None:
                    continue
                diff = [i for i, (x, y) in enumerate(zip(a, b)) if x != y]
                name = preset if preset == OFFLINE else f"{preset} tail={tail}"
                checks.append(Check(name=f"{name}: {variant} gives the same hypotheses as {first}",
                                    passed=not diff,
                                    detail=f"{len(a) - len(diff)}/{len(a)} identical"
                                    + (f"; differ at {diff[:10]}" if diff else "")
                                    + (f"; {options.concurrency} streams at once: batches form by timing, and "
                                       "bf16 batching can change drafts" if options.concurrency > 1 else "")))
    routes = {v: eval_route(options, seam, opts) for v, seam, opts in variants}
    own = any(eval_engines.own_processes(options.engines, route, options.drivers) for route in routes.values())
    comet = scoring.comet(options.comet_model, [p.source for p in pairs],
                          next((r.hypotheses for r in rows if r.preset == OFFLINE), rows[0].hypotheses),
                          [p.reference for p in pairs])
    artifact = EvalArtifact(
        schema_version=ARTIFACT_SCHEMA_VERSION,
        provenance=collect_provenance(model_id=model_id, model_revision=revision),
        config=EvalRecord.model_validate({
                **options.model_dump(), **settle_config(options, variants),
                "schedule": {"words_per_second": options.words_per_second,
                             "commit_lag_seconds": options.commit_lag_seconds,
                             "tail_visible_at": options.tail_visible_at},
                "longform": "whole talks of the test set in id order, one stream each (alignatt/data/eval/README.md)"
                            + (f", each cut to its first {options.longform_max_pairs} pairs"
                               if options.longform_max_pairs else "")
                            + "; utterances close where the client reads a sentence mark in the transcript as "
                              "recognised, or the session forces a final (segmentation punctuation), or at the "
                              "reference segments' ends (segmentation oracle: a comparison)",
                "computation_aware_clock": "engine serves updates one at a time: start = max(event time, "
                                           "previous reply), ready = start + measured round trip",
                "latency_units": "words read (headline, SimulEval's delays): source words committed plus the tail "
                                 "positions shown when a target unit was written; words committed: committed "
                                 "only (secondary); ms: stream time of the source (CU) and when the reply was "
                                 "ready (CA)",
                "tail_descriptions": {k: m.describe() for k, m in tail_models.items()},
                "offline_tail": "the offline baseline is sent the whole sentence, committed, with no tail",
                "engine_options": {v: route.seam_options for v, route in routes.items()},
                **({"concurrent_streams": streams_note(options.concurrency, options.engines)}
                   if options.concurrency > 1 else {}),
                **eval_engines.config_notes(options.engines, own),
                **({"under_load": f"the {DEFAULT_PRESET} preset, {LOAD_TAIL} tail, the first "
                                  f"{min(options.load_sentences, len(pairs))} sentences, replayed at each of "
                                  f"{options.load_levels} in-process streams at once on the variant's "
                                  + ("one fresh engine process alone" if own else "one engine")}
                   if options.load_levels else {}),
                "uncertainty": {"intervals": f"sacrebleu bootstrap, {options.bootstrap} resamples, 95 %",
                                "significance": f"{uncertainty.TEST_NAMES[options.significance]} of each preset "
                                                "row against the offline row of its variant, same sentences",
                                "curve_needs": uncertainty.MIN_SENTENCES_FOR_A_CURVE},
                **({"whisperlivekit": wlk_version(),
                    "wlk_driver": f"the unmodified client, latency={CLIENT_LATENCY} and the row's preset; round trip: "
                                  "its process() call, timed by the driver"} if "wlk" in options.drivers else {})}),
        test_set={"name": ts.name, "direction": direction, "description": ts.description,
                  "pairs_available": len(ts.pairs), "sentence_ids": [p.id for p in pairs],
                  "longform_ids": [[p.id for p in t] for t in talks],
                  "talks": [t[0].talk for t in talks]},
        synthetic_weights=synthetic,
        rows=rows,
        comet=comet,
        checks=checks,
        purpose="scorer smoke" if smoke else "quality",
        instance_logs=logs_dir(Path(out)).name if out is not None else None,
    )
    if out is not None:
        # The logs first: an artifact on disk always has its logs beside it.
        write_instance_logs(artifact, Path(out), pairs, talks, schedule, ts.target_lang)
        write_artifact(out, artifact)
    return artifact


def _tail_key(row) -> str:
    return f"asr@{row.committed_wer:g}" if row.tail == "asr" else row.tail


def _paired_tests(rows, target_lang: str, options: EvalOptions, references: list[str]) -> None:
    """Each preset's sentence row against the offline row of its variant (sacrebleu's PairedTest)."""
    from alignatt.record.artifacts import EvalPairedTest

    for base in [r for r in rows if r.driver == OFFLINE]:
        systems = {i: r.hypotheses for i, r in enumerate(rows)
                   if r.variant == base.variant and r.form == "sentence" and r.driver != OFFLINE
                   and r.role == "quality"}
        got = uncertainty.paired_tests(base.hypotheses, systems, references, target_lang,
                                       options.significance, options.significance_samples)
        for i, result in got.items():
            rows[i].significance = EvalPairedTest(against=f"offline ({base.variant})", **result)
    # one family per artifact (one direction): every row's test, both metrics, Holm-adjusted
    tested = [r for r in rows if r.significance is not None]
    for r, verdict in zip(tested, uncertainty.holm_verdicts([r.significance.model_dump() for r in tested])):
        r.significance = r.significance.model_copy(update=verdict)
