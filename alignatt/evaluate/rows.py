"""One seam variant's replays as rows: a stream's output (a sentence, a talk, the offline
baseline), the rows scored from those outputs (quality with its intervals, latency in words and
ms), and the check that a protocol driver emitted what the in-process replay did."""

from __future__ import annotations

from itertools import accumulate

from alignatt.evaluate import scoring, uncertainty
from alignatt.evaluate.emissions import Emission, StreamOutput, join_units, stream_output, units
from alignatt.evaluate.replay import Driver, InProcessDriver, Schedule, replay
from alignatt.evaluate.tails import TailModel
from alignatt.evaluate.talks import whole_talks
from alignatt.evaluate.testsets import TestPair, TestSet
from alignatt.replay.stream import ends_sentence


def talks_of(pairs: list[TestPair], count: int | None, max_pairs: int | None = None) -> list[list[TestPair]]:
    """The long form's streams: whole talks in id order (`alignatt.evaluate.talks`), the first
    `count` (None: all; 0: none), each cut to its first `max_pairs` pairs when given (a CPU smoke)."""
    if count == 0:
        return []
    return [t[:max_pairs] if max_pairs else t for t in whole_talks(pairs, count)]


def eval_row(preset, variant, driver, form, label, outputs: list[StreamOutput], hypotheses, references,
         target_lang, latency, tail: str, negative=(), bootstrap: int = uncertainty.DEFAULT_BOOTSTRAP,
         concurrency: int = 1, role: str = "quality", committed_wer: float | None = None,
         segmentation: str | None = None):
    from alignatt.record.artifacts import EvalRow

    shown = sum(o.buffer_units_shown for o in outputs)
    replaced = sum(o.buffer_units_replaced for o in outputs)
    paths: dict[str, int] = {}
    for o in outputs:
        for k, v in o.paths.items():
            paths[k] = paths.get(k, 0) + v
    return EvalRow(
        preset=preset, variant=variant, driver=driver, form=form, label=label, tail=tail, concurrency=concurrency,
        role=role, committed_wer=committed_wer, segmentation=segmentation,
        instances=len(references), **scoring.quality(hypotheses, references, target_lang),
        quality_intervals=uncertainty.intervals(hypotheses, references, target_lang, bootstrap),
        latency=latency, negative_latency=list(negative), retractions=sum(o.retractions for o in outputs),
        buffer_units_shown=shown, buffer_units_replaced=replaced,
        buffer_replaced_share=round(replaced / shown, 4) if shown else None,
        updates=sum(o.updates for o in outputs), engine_calls=sum(o.engine_calls for o in outputs),
        wall_ms=round(sum(o.wall_ms for o in outputs), 3), paths=dict(sorted(paths.items())),
        hypotheses=hypotheses,
        emissions=[[(e.committed_words, e.arrived_words, e.cu_ms, e.ca_ms) for e in o.emissions] for o in outputs],
        read_words=[[e.read_words for e in o.emissions] for o in outputs],
        simuleval_ca=[[e.sim_ca_ms for e in o.emissions] for o in outputs],
        streams=[join_units([e.text for e in o.emissions], target_lang) for o in outputs] if form == "longform" else [],
    )


def sentence_row(pairs, outputs, preset, variant, driver, label, ts: TestSet, schedule: Schedule, tail: str,
                  bootstrap: int, concurrency: int = 1, role: str = "quality", committed_wer: float | None = None):
    items = [scoring.SentenceLatencyInput(p.reference, len(p.source_words), schedule.source_ms(len(p.source_words)),
                                          o.emissions) for p, o in zip(pairs, outputs)]
    latency, negative = scoring.sentence_latency(items, ts.target_lang)
    return eval_row(preset, variant, driver, "sentence", label, outputs, [o.hypothesis for o in outputs],
                [p.reference for p in pairs], ts.target_lang, latency, tail, negative, bootstrap, concurrency, role,
                committed_wer)


