"""Directions: shipped head sets, one engine per model with each direction's own heads."""

from pathlib import Path

import pytest

from alignatt.core.draft import DraftRequest
from alignatt.heads.calibrate import load_pairs, reversed_pair
from alignatt.heads.sets import default_head_set, default_head_set_name, load_head_set
from alignatt.models.presets import E4B_DIRECTIONS
from alignatt.serve.config import DirectionRoute, ServerConfig, resolve_heads
from alignatt.serve.pool import EngineRegistry
from alignatt.serve.server import ServerThread
from tests.support.server_client import Client, FakeFactory

DIRECTIONS = ("en-it", "en-zh", "en-cs", "cs-en")
# The reference data beside the checkout (../shared), as on the developers' machines and in CI.
SHARED_DIR = Path(__file__).resolve().parents[3] / "shared"
SHARED = SHARED_DIR / "heads"


@pytest.mark.parametrize("direction", E4B_DIRECTIONS)
def test_published_e4b_sets_ship_and_are_the_e4b_defaults(direction):
    name = f"gemma-4-E4B-it_{direction}"
    s = load_head_set(name)
    assert s.direction == direction and s.num_layers == 42 and s.num_heads == 8
    for model in ("gemma4-e4b", "gemma4-e4b-synthetic"):
        assert default_head_set_name(model, direction) == name
        assert default_head_set(model, direction).top_k(4) == s.top_k(4)


def test_shipped_e4b_sets_are_the_published_files_byte_for_byte():
    from importlib import resources
    from pathlib import Path

    if not Path(SHARED).is_dir():
        pytest.skip("the published head sets are not on this machine")
    for d in E4B_DIRECTIONS:
        shipped = (resources.files("alignatt") / "data" / "heads" / f"gemma-4-E4B-it_{d}.json").read_bytes()
        assert shipped == (Path(SHARED) / f"gemma-4-E4B-it_{d}.json").read_bytes()


EMBEDDED_DIRECTIONS = ("en-de", "en-zh", "en-it", "en-cs", "cs-en")  # calibrated here and shipped


@pytest.mark.parametrize("direction", EMBEDDED_DIRECTIONS)
def test_embedded_model_has_a_calibrated_set_per_direction(direction):
    s = default_head_set("gemma3-270m", direction)
    assert s.model == "gemma3-270m" and s.direction == direction and s.num_layers == 18
    run = s.calibration_run
    assert run is not None and run.pairs_offered >= 100 and run.split_half is not None
    assert run.split_half.overlap >= run.split_half.top_k // 2  # the halves agree on most of the top-k
    if direction == "en-cs":
        assert run.pairs_file.endswith("word_alignments_cs-en.json (reversed)")


def test_reversed_pair_swaps_sides_and_alignments():
    pairs_file = SHARED_DIR / "data" / "word_alignments_cs-en.json"
    if not pairs_file.exists():
        pytest.skip("no cs-en pairs beside this checkout")
    pair = load_pairs(str(pairs_file))[0]
    r = reversed_pair(pair)
    assert r.direction == "en-cs" and r.source_words == pair.target_words and r.target_words == pair.source_words
    assert r.target_text == pair.source_text and r.source_text == pair.target_text
    back = reversed_pair(r)
    assert back.aligned_source_words() == pair.aligned_source_words()


def fake_routes(tmp_path):
    from tests.support.server_client import head_set_file

    heads = {"en-it": [(0, 0), (0, 1)], "en-zh": [(0, 1), (2, 3)], "en-cs": [(4, 4), (0, 0)],
             "cs-en": [(5, 1), (5, 2)]}
    return {d: DirectionRoute(model="fake", seam="fake", heads=head_set_file(tmp_path, d, h), top_k=2)
            for d, h in heads.items()}, heads


