"""`alignatt eval`: replay a test set per preset, seam variant and driver; score; write the artifact.

Per seam variant (e.g. `hf_qk_fast`, or `vllm_capture:cudagraph` and `vllm_capture:eager` on the
same instances), per preset and per driver, every sentence is replayed as its own stream (one
session each, closed at its last word); whole talks (`alignatt.evaluate.talks`, no boundaries
given) are replayed with utterance closing left to the sentence marks of the transcript as the
client sees it and the session's own forced finals (or, in the labelled oracle rows, the
reference ends), then resegmented against the references. The offline baseline
translates each whole sentence in one final update (same session, model and prompt).

Each preset is replayed once per tail (`alignatt.evaluate.tails`: gold, asr once per committed
WER, none; noisy, the older tail noise), each a row of its own. Every sentence row carries sacrebleu's bootstrap intervals of BLEU and chrF, and every
preset row a paired test against the offline row of its variant (`alignatt.evaluate.uncertainty`);
the SimulEval instance logs are written beside the artifact (`alignatt.evaluate.instance_log`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Callable

from pydantic import ValidationInfo, field_validator

from alignatt.core.errors import AlignattError
from alignatt.core.progress import progress_bar
from alignatt.evaluate import engines as eval_engines, scoring, uncertainty
from alignatt.evaluate.instance_log import logs_dir, write_instance_logs
from alignatt.evaluate.outputs import OFFLINE
from alignatt.evaluate.emissions import StreamOutput
from alignatt.evaluate.jobs import Job, Replayer, by_row, ordered, variant_jobs
from alignatt.evaluate.replay import Schedule, WebSocketDriver
from alignatt.evaluate.rows import driver_check, longform_row, sentence_output, sentence_row, talks_of
from alignatt.evaluate.shards import replay_in_shards
from alignatt.evaluate.shared_engine import (ConcurrentStreams, batch_limit_options, describe_batches, stream_runner,
                                             streams_note)
from alignatt.serve.engine_client import ProcessBatchSeam
from alignatt.evaluate.asr_errors import AsrErrors
from alignatt.evaluate.tails import TailModel, vocabulary
from alignatt.evaluate.testsets import TestPair, TestSet, load_test_set, select
from alignatt.evaluate.wlk_driver import CLIENT_LATENCY, WlkDriver
from alignatt.models.presets import SYNTHETIC_REVISION
from alignatt.record.artifacts.options import EvalKnobs
from alignatt.core.policy import DEFAULT_PRESET
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


class _Borrowed:
    """The eval's seam lent to a server: the server's shutdown must not close it."""

    def __init__(self, seam) -> None:
        self._seam = seam
        self.name = seam.name

    def draft(self, request):
        return self._seam.draft(request)

    def close(self) -> None:
        pass


@dataclass(frozen=True)
class _Variant:
    """What one seam variant's rows replay and how they are labelled: the same for each of its rows."""

    options: EvalOptions
    name: str  # the variant, e.g. vllm_capture:fullgraph
    ts: TestSet
    pairs: list[TestPair]
    talks: list[list[TestPair]]
    presets: list[str]  # the long-form rows' presets, resolved
    sentence_presets: list[str]  # the sentence rows' (some of `presets`)
    schedule: Schedule
    label: str
    tail_models: dict[str, TailModel]
    progress: Callable[[str], None]

    def jobs(self) -> list[Job]:
        inprocess = "inprocess" in self.options.drivers
        return variant_jobs(self.sentence_presets if inprocess else [], self.presets if inprocess else [],
                            self.options.row_tails(self.options.tails), _longform_rows(self.options), self.pairs,
                            self.talks, self.options.offline_baseline)

    def streams(self) -> int:
        """How many streams (sentences, talks) the variant replays: the progress bar's total."""
        o = self.options
        return (len(self.sentence_presets) * len(o.row_tails(o.tails)) * len(o.drivers) * len(self.pairs)
                + (len(self.presets) * len(_longform_rows(o)) * len(self.talks) if self.talks else 0)
                + (len(self.pairs) if o.offline_baseline else 0)
                + len(o.load_levels) * len(self.pairs[:o.load_sentences]))


