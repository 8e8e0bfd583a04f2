"""Head calibration: the argmax-hit scorer, word/token mapping, pairs, and runs on real models."""

import json

import numpy as np
import pytest

from alignatt.heads.calibrate import (
    AlignedPair,
    argmax_hits,
    load_pairs,
    rank_heads,
    token_words,
    word_char_spans,
)
from alignatt.core.errors import AlignattError
from alignatt.heads.sets import HeadSet, load_head_set

PAIR = {
    "pair_id": 1,
    "direction": "en-de",
    "source_text": "So what is our solution?",
    "target_text": "Was ist also unsere Lösung?",
    "source_words": ["So", "what", "is", "our", "solution", "?"],
    "target_words": ["Was", "ist", "also", "unsere", "Lösung", "?"],
    "alignments": [
        {"source_span": [4, 5], "target_span": [4, 5]},
        {"source_span": [0, 1], "target_span": [2, 3]},
        {"source_span": [1, 3], "target_span": [0, 2]},  # a 2x2 block
    ],
}


# ---- the scorer on attention whose right answer is known ----


def test_argmax_hits_counts_exactly_the_heads_that_point_at_the_aligned_word():
    # 3 source words over 5 source tokens: word 0 = tokens 0-1, word 1 = 2, word 2 = 3-4
    word_of_token = [0, 0, 1, 2, 2]
    aligned = [{0}, {2}, {1, 2}]  # three target tokens
    L, H, T, S = 2, 3, 3, 5
    rows = np.full((L, H, T, S), 0.01, dtype=np.float32)
    # argmax token per (layer, head, target); hit iff that token's word is aligned
    argmax = np.array(
        [
            [[1, 4, 2], [2, 0, 3], [0, 3, 0]],  # layer 0: heads 0, 1, 2; rows = target tokens
            [[4, 1, 1], [3, 2, 4], [1, 4, 4]],
        ]
    )
    for l in range(L):
        for h in range(H):
            for t in range(T):
                rows[l, h, t, argmax[l, h, t]] = 0.9
    hits = argmax_hits(rows, word_of_token, aligned)
    # layer 0 head 0: t0->tok1 (w0 ok), t1->tok4 (w2 ok), t2->tok2 (w1 ok) = 3
    # layer 0 head 1: t0->tok2 (w1 no), t1->tok0 (w0 no), t2->tok3 (w2 ok) = 1
    # layer 0 head 2: t0->tok0 (ok), t1->tok3 (ok), t2->tok0 (w0 no) = 2
    # layer 1 head 0: t0->tok4 (no), t1->tok1 (no), t2->tok1 (no) = 0
    # layer 1 head 1: t0->tok3 (no), t1->tok2 (no), t2->tok4 (ok) = 1
    # layer 1 head 2: t0->tok1 (ok), t1->tok4 (ok), t2->tok4 (ok) = 3
    assert hits.tolist() == [[3, 1, 2], [0, 1, 3]]
    assert hits.dtype == np.int64


def test_argmax_hits_matches_a_direct_count_on_random_attention():
    rng = np.random.default_rng(0)
    for _ in range(20):
        L, H, T, S = rng.integers(1, 5, size=4) + np.array([0, 0, 0, 2])
        n_words = int(rng.integers(1, S + 1))
        word_of_token = np.sort(rng.integers(0, n_words, size=S))
        aligned = [set(rng.choice(n_words, size=int(rng.integers(1, n_words + 1)), replace=False).tolist()) for _ in range(T)]
        rows = rng.random((L, H, T, S)).astype(np.float32)
        direct = np.zeros((L, H), dtype=int)
        for l in range(L):
            for h in range(H):
                for t in range(T):
                    direct[l, h] += int(word_of_token[int(np.argmax(rows[l, h, t]))] in aligned[t])
        assert argmax_hits(rows, word_of_token, aligned).tolist() == direct.tolist()


def test_argmax_hits_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match="shape"):
        argmax_hits(np.zeros((2, 3, 4)), [0, 1, 2, 3], [{0}] * 3)
    with pytest.raises(ValueError, match="disagree"):
        argmax_hits(np.zeros((1, 1, 2, 3)), [0, 1], [{0}, {1}])


def test_rank_heads_lists_every_head_best_first_with_scores_in_unit_interval():
    hits = np.array([[3, 1, 2], [0, 1, 4]])
    ranked = rank_heads(hits, scored_tokens=4, pairs_used=2)
    assert [(r.layer, r.head) for r in ranked] == [(1, 2), (0, 0), (0, 2), (0, 1), (1, 1), (1, 0)]
    assert [r.score for r in ranked] == [1.0, 0.75, 0.5, 0.25, 0.25, 0.0]
    assert all(r.count == 2 for r in ranked)