def test_one_engine_captures_the_union_of_the_directions_heads(tmp_path):
    routes, heads = fake_routes(tmp_path)
    registry = EngineRegistry(FakeFactory(), routes=routes)
    engines = {d: registry.get(r, d) for d, r in routes.items()}
    assert len({id(e) for e in engines.values()}) == 1
    union = [(h.layer, h.head) for h in engines["en-it"].heads]
    assert sorted(union) == sorted({h for hs in heads.values() for h in hs}) and len(union) == 6
    for d, r in routes.items():
        view = engines[d].open_view(d, resolve_heads(r, d))
        draft = view.draft(DraftRequest(source_words="a b c".split(), committed_words=3,
                                        source_lang=d[:2], target_lang=d[3:]))
        assert [(h.layer, h.head) for h in draft.heads] == heads[d]
        assert all(t.rows.shape[0] == 2 for t in draft.tokens)
    registry.close()


def test_four_directions_over_the_wire_share_one_engine(tmp_path):
    routes, heads = fake_routes(tmp_path)
    factory = FakeFactory()
    with ServerThread(ServerConfig(port=0, directions=routes), factory) as srv:
        for d in DIRECTIONS:
            with Client(srv.url) as c:
                ok = c.init(source_lang=d[:2], target_lang=d[3:])
                assert ok["direction"] == d and ok["heads"] == [list(h) for h in heads[d]]
                assert c.ask(["ahoj"])["type"] == "translation"
        (seam,) = factory.seams
        assert [(r.source_lang, r.target_lang) for r in seam.requests] == [tuple(d.split("-")) for d in DIRECTIONS]
        with Client(srv.url) as c:
            err = c.init(source_lang="de", target_lang="en")
            assert err["code"] == "unsupported_direction" and err["supported"] == sorted(DIRECTIONS)


@pytest.mark.slow
def test_embedded_model_serves_four_directions_on_one_engine(gemma3_270m):
    """en-it, en-zh, en-cs and cs-en sessions on one gemma3-270m engine, each with its own heads;
    a direction's rows are the rows its heads give in a seam that captures only them."""
    import numpy as np

    from alignatt.capture.registry import make_seam
    from alignatt.serve.config import default_seam_factory
    from alignatt.serve.session import Session, SessionConfig

    routes = {d: DirectionRoute(model="gemma3-270m", seam="hf_qk_fast", top_k=4) for d in DIRECTIONS}
    registry = EngineRegistry(default_seam_factory, routes=routes)
    sources = {"en": "The house is small.".split(), "cs": "Dům je malý.".split()}
    try:
        engines = {d: registry.get(r, d) for d, r in routes.items()}
        assert len(registry.engines) == 1
        engine = registry.engines[0]
        own = {d: resolve_heads(r, d) for d, r in routes.items()}
        assert engine.heads == list(dict.fromkeys(h for d in sorted(own) for h in own[d]))
        drafts = {}
        for d in DIRECTIONS:
            s = Session(engines[d].open_view(d, own[d]), SessionConfig(max_new_tokens=4), source_lang=d[:2],
                        target_lang=d[3:])
            words = sources[d[:2]]
            step = s.update(words[:2], words[2:], False, 0)  # drafts through the engine's scheduler
            assert step.path == "draft"
            drafts[d] = s.last_draft
            assert drafts[d].heads == own[d] and drafts[d].tokens[0].rows.shape[0] == len(own[d])
            assert drafts[d].request.target_lang == d[3:]
        # en-zh's rows match a seam that captures only en-zh's heads
        alone = make_seam("hf_qk_fast", model="gemma3-270m", heads=own["en-zh"], device="cpu")
        try:
            ref = alone.draft(drafts["en-zh"].request)
        finally:
            alone.close()
        assert [t.token_id for t in ref.tokens] == [t.token_id for t in drafts["en-zh"].tokens]
        for a, b in zip(ref.tokens, drafts["en-zh"].tokens):
            np.testing.assert_allclose(a.rows, b.rows, atol=1e-5)
    finally:
        registry.close()


def test_cjk_sentence_ends_bound_a_zh_final():
    from alignatt.serve.session import bound_to_source, count_sentence_ends

    assert count_sentence_ends("我们走了。他们留下。") == 2
    assert bound_to_source("", "我们走了。他们留下。", ["We", "left."]) == "我们走了。"
    assert bound_to_source("我们", "走了。他们留下。", ["We", "left."]) == "走了。"
