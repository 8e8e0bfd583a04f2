"""A variant's in-process streams as jobs: what each replays, in which order, and how.

A job is one stream of one row: a sentence of a (preset, tail) row, a whole talk of a (preset, tail,
segmentation) row, or a sentence of the offline baseline. The jobs are replayed longest first, so the
long talks start at once and the sentences fill the other places (`ordered`). `Replayer` replays a
job through whatever seam it is given (the variant's own, or a draft scheduler's session), and is
picklable, so an engine's shard of the jobs can be replayed in another process (`shards`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from alignatt.core.draft import Seam
from alignatt.core.policy import DEFAULT_PRESET
from alignatt.evaluate.emissions import StreamOutput
from alignatt.evaluate.outputs import OFFLINE
from alignatt.evaluate.replay import InProcessDriver, Schedule
from alignatt.evaluate.rows import offline_output, sentence_output, talk_id, talk_output
from alignatt.evaluate.tails import TailModel
from alignatt.evaluate.testsets import TestPair


@dataclass(frozen=True)
class Job:
    """`key`: the row it belongs to, (preset, tail key) for a sentence row, (preset, tail key,
    segmentation) for a long-form row, (OFFLINE,) for the offline baseline; `item`: a pair or a talk."""

    key: tuple[str, ...]
    item: TestPair | list[TestPair]

    @property
    def is_talk(self) -> bool:
        return len(self.key) == 3

    @property
    def name(self) -> str:
        return "/".join(self.key) + "/" + (talk_id(self.item) if self.is_talk else str(self.item.id))

    @property
    def words(self) -> int:
        return source_words(self.item if self.is_talk else [self.item])


def source_words(pairs: Sequence[TestPair]) -> int:
    """How many source words `pairs` replay (the progress bar counts words)."""
    return sum(len(p.source_words) for p in pairs)


def variant_jobs(sentence_presets: Sequence[str], talk_presets: Sequence[str], tail_keys: Sequence[str],
                 longform_rows: Sequence[tuple[str, str]], pairs: Sequence[TestPair],
                 talks: Sequence[list[TestPair]], offline: bool) -> list[Job]:
    """Every in-process stream of a variant's rows (`by_row` regroups them by row): the sentence
    rows of `sentence_presets`, the long-form rows of `talk_presets`, then the offline baseline."""
    jobs = [Job((preset, tail), pair) for preset in sentence_presets for tail in tail_keys for pair in pairs]
    jobs += [Job((preset, tail, segmentation), talk) for preset in talk_presets
             for tail, segmentation in (longform_rows if talks else []) for talk in talks]
    return jobs + ([Job((OFFLINE,), pair) for pair in pairs] if offline else [])


def ordered(jobs: Sequence[Job]) -> list[int]:
    """The jobs' indices, longest first (a stable sort: equal lengths keep row order). A talk is one
    long sequential stream; started last, it would keep the engines nearly idle at the end."""
    return sorted(range(len(jobs)), key=lambda j: -jobs[j].words)


def by_row(jobs: Sequence[Job], outputs: dict[int, StreamOutput]) -> dict[tuple[str, ...], list[StreamOutput]]:
    """Each row's outputs in its streams' order (`outputs`: by job index)."""
    rows: dict[tuple[str, ...], list[StreamOutput]] = {}
    for j, job in enumerate(jobs):
        rows.setdefault(job.key, []).append(outputs[j])
    return rows


@dataclass(frozen=True)
class Replayer:
    """How a variant's jobs are replayed: its languages, drafts' settling, schedule and tail models."""

    source_lang: str
    target_lang: str
    settle: int | None
    schedule: Schedule
    tail_models: dict[str, TailModel]

    def driver(self, seam: Seam, preset: str) -> InProcessDriver:
        return InProcessDriver(seam, preset, self.source_lang, self.target_lang, self.settle)

    def __call__(self, seam: Seam, job: Job) -> StreamOutput:
        if job.key == (OFFLINE,):
            return offline_output(self.driver(seam, DEFAULT_PRESET), job.item.source_words, self.target_lang,
                                  self.schedule)
        driver, tails = self.driver(seam, job.key[0]), self.tail_models[job.key[1]]
        if job.is_talk:
            return talk_output(driver, job.item, self.schedule, tails, self.target_lang, job.key[2])
        return sentence_output(driver, job.item, self.schedule, tails, self.target_lang)