# ---- mapping target tokens onto aligned words ----


def test_aligned_source_words_per_target_word():
    pair = AlignedPair.model_validate(PAIR)
    assert pair.aligned_source_words() == [{1, 2}, {1, 2}, {0}, set(), {4}, set()]


def test_word_char_spans_skip_words_missing_from_the_text():
    text = "Darüber hinaus haben wir"
    spans = word_char_spans(text, ["Darüber", "hinzu", "haben", " wir "])
    assert spans == [(0, 7), None, (15, 20), (21, 24)]
    assert [text[a:b] for a, b in (s for s in spans if s)] == ["Darüber", "haben", "wir"]


def test_token_words_use_the_first_non_space_character():
    text = "Was ist Lösung?"
    words = word_char_spans(text, ["Was", "ist", "Lösung", "?"])
    tokens = [(0, 3), (3, 7), (7, 10), (10, 14), (14, 15), (15, 15)]  # "Was"," ist"," Lö","sung","?",""
    assert token_words(tokens, text, words) == [0, 1, 2, 2, 3, None]
    assert token_words([(3, 4)], text, words) == [None]  # a bare space belongs to no word


# ---- pairs files ----


def test_bundled_pairs_load():
    pairs = load_pairs()
    assert len(pairs) == 903 and {p.direction for p in pairs} == {"en-de"}
    assert all(any(p.aligned_source_words()) for p in pairs)


def test_bad_pairs_files_are_clear_errors(tmp_path):
    missing = tmp_path / "none.json"
    with pytest.raises(AlignattError, match="cannot read pairs file"):
        load_pairs(missing)
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2")
    with pytest.raises(AlignattError, match="not valid JSON"):
        load_pairs(bad)
    bad.write_text("{}")
    with pytest.raises(AlignattError, match="non-empty JSON list"):
        load_pairs(bad)
    bad.write_text(json.dumps([{**PAIR, "source_words": []}]))
    with pytest.raises(AlignattError, match="pair 0: source_words"):
        load_pairs(bad)


def test_split_half_check_compares_even_and_odd_pairs():
    from alignatt.heads.calibrate import split_half_check

    # 4 pairs, 1 layer x 3 heads, 10 tokens each. Head 0 is good in both halves; heads 1 and 2
    # swap places between the halves.
    hits = np.array([[[9, 6, 2]], [[8, 2, 7]], [[9, 6, 2]], [[8, 2, 7]]])
    tokens = np.array([10, 10, 10, 10])
    check = split_half_check(hits, tokens, top_k=2)
    # even half: head0 .9, head1 .6 ; odd half: head0 .8, head2 .7 -> top-2 share head 0 only
    assert check.top_k == 2 and check.overlap == 1
    # full top-2: head0 (.85) and head2 (.45 vs head1 .40); deltas .1 and .5
    assert check.max_abs_score_delta == pytest.approx(0.5)
    assert split_half_check(hits[:1], tokens[:1]) is None
    assert split_half_check(hits, tokens, top_k=10).top_k == 3


# ---- real runs: tiny random Gemma-4 (fast) and the embedded Gemma-3-270M (slow) ----


@pytest.fixture(scope="module")
def tiny():
    from alignatt.models.presets import load_model

    return load_model("tiny-gemma4")


def _check_scored_tokens_lie_in_their_words(loaded, pairs):
    """Every scored token decodes to a piece of a target word aligned with its source words."""
    from alignatt.heads.calibrate import pair_inputs

    for pair in pairs:
        x = pair_inputs(loaded.tokenizer, pair)
        assert x.query_positions == sorted(x.query_positions)
        assert max(x.source_positions) < min(x.query_positions)  # targets come after the source
        aligned = pair.aligned_source_words()
        words_with = {frozenset(a): [pair.target_words[i] for i, s in enumerate(aligned) if s == a] for a in aligned}
        forced = loaded.tokenizer.decode(x.input_ids[min(x.query_positions) + 1 :])
        assert pair.target_text.strip().endswith(forced.strip())  # the forced target ends the prompt
        for q, a in zip(x.query_positions, x.aligned_words):
            piece = loaded.tokenizer.decode(x.input_ids[q + 1 : q + 2]).strip()
            if piece and "\ufffd" not in piece:  # a lone byte of a multi-byte char decodes to U+FFFD
                assert any(piece in w for w in words_with[frozenset(a)]), (piece, a)


