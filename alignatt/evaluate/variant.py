"""One seam variant's rows: its streams replayed (here, or in engine processes of their own) and scored.

A variant's in-process streams (`jobs`) run `options.concurrency` at once through draft schedulers
(`shared_engine`), or with `options.engines` > 1 in that many replay processes, an engine each
(`shards`). The protocol drivers (`websocket`, `wlk`) replay the sentence rows through a server lent
the variant's seam, one stream at a time, and are checked against the in-process rows. The
under-load rows replay the first sentences again at each of `options.load_levels` streams at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property, partial
from typing import Any, Callable

from alignatt.capture.names import VLLM_CAPTURE
from alignatt.core.policy import DEFAULT_PRESET
from alignatt.core.progress import progress_bar
from alignatt.evaluate import engines as eval_engines
from alignatt.evaluate.emissions import StreamOutput
from alignatt.evaluate.jobs import Job, Replayer, by_row, ordered, source_words, variant_jobs
from alignatt.evaluate.outputs import OFFLINE
from alignatt.evaluate.replay import Schedule, WebSocketDriver
from alignatt.evaluate.rows import driver_check, longform_row, sentence_output, sentence_row
from alignatt.evaluate.shards import replay_in_shards
from alignatt.evaluate.shared_engine import ConcurrentStreams, describe_batches, stream_runner
from alignatt.evaluate.tails import TailModel
from alignatt.evaluate.testsets import TestPair, TestSet
from alignatt.evaluate.wlk_driver import WlkDriver
from alignatt.record.artifacts.options import EvalKnobs
from alignatt.serve.engine_client import ProcessBatchSeam

LOAD_TAIL = "gold"  # the under-load rows' tail


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
class Variant:
    """What one seam variant's rows replay and how they are labelled: the same for each of its rows."""

    options: EvalKnobs  # run.py's EvalOptions, checked
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

    @cached_property
    def jobs(self) -> list[Job]:
        """Its in-process streams (`variant_jobs`), built once: the progress bar counts their words, then they run."""
        inprocess = "inprocess" in self.options.drivers
        return variant_jobs(self.sentence_presets if inprocess else [], self.presets if inprocess else [],
                            self.options.row_tails(self.options.tails), _longform_rows(self.options), self.pairs,
                            self.talks, self.options.offline_baseline)

    def words(self) -> int:
        """How many source words the variant replays (the progress bar's total): its in-process jobs',
        the protocol drivers' sentences', and the under-load rows' sentences'. Words, not streams: a
        whole talk is hundreds of sentences' work, and it runs first (`ordered`), so a count of streams
        would promise hours while the talks run and minutes are left."""
        o = self.options
        protocol = len(o.drivers) - ("inprocess" in o.drivers)
        return (sum(job.words for job in self.jobs)
                + protocol * len(self.sentence_presets) * len(o.row_tails(o.tails)) * source_words(self.pairs)
                + len(o.load_levels) * source_words(self.pairs[:o.load_sentences]))


def eval_route(options: EvalKnobs, seam_name: str, seam_options: dict[str, Any]):
    """The route the variant's engines build: the one `alignatt serve` builds (`served_route`:
    vllm_capture with the server's prefix caching and batch limit), in the variant's mode. With a
    protocol driver, prefix caching is off: its replay is checked against the in-process one for
    identical emissions, which needs the same engine state, and a cache the in-process replay
    warmed is not (a cached key was computed in another prefill's shapes: bf16 bits may move)."""
    from alignatt.serve.config import DirectionRoute
    from alignatt.serve.pool import served_route

    route = served_route(DirectionRoute(model=options.model, seam=seam_name, heads=options.heads,
                                        top_k=options.top_k, device=options.device, dtype=options.dtype,
                                        seam_options=seam_options))
    if route.seam == VLLM_CAPTURE and set(options.drivers) - {"inprocess"}:
        return route.model_copy(update={"seam_options": {**route.seam_options, "enable_prefix_caching": False}})
    return route