def _run_variant(v: _Variant, seam_name: str, seam_options: dict[str, Any], factory):
    """Every preset and driver (and the offline baseline) on one seam variant: (rows, checks).
    The in-process streams of a row run `options.concurrency` at once (`shared_engine`); with
    `options.engines` > 1, in that many processes, an engine each (`shards`)."""
    from alignatt.serve.config import DirectionRoute, resolve_heads

    options, ts, progress = v.options, v.ts, v.progress
    direction = f"{ts.source_lang}-{ts.target_lang}"
    concurrency = options.concurrency
    settle = variant_settle(options, seam_name)  # what `alignatt serve` gives its sessions on this route
    replayer = Replayer(ts.source_lang, ts.target_lang, settle, v.schedule, v.tail_models)
    route = DirectionRoute(model=options.model, seam=seam_name, heads=options.heads, top_k=options.top_k,
                           device=options.device, dtype=options.dtype,
                           seam_options=batch_limit_options(seam_name, seam_options,
                                                            max([concurrency, *options.load_levels])))
    heads = resolve_heads(route, direction)
    jobs = v.jobs()
    bar = progress_bar(v.streams(), f"eval {v.name}", "stream")
    tick = _ticker(bar)
    under_load = partial(_under_load_rows, v, replayer=replayer, tick=tick)
    try:
        if options.engines == 1:
            progress(f"[{v.name}] loading the seam; drafts {settle_words(settle)}")
            seam = factory(route, heads)
            try:
                rows, checks = _replay_here(v, seam, route, direction, settle, jobs, replayer, tick)
                rows += under_load(seam=seam)
            finally:
                seam.close()
        else:
            specs = eval_engines.engine_specs(factory, route, heads, options.engines)  # refusals before any process
            progress(f"[{v.name}] replaying in {options.engines} processes, an engine each; drafts "
                     f"{settle_words(settle)}")
            got = replay_in_shards(specs, jobs, ordered(jobs), replayer, concurrency, bar.update)
            rows, checks = _variant_rows(v, by_row(jobs, got.outputs), None, tick)
            progress(f"[{v.name}] in-process streams: "
                     f"{describe_batches(got.batch_sizes, concurrency, got.engine_limit)}")
            if options.load_levels:  # what one engine sees: a fresh one, the shards' engines closed
                seam = ProcessBatchSeam(specs[0], "eval-load")
                try:
                    rows += under_load(seam=seam)
                finally:
                    seam.close()
    finally:
        bar.close()
    return rows, checks


def _replay_here(v: _Variant, seam, route, direction: str, settle: int | None, jobs: list[Job], replayer: Replayer,
                 tick):
    """The variant's rows on its seam in this process (and, for the protocol drivers, a server lent it)."""
    from alignatt.serve.config import ServerConfig

    options = v.options
    streams = stream_runner(seam, options.concurrency)
    server = None
    try:
        if {"websocket", "wlk"} & set(options.drivers):
            from alignatt.serve.server import ServerThread

            # One engine, in this process: the server drafts with the variant's seam.
            config = ServerConfig(host="127.0.0.1", port=0, directions={direction: route}, engines=1,
                                  settle_buffer_tokens=settle)
            server = ServerThread(config, lambda r, h: _Borrowed(seam)).start()
        order = ordered(jobs)
        outputs = streams.map(lambda s, j: tick(replayer(s, jobs[j])), order, [jobs[j].name for j in order])
        rows, checks = _variant_rows(v, by_row(jobs, dict(zip(order, outputs))), server, tick)
        if options.concurrency > 1:
            v.progress(f"[{v.name}] in-process streams: {streams.describe()}")
    finally:
        try:
            if server is not None:
                server.stop()
        finally:
            # The rows' scheduler ends before the levels' start: two engine threads must never share a seam.
            streams.close()
    return rows, checks


