"""The held-out test splits of every direction the embedded model has heads for."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

import pytest

from alignatt.evaluate.testsets import CALIBRATION_PAIRS, SET_SIZES, load_test_set
from alignatt.evaluate.uncertainty import intervals

SHARED = Path(__file__).resolve().parents[3] / "shared" / "data"


@pytest.mark.parametrize("direction", ["en-de", "en-it", "en-zh", "cs-en"])
def test_the_split_starts_after_the_heads_calibration_pairs(direction):
    heads = json.loads((resources.files("alignatt") / "data" / "heads" / f"gemma-3-270m_{direction}.json").read_text())
    n = CALIBRATION_PAIRS[direction]
    assert heads["used_pairs"] == heads["calibration_run"]["pairs_offered"] == n  # the first n, none skipped
    ts = load_test_set(direction)
    assert (ts.source_lang, ts.target_lang) == tuple(direction.split("-"))
    assert len(ts.pairs) == SET_SIZES[direction] - n and ts.description.startswith("packaged")
    lines = [json.loads(x) for x in (resources.files("alignatt") / "data" / "eval" / f"{direction}.test.jsonl")
             .read_text(encoding="utf-8").splitlines()]
    assert [x["position"] for x in lines] == list(range(n, SET_SIZES[direction]))
    source = SHARED / f"word_alignments_{direction}.json"
    if source.exists():  # the reference folder of this checkout: the split is its tail, in file order
        data = json.loads(source.read_text(encoding="utf-8"))
        assert len(data) == SET_SIZES[direction]
        assert [p.reference for p in ts.pairs] == [" ".join(d["target_text"].split()) for d in data[n:]]
        calibration = {f"{direction}:{d['pair_id']}" for d in data[:n]}
        assert not calibration & {p.id for p in ts.pairs}


def test_zh_is_scored_in_characters():
    from alignatt.evaluate.emissions import units

    ts = load_test_set("en-zh")
    ref = ts.pairs[0].reference
    assert units(ref, "zh") == [c for c in ref if not c.isspace()]
    # BLEU tokenize zh: a one-character change costs far less than a whole-word 13a token
    got = intervals([ref[:-2] + "好。"], [ref], "zh")
    assert 0 < got["bleu"]["score"] < 100
