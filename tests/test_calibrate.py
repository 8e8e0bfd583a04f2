"""Head calibration: the argmax-hit scorer, word/token mapping, pairs, and runs on real models."""

import json

import numpy as np
import pytest

from alignatt.calibrate import (
    AlignedPair,
    argmax_hits,
    load_pairs,
    rank_heads,
    token_words,
    word_char_spans,
)
from alignatt.errors import AlignattError
from alignatt.heads import HeadSet, load_head_set

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