def _variant_rows(v: _Variant, replayed: dict, server, tick):
    """The variant's quality rows from its replayed streams (and the protocol drivers' replays
    through `server`, one stream at a time): (rows, checks)."""
    options, ts, pairs, talks, schedule, variant = v.options, v.ts, v.pairs, v.talks, v.schedule, v.name
    src, tgt, concurrency = ts.source_lang, ts.target_lang, options.concurrency
    rows, checks = [], []
    for preset in v.presets:
        for tail_key in options.row_tails(options.tails) if preset in v.sentence_presets else []:
            tails = v.tail_models[tail_key]
            tail, wer = tails.kind, tails.committed_wer
            sentence_outputs: dict[str, list[StreamOutput]] = {}
            for driver_name in options.drivers:
                if driver_name == "inprocess":
                    outs = replayed[preset, tail_key]
                else:  # through the server, one stream at a time
                    driver = (WebSocketDriver(server.url, preset, src, tgt) if driver_name == "websocket"
                              else WlkDriver(server, preset, src, tgt, schedule.words_per_second))
                    outs = [tick(sentence_output(driver, p, schedule, tails, tgt)) for p in pairs]
                sentence_outputs[driver_name] = outs
                rows.append(sentence_row(pairs, outs, preset, variant, driver_name, v.label, ts, schedule,
                                          tail, options.bootstrap,
                                          concurrency if driver_name == "inprocess" else 1,
                                          committed_wer=wer))
                v.progress(f"[{variant}] {preset} {driver_name} tail={tail_key}: BLEU {rows[-1].bleu:.2f} "
                           f"(N={len(pairs)}), LAAL {rows[-1].latency.get('laal_words_read')} words read")
            for driver_name in ("websocket", "wlk"):
                if "inprocess" in sentence_outputs and driver_name in sentence_outputs:
                    checks.append(driver_check(f"{variant} tail={tail_key}", preset, driver_name, pairs,
                                                sentence_outputs["inprocess"], sentence_outputs[driver_name]))
        for tail_key, segmentation in _longform_rows(options) if talks else []:
            tails = v.tail_models[tail_key]
            outs = replayed[preset, tail_key, segmentation]
            rows.append(longform_row(talks, outs, preset, variant, "inprocess", v.label, ts, schedule,
                                      tails.kind, options.bootstrap, concurrency, tails.committed_wer,
                                      segmentation))
            v.progress(f"[{variant}] {preset} long form tail={tail_key} segmentation={segmentation}: "
                       f"StreamLAAL {rows[-1].latency.get('stream_laal')} ms, LongYAAL "
                       f"{rows[-1].latency.get('long_yaal')} ms")
    if options.offline_baseline:
        row = sentence_row(pairs, replayed[OFFLINE,], OFFLINE, variant, OFFLINE, v.label, ts, schedule, "none",
                           options.bootstrap, concurrency)
        rows.append(row)
        v.progress(f"[{variant}] offline baseline: BLEU {row.bleu:.2f}")
    return rows, checks


LOAD_TAIL = "gold"


def variant_settle(options: EvalOptions, seam_name: str) -> int | None:
    """The variant's settle_buffer_tokens, resolved as `alignatt serve` resolves its option for a route of
    this seam and device (`auto`: its served default there)."""
    from alignatt.serve.config import served_settle

    return served_settle(options.settle_buffer_tokens, seam_name, options.device)


def settle_words(settle: int | None) -> str:
    return "whole (max_new_tokens)" if settle is None else f"settled {settle} tokens past the first held token"


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


def _longform_rows(options: EvalOptions) -> list[tuple[str, str]]:
    """(tail key, segmentation) of each long-form row: every long-form tail closed by the client's
    rule, and the oracle comparison for `longform_oracle_tails`."""
    return ([(k, "punctuation") for k in options.row_tails(options.longform_tails)]
            + [(k, "oracle") for k in options.row_tails(options.longform_oracle_tails)])


def _ticker(bar):
    """`tick(out)`: one stream replayed (the bar advances), its output passed through."""
    def tick(out):
        bar.update(1)
        return out
    return tick


def _under_load_rows(v: _Variant, seam, replayer: Replayer, tick) -> list:
    """Quality under load: the default preset's gold-tail replay of the same first sentences at each
    of `options.load_levels` streams at once, on one engine alone (the variant's seam, or with several
    engines a fresh process of the first one's; its batch limit was raised to the highest level).
    Each level, 1 included, drafts through a draft scheduler of its own, as a server drafts for its
    speakers."""
    options, pairs = v.options, v.pairs[:v.options.load_sentences]
    rows = []
    for level in options.load_levels:
        runner = ConcurrentStreams(seam, level)
        try:
            outs = runner.map(lambda s, p: tick(replayer(s, Job((DEFAULT_PRESET, LOAD_TAIL), p))), pairs,
                              [p.id for p in pairs])
            described = runner.describe()
        finally:
            runner.close()
        rows.append(sentence_row(pairs, outs, DEFAULT_PRESET, v.name, "inprocess", v.label, v.ts, v.schedule,
                                  LOAD_TAIL, options.bootstrap, level, role="under_load"))
        v.progress(f"[{v.name}] under load, {level} at once (N={len(pairs)}): BLEU {rows[-1].bleu:.2f}, "
                 f"LAAL CA {rows[-1].latency.get('ca_laal_ms')} ms; {described}")
    return rows


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
            v = _Variant(options, variant, ts, pairs, talks, presets, sentence_presets, schedule, label, tail_models,
                         progress)
            got_rows, got_checks = _run_variant(v, seam_name, seam_options, factory)
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
                **({"concurrent_streams": streams_note(options.concurrency, options.engines)}
                   if options.concurrency > 1 else {}),
                **eval_engines.config_notes(options.engines),
                **({"under_load": f"the {DEFAULT_PRESET} preset, {LOAD_TAIL} tail, the first "
                                  f"{min(options.load_sentences, len(pairs))} sentences, replayed at each of "
                                  f"{options.load_levels} in-process streams at once on the variant's "
                                  + ("one engine" if options.engines == 1 else "one fresh engine process alone")}
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
