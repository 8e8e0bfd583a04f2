"""Stopping a draft once the policy's answer is known (core/settle.py): the first held token and
the buffer after it fix the length; the emitted part of `decide` is the whole draft's at that
frontier; a cut is idempotent; finals and drafts without a held token are never cut."""

from dataclasses import replace

import pytest

from alignatt.core.draft import DraftRequest, SettleRule
from alignatt.core.policy import POLICY_PRESETS, decide
from alignatt.core.settle import SETTLED, cut, first_held, passes_end, rule_for, settled_length
from tests.support.drafts import make_draft

SOURCE = "one two three four five six".split()
PIECES = [" eins", " zwei", " drei", "x", " vier", " fünf", " sechs", " sieben"]


def draft(aligned, committed=4, buffer=2, border=1, stop="max_new_tokens"):
    d = make_draft(SOURCE, PIECES[: len(aligned)], aligned, committed_words=committed, stop_reason=stop)
    rule = rule_for(POLICY_PRESETS["balanced"].model_copy(update={"border_words": border}), buffer)
    return replace(d, request=replace(d.request, settle=rule))


def test_the_answer_needs_the_first_held_token_and_the_buffer_after_it():
    d = draft([0, 1, 3, 3, 4, 5, 5, 5])  # word 3 is the border of 4 committed words: token 2 is held
    assert first_held(d) == 2
    assert settled_length(d) == 2 + 1 + 2
    short = cut(d)
    assert [t.piece for t in short.tokens] == PIECES[:5] and short.stop_reason == SETTLED
    assert cut(short) is short  # idempotent


def test_a_draft_is_not_settled_before_its_buffer_is_drafted_or_without_a_held_token():
    assert settled_length(draft([0, 1, 3, 3])) is None  # held at 2, the buffer needs 5 tokens
    assert settled_length(draft([0, 1, 2, 0, 1])) is None  # every token passed the scan
    assert cut(draft([0, 1, 2, 0, 1])).stop_reason == "max_new_tokens"


def test_finals_and_requests_without_a_rule_are_never_settled():
    d = draft([0, 3, 3, 3, 3, 3])
    assert settled_length(replace(d, request=replace(d.request, settle=None))) is None
    with pytest.raises(ValueError, match="final"):
        DraftRequest(source_words=SOURCE, committed_words=6, final=True, settle=SettleRule(1, 0.5, 2))
    assert rule_for(POLICY_PRESETS["balanced"], None) is None


@pytest.mark.parametrize("preset", sorted(POLICY_PRESETS))
@pytest.mark.parametrize("buffer", [0, 1, 3])
def test_the_emitted_part_of_a_settled_draft_is_the_whole_drafts(preset, buffer):
    policy = POLICY_PRESETS[preset]
    alignments = [[0, 1, 3, 3, 4, 5, 5, 5], [0, 0, 1, 2, 2, 3, 4, 5], [4, 0, 1, 2, 3, 5, 5, 1],
                  [0, 1, 2, 2, 1, 0, 1, 5]]
    for aligned in alignments:
        for committed in range(1, 7):
            d = draft(aligned, committed, buffer, border=policy.border_words)
            whole, short = decide(d, committed, policy), decide(cut(d), committed, policy)
            assert (short.emit_count, short.emitted_text, short.stop_reason) == \
                   (whole.emit_count, whole.emitted_text, whole.stop_reason), (aligned, committed)
            assert whole.held_text.startswith(short.held_text)


def test_a_settled_draft_re_judged_past_its_end_must_be_drafted_again():
    d = cut(draft([0, 1, 3, 3, 4, 5, 5, 5]))  # 5 tokens: aligned 0, 1, 3, 3, 4
    assert not passes_end(d, 4)  # token 2 still looks at the border
    assert passes_end(d, 6)  # every kept token passes; the whole draft would go on
    assert not passes_end(draft([0, 1, 2, 0, 1]), 6)  # not settled: its own end is the draft's end


def test_a_draft_that_ended_by_itself_at_its_settled_length_keeps_its_stop_reason():
    d = draft([0, 1, 3, 3, 4], stop="eos")  # held at 2, two tokens of buffer: all 5 are needed
    assert settled_length(d) == 5 and cut(d) is d and cut(d).stop_reason == "eos"


def test_the_array_scan_a_seam_runs_stops_where_the_drafts_scan_stops():
    """`held_index` on the arrays a seam fetched (no Draft) agrees with the session's scan, context
    leaks included: a token whose context block outweighs the source is held like `decide` holds it."""
    import numpy as np

    from alignatt.core.draft import head_means
    from alignatt.core.settle import held_index

    d = draft([0, 1, 0, 2, 1, 0, 3, 4], committed=6)
    tokens = [replace(t, context_mass=np.full(2, 0.9 if i == 4 else 0.01, np.float32))
              for i, t in enumerate(d.tokens)]
    d = replace(d, tokens=tokens)
    rows, other, generated = d.stacked()
    context = np.stack([t.context_mass for t in d.tokens])
    for committed in range(1, 7):
        for border in (0, 1, 2):
            rule = SettleRule(border, 0.5, 1)
            held = held_index(rows, other, generated, head_means(list(context)), d.source_word_of_token,
                              committed, rule)
            assert held == first_held(replace(d, request=replace(d.request, committed_words=committed)), rule)
    assert first_held(d, SettleRule(0, 0.5, 1)) == 4  # the context leak
    assert decide(d, 6, POLICY_PRESETS["low_latency"]).decisions[4].reason == "context_leak"


def test_the_batched_scan_stops_every_draft_where_its_own_scan_stops():
    """`held_indices` over a padded batch (ragged drafts and sources, context leaks, no source at
    all) gives each draft `held_index`'s answer: what the engine's check computes for all the
    requests due in a step at once."""
    import numpy as np

    from alignatt.core.draft import head_means
    from alignatt.core.settle import held_index, held_indices

    rng = np.random.default_rng(7)
    H, seen = 4, set()
    for _ in range(60):
        R = int(rng.integers(1, 9))
        lengths, sources = rng.integers(0, 9, R), rng.integers(0, 12, R)
        T, S = max(int(lengths.max()), 1), max(int(sources.max()), 1)
        rows, masses = np.zeros((R, T, H, S), np.float32), rng.random((R, T, H, 3)).astype(np.float32) * 0.3
        words, expected = np.full((R, S), -1), []
        committed, border = rng.integers(0, 7, R), rng.integers(0, 3, R)
        share = rng.choice([0.3, 0.6, 1.0], R)
        for r in range(R):
            n, s = int(lengths[r]), int(sources[r])
            w = np.sort(rng.integers(0, 6, s))
            words[r, :s] = w
            rows[r, :n, :, :s] = rng.dirichlet(np.full(s, 0.3), (n, H)) * 0.7 if s else 0
            if s == 0:
                expected.append(None)  # no source to look at: no verdict (it drafts to its end)
                continue
            m = masses[r, :n]
            held = held_index(rows[r, :n, :, :s], m[..., 0], m[..., 1], head_means(list(m[..., 2])), list(w),
                              int(committed[r]), SettleRule(int(border[r]), float(share[r]), 1))
            expected.append(held)
        got = held_indices(rows, masses[..., 0], masses[..., 1], masses[..., 2], lengths, words, committed,
                           border, share)
        assert got == expected
        seen.update("none" if h is None else "first" if h == 0 else "later" for h in expected)
    assert seen == {"none", "first", "later"}  # every kind of answer was compared
