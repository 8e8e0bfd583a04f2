"""Whole talks of the test splits and their cleaned sources (alignatt/data/eval/README.md)."""

import json
from importlib import resources
from pathlib import Path

import pytest

from alignatt.evaluate.talks import normalise_source, pair_number, talk_starts, whole_talks
from alignatt.evaluate.testsets import NAMED_SETS, load_test_set

SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "data"


def _lines(direction: str) -> list[dict]:
    text = (resources.files("alignatt") / "data" / "eval" / NAMED_SETS[direction]).read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


@pytest.mark.parametrize("direction", sorted(NAMED_SETS))
def test_sources_are_their_raw_text_normalised(direction):
    cells = direction != "cs-en"
    for line in _lines(direction):
        raw = line.get("source_raw", line["source"])
        assert line["source"] == normalise_source(raw, cells), line["id"]
        assert '""' not in line["source"], line["id"]


def test_normalisation_undoes_the_csv_export():
    assert normalise_source('"Hello, I present ""Marked Personas"".') == 'Hello, I present "Marked Personas".'
    assert normalise_source('Thank you."') == "Thank you."
    # cs-en has no talk cells: a sentence-final quote is a quote
    assert normalise_source('řekl: "Nikdo."', cells=False) == 'řekl: "Nikdo."'


def test_talk_starts_rule():
    sources = [(1, '"Hi, I am A.'), (2, "We study X."), (3, 'Thank you."'), (4, "Next talk, no greeting."),
               (5, "Thank you so much."), (6, "Hello everyone, my name is B."),
               (7, "So let's now see the corpus."), (8, "Hello, I am C and now I talk about it.")]
    # 1: first; 4: after a closing quote; 6: a greeting after thanks; 8: a second speaker, no start
    assert talk_starts(sources) == [1, 4, 6]


@pytest.mark.parametrize("direction", ["en-de", "en-it", "en-zh"])
def test_talks_are_runs_of_ids_and_hold_every_boundary_the_split_shows(direction):
    lines = sorted(_lines(direction), key=lambda x: pair_number(x["id"]))
    talk_ids = [int(x["talk"].split("-")[1]) for x in lines]
    ids = [pair_number(x["id"]) for x in lines]
    assert all(t <= i for t, i in zip(talk_ids, ids))
    assert talk_ids == sorted(talk_ids)  # a talk is one run of ids, never interleaved
    boundaries = {ids[0]} | {i for i, a, b in zip(ids[1:], talk_ids, talk_ids[1:]) if a != b}
    shown = talk_starts((pair_number(x["id"]), x.get("source_raw", x["source"])) for x in lines)
    assert set(shown) <= boundaries


@pytest.mark.skipif(not SHARED.is_dir(), reason="the alignment files (../shared/data) are not on this machine")
@pytest.mark.parametrize("direction", ["en-de", "en-it", "en-zh"])
def test_talks_are_the_rule_on_the_alignment_files(direction):
    starts = set()
    for d in ("en-de", "en-it", "en-zh"):
        full = json.loads((SHARED / f"word_alignments_{d}.json").read_text(encoding="utf-8"))
        starts |= set(talk_starts((r["pair_id"], r["source_text"]) for r in full))
    for x in _lines(direction):
        assert x["talk"] == f"acl-{max(s for s in starts if s <= pair_number(x['id']))}"


def test_whole_talks_replay_in_id_order():
    ts = load_test_set("en-de")
    talks = whole_talks(ts.pairs)
    assert len(talks) == 17 and sum(len(t) for t in talks) == 703
    for talk in talks:
        assert len({p.talk for p in talk}) == 1
        assert [pair_number(p.id) for p in talk] == sorted(pair_number(p.id) for p in talk)
    assert whole_talks(load_test_set("cs-en").pairs) == []
