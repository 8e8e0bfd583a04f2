"""Head sets: the published format, ranking, top-k, validation, bundled sets and defaults."""

import hashlib
import json
from importlib import resources

import pytest

from alignatt.core.draft import Head
from alignatt.core.errors import AlignattError
from alignatt.heads.sets import (
    HeadSet,
    RankedHead,
    bundled_head_set_names,
    default_head_set,
    default_heads,
    layer_kind_spread,
    load_head_set,
    parse_head_set,
    parse_head_spec,
    spread_head_set,
    write_head_set,
)

PUBLISHED = "gemma-4-E4B-it_en-de"
# sha256 of the published file as shipped in ../shared/heads: the package copy must never change.
PUBLISHED_SHA256 = "5642a8a2218a39d52dce8095b7af174bd4286e894ea036ed72a3dea078facf0e"


def _published_bytes() -> bytes:
    return (resources.files("alignatt") / "data" / "heads" / f"{PUBLISHED}.json").read_bytes()


def _small_set(**overrides) -> dict:
    data = {
        "model": "m",
        "direction": "en-de",
        "num_layers": 3,
        "num_heads": 2,
        "used_pairs": 5,
        "used_target_tokens": 40,
        "score_name": "paper_translation_score_argmax",
        "token_alignment_heads": [
            {"layer": 0, "head": 1, "ts": 0.2, "count": 5},
            {"layer": 2, "head": 0, "ts": 0.9, "count": 5},
            {"layer": 1, "head": 1, "ts": 0.5, "count": 5},
        ],
    }
    data.update(overrides)
    return data


def test_published_file_is_byte_identical_to_the_release():
    assert hashlib.sha256(_published_bytes()).hexdigest() == PUBLISHED_SHA256


def test_published_set_loads_with_84_ranked_heads():
    s = load_head_set(PUBLISHED)
    assert s.model == "google/gemma-4-E4B-it" and s.direction == "en-de"
    assert (s.num_layers, s.num_heads, s.used_pairs, s.used_target_tokens) == (42, 8, 903, 11209)
    assert len(s.heads) == 84
    raw = json.loads(_published_bytes())["token_alignment_heads"]
    # same heads, best first, as the file lists them
    assert [(h.layer, h.head, h.score) for h in s.heads] == [(r["layer"], r["head"], r["ts"]) for r in raw]
    scores = [h.score for h in s.heads]
    assert scores == sorted(scores, reverse=True)
    assert all(h.score >= s.paper_threshold for h in s.heads)


def test_published_top4_and_top8():
    s = load_head_set(PUBLISHED)
    raw = json.loads(_published_bytes())["token_alignment_heads"]
    expect = [Head(r["layer"], r["head"]) for r in sorted(raw, key=lambda r: -r["ts"])]
    assert s.top_k(4) == expect[:4]
    assert s.top_k(8) == expect[:8]
    assert s.top_k(4) == [Head(11, 3), Head(6, 5), Head(17, 3), Head(20, 0)]
    assert s.top_k(84) == expect


def test_round_trip_keeps_everything(tmp_path):
    s = HeadSet.model_validate(_small_set())
    path = write_head_set(tmp_path / "sub" / "set.json", s)
    back = load_head_set(path)
    assert back == s
    on_disk = json.loads(path.read_text())
    assert "token_alignment_heads" in on_disk and on_disk["token_alignment_heads"][0]["ts"] == 0.9


def test_published_set_round_trips_through_our_writer(tmp_path):
    s = load_head_set(PUBLISHED)
    back = load_head_set(write_head_set(tmp_path / "p.json", s))
    assert back == s


def test_ranking_sorts_unranked_input_best_first():
    s = HeadSet.model_validate(_small_set())
    assert s.top_k(3) == [Head(2, 0), Head(1, 1), Head(0, 1)]


def test_descriptive_python_names_are_accepted():
    s = HeadSet(
        model="m", direction="en-de", num_layers=1, num_heads=2, used_pairs=0, used_target_tokens=0,
        score_name="x", heads=[RankedHead(layer=0, head=1, score=0.3)],
    )
    assert s.top_k(1) == [Head(0, 1)]


@pytest.mark.parametrize("k, msg", [(0, ">= 1"), (-2, ">= 1"), (4, "exceeds the 3 heads")])
def test_top_k_out_of_range_is_a_clear_error(k, msg):
    s = HeadSet.model_validate(_small_set())
    with pytest.raises(AlignattError, match=msg):
        s.top_k(k)


@pytest.mark.parametrize(
    "heads, msg",
    [
        ([{"layer": 3, "head": 0, "ts": 0.1}], "layer 3 out of range 0..2"),
        ([{"layer": 0, "head": 2, "ts": 0.1}], "head 2 out of range 0..1"),
        ([{"layer": 0, "head": 0, "ts": 0.1}, {"layer": 0, "head": 0, "ts": 0.2}], "listed twice"),
        ([{"layer": 0, "head": 0, "ts": 1.5}], "less than or equal to 1"),
        ([{"layer": -1, "head": 0, "ts": 0.1}], "greater than or equal to 0"),
        ([], "at least 1"),
    ],
)
def test_invalid_sets_are_rejected_with_one_clear_line(heads, msg):
    with pytest.raises(AlignattError, match=msg) as e:
        parse_head_set(json.dumps(_small_set(token_alignment_heads=heads)), where="x.json")
    assert "\n" not in str(e.value) and str(e.value).startswith("x.json: invalid head set")