def longform_row(talks, outputs, preset, variant, driver, label, ts: TestSet, schedule: Schedule, tail: str,
                  bootstrap: int, concurrency: int = 1, committed_wer: float | None = None,
                  segmentation: str = "punctuation"):
    inputs = []
    for talk, out in zip(talks, outputs):
        spans, start = [], 0
        for p in talk:
            n = len(p.source_words)
            spans.append((schedule.source_ms(start), schedule.source_ms(n)))
            start += n
        inputs.append(scoring.TalkInput([p.reference for p in talk], spans, out.emissions))
    latency, resegmented, negative = scoring.longform(inputs, ts.target_lang)
    references = [p.reference for t in talks for p in t]
    # Quality of the long form is OmniSTEval's (sacrebleu on the resegmented output); the row's
    # own corpus scores of the same segments must agree with it.
    omni_quality = {"omnisteval_bleu": latency.pop("bleu"), "omnisteval_chrf": latency.pop("chrf")}
    latency.update(omni_quality, talks=len(talks), closed_utterances=sum(len(o.utterances) for o in outputs))
    return eval_row(preset, variant, driver, "longform", label, outputs, resegmented, references,
                ts.target_lang, latency, tail, negative, bootstrap, concurrency, "quality", committed_wer,
                segmentation)


def offline_output(driver: InProcessDriver, words: list[str], target_lang: str,
                    schedule: Schedule) -> StreamOutput:
    """The whole sentence in one final update, sent when the ASR commits its last word: every
    target unit is emitted then (the wait-for-the-sentence latency through the same schedule)."""
    driver.open()
    reply = driver.update(words, [], True, 0)
    driver.close()
    last_commit_ms = round(schedule.events(words)[-1].t * 1000.0, 3)
    n = len(words)
    emissions = [Emission(u, n, n, last_commit_ms, round(last_commit_ms + reply.round_trip_ms, 3))
                 for u in units(reply.committed_text, target_lang)]
    return StreamOutput(hypothesis=reply.committed_text, utterances=[reply.committed_text], emissions=emissions,
                        retractions=0, buffer_units_shown=0, buffer_units_replaced=0, updates=1,
                        engine_calls=reply.engine_calls, paths={reply.path: 1}, wall_ms=reply.round_trip_ms)


def same_emissions(a: StreamOutput, b: StreamOutput) -> bool:
    key = lambda o: [(e.text, e.committed_words, e.arrived_words, e.cu_ms) for e in o.emissions]  # noqa: E731
    return a.hypothesis == b.hypothesis and key(a) == key(b)


DRIVER_NAMES = {"websocket": "WebSocket", "wlk": "WhisperLiveKit-client"}


def driver_check(variant: str, preset: str, driver_name: str, pairs: list[TestPair],
                  inprocess: list[StreamOutput], other: list[StreamOutput]):
    """Whether a protocol driver emitted what the in-process one did, sentence by sentence."""
    from alignatt.record.artifacts import Check

    # WhisperLiveKit's client closes an utterance at any committed sentence mark, the replay a
    # sentence at its last word only: with such a mark inside, the two are not expected to agree.
    split = [driver_name == "wlk" and any(ends_sentence(w) for w in p.source_words[:-1]) for p in pairs]
    same = [same_emissions(x, y) for x, y, s in zip(inprocess, other, split) if not s]
    detail = f"{sum(same)}/{len(same)} sentences with identical text, ASR states and stream times"
    if any(split):
        detail += f"; {sum(split)} with a sentence mark before the last word not compared (the client splits them)"
    return Check(name=f"{variant} {preset}: in-process and {DRIVER_NAMES[driver_name]} replays emit the same",
                 passed=all(same), detail=detail)


def sentence_output(driver: Driver, pair: TestPair, schedule: Schedule, tails: TailModel,
                     target_lang: str) -> StreamOutput:
    return stream_output(replay(pair.source_words, driver, schedule, tail_model=tails, stream_id=pair.id),
                         target_lang)


def talk_output(driver: Driver, talk: list[TestPair], schedule: Schedule, tails: TailModel,
                 target_lang: str, segmentation: str = "punctuation") -> StreamOutput:
    """One whole talk as one stream. `punctuation`: utterances close where a real client would
    (the transcript's marks as recognised, the session's forced finals); `oracle`: at the reference
    segments' ends, the labelled comparison."""
    words = [w for p in talk for w in p.source_words]
    oracle = list(accumulate(len(p.source_words) for p in talk)) if segmentation == "oracle" else None
    return stream_output(replay(words, driver, schedule, close_on_punctuation=segmentation == "punctuation",
                                tail_model=tails, stream_id=talk_id(talk), oracle_ends=oracle), target_lang)


def talk_id(talk: list[TestPair]) -> str:
    """The talk's name and its pairs' span: the recogniser's draws are keyed by it."""
    return f"{talk[0].talk}:{talk[0].id}..{talk[-1].id}" if talk[0].talk else "+".join(p.id for p in talk)