def test_scored_tokens_map_onto_aligned_target_words_tiny(tiny):
    _check_scored_tokens_lie_in_their_words(tiny, load_pairs()[:20])


def test_calibration_on_tiny_gemma4_ranks_every_head(tiny):
    from alignatt.heads.calibrate import calibrate

    pairs = load_pairs()[:4]
    s = calibrate(tiny, pairs, progress=False)
    layout = tiny.layout
    assert (s.num_layers, s.num_heads) == (layout.n_layers, layout[0].n_heads)
    assert len(s.heads) == s.num_layers * s.num_heads  # KV-shared layers included
    assert {(h.layer, h.head) for h in s.heads} == {(h.layer, h.head) for h in layout.all_heads()}
    scores = [h.score for h in s.heads]
    assert scores == sorted(scores, reverse=True) and all(0.0 <= x <= 1.0 for x in scores)
    assert s.used_pairs == 4 and s.used_target_tokens > 0
    assert len(set(scores)) > 1  # random weights still give different heads different hit rates
    run = s.calibration_run
    assert run.synthetic_weights and run.pairs_offered == 4 and run.split_half.top_k == 8
    assert HeadSet.model_validate_json(s.to_json()) == s
    # the same calibration twice gives the same set (deterministic model, argmax, ranking)
    again = calibrate(tiny, pairs, progress=False)
    assert [(h.layer, h.head, h.score) for h in again.heads] == [(h.layer, h.head, h.score) for h in s.heads]


def test_calibration_scores_match_a_direct_recount_from_output_attentions(tiny):
    """Recount hits for one pair straight from the model's attentions, independently of the slicer."""
    import torch

    from alignatt.heads.calibrate import calibrate, pair_inputs

    pair = load_pairs()[2]
    s = calibrate(tiny, [pair], progress=False)
    x = pair_inputs(tiny.tokenizer, pair)
    tiny.model.set_attn_implementation("eager")
    with torch.inference_mode():
        att = tiny.model(input_ids=torch.tensor([x.input_ids]), output_attentions=True).attentions
    for h in s.heads:
        hits = 0
        for q, aligned in zip(x.query_positions, x.aligned_words):
            row = att[h.layer][0, h.head, q]
            best = max(range(len(x.source_positions)), key=lambda i: float(row[x.source_positions[i]]))
            hits += x.source_word_of_token[best] in aligned
        assert h.score == pytest.approx(hits / len(x.query_positions), abs=1e-6)


def test_calibrate_cli_writes_a_loadable_set_and_rejects_bad_input(tmp_path):
    from typer.testing import CliRunner

    from alignatt.cli import app

    out = tmp_path / "tiny.json"
    r = CliRunner().invoke(app, ["heads", "calibrate", "--model", "tiny-gemma4", "--max-pairs", "2",
                                 "--out", str(out), "--top", "3"])
    assert r.exit_code == 0, r.output
    assert "wrote" in r.output and load_head_set(out).used_pairs == 2
    shown = CliRunner().invoke(app, ["heads", "show", str(out), "--top", "2"])
    assert shown.exit_code == 0 and shown.output.count("\n") >= 5
    bad = CliRunner().invoke(app, ["heads", "calibrate", "--model", "nope", "--out", str(out)])
    assert bad.exit_code == 2 and "unknown model 'nope'" in bad.output
    bad = CliRunner().invoke(app, ["heads", "calibrate", "--model", "tiny-gemma4", "--pairs",
                                   str(tmp_path / "missing.json"), "--out", str(out)])
    assert bad.exit_code == 2 and "cannot read pairs file" in bad.output
    bad = CliRunner().invoke(app, ["heads", "show", "nope"])
    assert bad.exit_code == 2 and "no head set named" in bad.output


@pytest.mark.slow
def test_calibration_on_the_embedded_gemma3_270m():
    from alignatt.heads.calibrate import calibrate
    from alignatt.models.presets import load_model

    loaded = load_model("gemma3-270m")
    pairs = load_pairs()[:6]
    _check_scored_tokens_lie_in_their_words(loaded, pairs)
    s = calibrate(loaded, pairs, progress=False)
    assert (s.num_layers, s.num_heads, len(s.heads)) == (18, 4, 72)
    assert not s.calibration_run.synthetic_weights and s.calibration_run.pairs_skipped == 0
    # real weights: some head points at the aligned word far more often than chance would
    chance = np.mean([1 / len(p.source_words) for p in pairs])
    assert s.heads[0].score > 3 * chance