def run_variant(v: Variant, seam_name: str, seam_options: dict[str, Any], factory):
    """Every preset and driver (and the offline baseline) on one seam variant: (rows, checks).
    The in-process streams of a row run `options.concurrency` at once (`shared_engine`); through
    engine processes (`shards`, `options.engines` of them) where `eval_engines.own_processes` says so."""
    from alignatt.serve.config import resolve_heads

    options, ts, progress = v.options, v.ts, v.progress
    direction = f"{ts.source_lang}-{ts.target_lang}"
    concurrency = options.concurrency
    settle = variant_settle(options, seam_name)  # what `alignatt serve` gives its sessions on this route
    replayer = Replayer(ts.source_lang, ts.target_lang, settle, v.schedule, v.tail_models)
    route = eval_route(options, seam_name, seam_options)
    heads = resolve_heads(route, direction)
    jobs = v.jobs
    bar = progress_bar(v.words(), f"eval {v.name}", "source word")
    tick = _ticker(bar)
    under_load = partial(_under_load_rows, v, replayer=replayer, tick=tick)
    try:
        if not eval_engines.own_processes(options.engines, route, options.drivers):
            progress(f"[{v.name}] loading the seam; drafts {settle_words(settle)}")
            seam = factory(route, heads)
            try:
                rows, checks = _replay_here(v, seam, route, direction, settle, jobs, replayer, tick)
                rows += under_load(seam=seam)
            finally:
                seam.close()
        else:
            specs = eval_engines.engine_specs(factory, route, heads, options.engines)  # refusals before any process
            progress(f"[{v.name}] replaying in {options.engines} process(es), an engine process each; drafts "
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


def _replay_here(v: Variant, seam, route, direction: str, settle: int | None, jobs: list[Job], replayer: Replayer,
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
        outputs = streams.map(lambda s, j: tick(replayer(s, jobs[j]), jobs[j].words), order,
                              [jobs[j].name for j in order])
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


def _variant_rows(v: Variant, replayed: dict, server, tick):
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
                    outs = [tick(sentence_output(driver, p, schedule, tails, tgt), len(p.source_words)) for p in pairs]
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



def variant_settle(options: EvalKnobs, seam_name: str) -> int | None:
    """The variant's settle_buffer_tokens, resolved as `alignatt serve` resolves its option for a route of
    this seam and device (`auto`: its served default there)."""
    from alignatt.serve.config import served_settle

    return served_settle(options.settle_buffer_tokens, seam_name, options.device)


def settle_words(settle: int | None) -> str:
    return "whole (max_new_tokens)" if settle is None else f"settled {settle} tokens past the first held token"


def _longform_rows(options: EvalKnobs) -> list[tuple[str, str]]:
    """(tail key, segmentation) of each long-form row: every long-form tail closed by the client's
    rule, and the oracle comparison for `longform_oracle_tails`."""
    return ([(k, "punctuation") for k in options.row_tails(options.longform_tails)]
            + [(k, "oracle") for k in options.row_tails(options.longform_oracle_tails)])


def _ticker(bar):
    """`tick(out, words)`: one stream of `words` source words replayed (the bar advances by them),
    its output passed through."""
    def tick(out, words: int):
        bar.update(words)
        return out
    return tick


def _under_load_rows(v: Variant, seam, replayer: Replayer, tick) -> list:
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
            outs = runner.map(lambda s, p: tick(replayer(s, Job((DEFAULT_PRESET, LOAD_TAIL), p)), len(p.source_words)),
                              pairs, [p.id for p in pairs])
            described = runner.describe()
        finally:
            runner.close()
        rows.append(sentence_row(pairs, outs, DEFAULT_PRESET, v.name, "inprocess", v.label, v.ts, v.schedule,
                                  LOAD_TAIL, options.bootstrap, level, role="under_load"))
        v.progress(f"[{v.name}] under load, {level} at once (N={len(pairs)}): BLEU {rows[-1].bleu:.2f}, "
                 f"LAAL CA {rows[-1].latency.get('ca_laal_ms')} ms; {described}")
    return rows