def test_bad_json_and_missing_files(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(AlignattError, match="not valid JSON"):
        load_head_set(bad)
    with pytest.raises(AlignattError, match="no head set named or at 'nope'.*bundled: "):
        load_head_set("nope")
    with pytest.raises(AlignattError, match="direction"):
        parse_head_set(json.dumps(_small_set(direction="english to german")))


def test_load_by_name_with_or_without_suffix_and_by_path():
    assert PUBLISHED in bundled_head_set_names()
    by_name = load_head_set(PUBLISHED)
    assert load_head_set(f"{PUBLISHED}.json") == by_name
    path = resources.files("alignatt") / "data" / "heads" / f"{PUBLISHED}.json"
    assert load_head_set(str(path)) == by_name


def test_every_bundled_set_is_valid():
    for name in bundled_head_set_names():
        s = load_head_set(name)
        assert s.top_k(1)
        if s.calibration_run is not None:  # our own calibrations list every head
            assert len(s.heads) == s.num_layers * s.num_heads


@pytest.mark.parametrize("model", ["gemma4-e4b", "gemma4-e4b-synthetic", "google/gemma-4-E4B-it"])
def test_e4b_models_default_to_the_published_set(model):
    assert default_heads(model, 8) == load_head_set(PUBLISHED).top_k(8)


def test_unknown_model_or_direction_has_no_default():
    with pytest.raises(AlignattError, match="no default head set for model 'other'"):
        default_heads("other", 4)
    with pytest.raises(AlignattError, match="de-en"):
        default_head_set("gemma4-e4b", direction="de-en")


def test_parse_head_spec():
    assert parse_head_spec("11:3, 6:5") == [Head(11, 3), Head(6, 5)]
    for bad in ("11", "a:b", "1:2,,3:4"):
        with pytest.raises(AlignattError, match="LAYER:HEAD"):
            parse_head_spec(bad)
    with pytest.raises(AlignattError, match="same head twice"):
        parse_head_spec("1:2,1:2")


def test_layer_kind_spread_covers_every_kind_early_and_every_head_once():
    kinds = ["sliding", "sliding", "full", "sliding", "sliding", "full",
             "sliding+shared", "full+shared"]
    order = layer_kind_spread(kinds, 4)
    assert sorted(order, key=lambda h: (h.layer, h.head)) == [
        Head(l, h) for l in range(len(kinds)) for h in range(4)
    ]
    assert {kinds[h.layer] for h in order[:4]} == set(kinds)
    # within a kind, every layer gets a head before any layer gets a second one
    for kind in set(kinds):
        layers = [h.layer for h in order if kinds[h.layer] == kind]
        n = kinds.count(kind)
        assert len(set(layers[:n])) == n
    assert layer_kind_spread(kinds, 4) == order  # deterministic


def test_spread_set_is_a_valid_uncalibrated_set():
    s = spread_head_set("tiny", ["sliding", "full", "sliding+shared", "full+shared"], 2)
    assert len(s.heads) == 8 and all(h.score == 0.0 for h in s.heads)
    assert {h.layer for h in s.top_k(4)} == {0, 1, 2, 3}
    assert load_head_set.__module__  # the set also serialises like any other
    assert HeadSet.model_validate_json(s.to_json()) == s


def test_tiny_gemma4_default_heads_cover_every_layer_kind():
    from alignatt.models.presets import load_model

    layout = load_model("tiny-gemma4").layout
    kinds = {(la.kind, la.kv_shared) for la in layout.layers}
    assert len(kinds) == 4  # the tiny config has sliding, full, and KV-shared of both
    top = default_heads("tiny-gemma4", len(kinds))
    assert {(layout[h.layer].kind, layout[h.layer].kv_shared) for h in top} == kinds
    full = default_head_set("tiny-gemma4")
    assert len(full.heads) == layout.n_layers * layout[0].n_heads
    assert layout.validate_heads(full.top_k(len(full.heads)))
    assert default_heads("tiny-gemma4", 6) == top + full.top_k(6)[4:]


def test_local_e4b_checkpoint_dir_gets_the_published_set(tmp_path):
    from alignatt.models.presets import e4b_config_path, tiny_config_path

    e4b = tmp_path / "my-e4b"
    e4b.mkdir()
    (e4b / "config.json").write_text(e4b_config_path().read_text())
    assert default_heads(str(e4b), 8) == load_head_set(PUBLISHED).top_k(8)
    other = tmp_path / "other"
    other.mkdir()
    (other / "config.json").write_text(tiny_config_path().read_text())
    with pytest.raises(AlignattError, match="no default head set for model"):
        default_heads(str(other), 4)


def test_shipped_gemma3_270m_set_is_our_own_full_calibration():
    s = load_head_set("gemma-3-270m_en-de")
    assert (s.model, s.direction, s.num_layers, s.num_heads) == ("gemma3-270m", "en-de", 18, 4)
    assert len(s.heads) == 72 and s.score_name == "paper_translation_score_argmax"
    run = s.calibration_run
    assert run is not None and not run.synthetic_weights and run.pairs_offered >= 200
    assert s.used_pairs == run.pairs_offered - run.pairs_skipped
    assert all(h.count == s.used_pairs for h in s.heads)
    assert default_heads("gemma3-270m", 4) == s.top_k(4)
