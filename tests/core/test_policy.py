"""AlignAtt emit/hold decisions on drafts whose alignments are known."""

import pytest

from alignatt.core.policy import POLICY_PRESETS, PolicyConfig, decide, word_starts
from tests.support.drafts import make_draft

SRC = "the model gives itself more context".split()  # 6 words


def test_all_accessible_draft_is_emitted_whole():
    d = make_draft(SRC, ["Das", " Modell", " gibt"], [0, 1, 2])
    r = decide(d, committed_words=6, config=PolicyConfig(border_words=1))
    assert r.emit_count == 3 and r.emitted_text == "Das Modell gibt"
    assert r.held_text == "" and r.stop_reason == "eos"
    assert all(x.emit and x.reason == "emit" for x in r.decisions)


def test_first_token_on_unstable_tail_stops_and_holds_the_rest():
    # token 2 looks at word 4 (tail when 3 words are committed); token 3 looks back, still held
    d = make_draft(SRC, ["Das", " Modell", " gibt", " sich"], [0, 0, 4, 1])
    r = decide(d, committed_words=3, config=PolicyConfig(border_words=0))
    assert r.emit_count == 2 and r.emitted_text == "Das Modell"
    assert r.stop_reason == "alignatt:unstable_tail"
    assert [x.reason for x in r.decisions] == ["emit", "emit", "unstable_tail", "after_stop"]
    assert r.decisions[2].aligned_text == "more"


def test_border_margin_treats_last_committed_words_as_frontier():
    d = make_draft(SRC, ["Das", " Modell", " gibt"], [0, 1, 2])
    assert decide(d, 3, PolicyConfig(border_words=0)).emit_count == 3
    r = decide(d, 3, PolicyConfig(border_words=1))
    assert r.emit_count == 2 and r.stop_reason == "alignatt:source_frontier"
    assert decide(d, 3, PolicyConfig(border_words=2)).emit_count == 1


def test_emission_keeps_whole_words_only():
    # " Mod" + "ell" is one word; the stop falls inside it, so the whole word is held
    d = make_draft(SRC, ["Das", " Mod", "ell", " gibt"], [0, 1, 4, 1])
    r = decide(d, 3, PolicyConfig(border_words=0))
    assert r.emitted_text == "Das"
    assert [x.reason for x in r.decisions] == ["emit", "partial_word", "unstable_tail", "after_stop"]


def test_draft_cut_by_max_tokens_holds_its_possibly_unfinished_last_word():
    d = make_draft(SRC, ["Das", " Modell", " gi"], [0, 1, 2], stop_reason="max_new_tokens")
    r = decide(d, 6, PolicyConfig(border_words=0))
    assert r.emitted_text == "Das Modell"
    assert r.decisions[2].reason == "partial_word"
    # the same draft ended by EOS has a complete last word
    d.stop_reason = "eos"
    assert decide(d, 6, PolicyConfig(border_words=0)).emit_count == 3


def test_punctuation_belongs_to_the_word_before_it():
    assert word_starts(["Das", " Modell", ",", " das"]) == [0, 1, 3]
    d = make_draft(SRC, ["Das", " Modell", ",", " das"], [0, 1, 1, 5])
    r = decide(d, 6, PolicyConfig(border_words=1))
    assert r.emitted_text == "Das Modell,"


def test_hold_back_and_min_emit():
    d = make_draft(SRC, ["Das", " Modell", " gibt", " sich"], [0, 1, 2, 3])
    r = decide(d, 6, PolicyConfig(border_words=0, hold_back_words=1))
    assert r.emitted_text == "Das Modell gibt"
    assert r.decisions[3].reason == "hold_back"
    r = decide(d, 6, PolicyConfig(border_words=0, min_emit_words=5))
    assert r.emit_count == 0 and r.stop_reason == "alignatt:min_emit"


def test_final_emits_everything():
    d = make_draft(SRC, ["Das", " Modell", " gi"], [0, 5, 5], stop_reason="max_new_tokens")
    r = decide(d, 6, PolicyConfig(border_words=2), final=True)
    assert r.emit_count == 3 and r.held_text == ""


def test_nothing_committed_emits_nothing():
    d = make_draft(SRC, ["Das"], [0], committed_words=0)
    r = decide(d, 0)
    assert r.emit_count == 0 and r.stop_reason == "alignatt:unstable_tail"


def test_moving_the_frontier_releases_held_tokens_without_a_new_draft():
    d = make_draft(SRC, ["Das", " Modell", " gibt", " sich"], [0, 1, 3, 3])
    cfg = PolicyConfig(border_words=0)
    before = decide(d, 3, cfg)
    after = decide(d, 4, cfg)
    assert before.emitted_text == "Das Modell"
    assert after.emitted_text == "Das Modell gibt sich"
    assert after.emitted_text.startswith(before.emitted_text)


def test_mass_split_follows_the_frontier():
    d = make_draft(SRC, ["Das"], [0])
    m3 = decide(d, 3, PolicyConfig(border_words=0)).decisions[0].mass
    m6 = decide(d, 6, PolicyConfig(border_words=0)).decisions[0].mass
    assert m3["accessible"] < m6["accessible"]
    assert m6["inaccessible"] == pytest.approx(0.0)
    assert sum(m3.values()) == pytest.approx(sum(m6.values()))


def test_bad_frontier_and_config_are_rejected():
    d = make_draft(SRC, ["Das"], [0])
    with pytest.raises(ValueError):
        decide(d, 7)
    with pytest.raises(ValueError):
        PolicyConfig(border_words=-1)
    with pytest.raises(ValueError):
        PolicyConfig(unknown=1)


def test_presets_are_ordered_by_latency():
    lo, mid, hi = (POLICY_PRESETS[k] for k in ("low_latency", "balanced", "high_latency"))
    assert lo.border_words <= mid.border_words <= hi.border_words


def test_vectorised_mass_and_alignment_match_the_per_token_definitions():
    d = make_draft(SRC, ["Das", " Modell", " gibt", " sich"], [0, 1, 3, 5])
    for committed in (0, 3, 6):
        split = d.mass_split(committed)
        for i, tok in enumerate(d.tokens):
            per_token = tok.mass(d.source_word_of_token, committed)
            assert list(split[i]) == pytest.approx(list(per_token.values()))
    assert list(d.aligned_words()) == [0, 1, 3, 5]
    d.tokens = d.tokens[:2]  # derived from the current tokens, never a stale copy
    assert list(d.aligned_words()) == [0, 1] and d.mass_split(3).shape == (2, 4)


# ---- context guard ----

def with_context_mass(draft, per_token: list[float]):
    """Give each token head-averaged context mass (taken from its other-prompt share)."""
    import numpy as np

    for t, m in zip(draft.tokens, per_token):
        t.context_mass = np.full(len(t.other_prompt_mass), m, dtype=np.float32)
    return draft


def test_a_token_that_looks_at_the_context_is_held_and_traced():
    # make_draft puts 0.6 of each token's mass on the source; 0.3 on the rest of the prompt.
    d = with_context_mass(make_draft(SRC, ["Das", " Modell", " Kessler", " gibt"], [0, 1, 2, 2]),
                          [0.0, 0.05, 0.28, 0.0])
    d.tokens[2].rows *= 0.2  # "Kessler" takes 0.12 from the source, 0.28 from the context
    r = decide(d, 6, PolicyConfig(border_words=0))
    assert r.emitted_text == "Das Modell"
    assert r.stop_reason == "alignatt:context_leak"
    held = r.decisions[2]
    assert held.reason == "context_leak" and not held.emit
    assert held.mass["context"] == pytest.approx(0.28)
    assert held.mass["context_share"] == pytest.approx(0.28 / (0.12 + 0.28))
    assert r.decisions[1].mass["context_share"] < 0.5 and r.decisions[1].emit
    # configurable: a higher share lets it through; the final is never held for it
    assert decide(d, 6, PolicyConfig(border_words=0, max_context_share=0.9)).emitted_text == "Das Modell Kessler gibt"
    assert decide(d, 6, PolicyConfig(border_words=0), final=True).emitted_text == "Das Modell Kessler gibt"


def test_context_mass_never_aligns_a_token_to_the_source():
    d = with_context_mass(make_draft(SRC, ["Das", " Modell"], [0, 1]), [0.2, 0.2])
    plain = make_draft(SRC, ["Das", " Modell"], [0, 1])
    assert list(d.aligned_words()) == list(plain.aligned_words())
    assert [x.mass["accessible"] for x in decide(d, 6).decisions] == \
        [x.mass["accessible"] for x in decide(plain, 6).decisions]


# ---- CJK target units ----

def test_cjk_targets_use_characters_and_latin_runs_as_units():
    from alignatt.core.policy import target_units

    pieces = ["我们", "希望", "它们", "向", "左", "移动", "。"]
    assert word_starts(pieces, "zh") == [0, 1, 2, 3, 4, 5]  # the full stop belongs to 移动
    assert word_starts(pieces, "de") == [0]  # without the CJK rule: one endless word
    assert word_starts(["我是", "Sara", " Papi", "，", "来自"], "zh") == [0, 1, 2, 4]
    assert target_units("我们希望 Sara Papi，来自2026年。", "zh") == 4 + 2 + 2 + 1 + 1
    assert target_units("Das Haus, ist klein.", "de") == 4


def test_zh_draft_emits_whole_units_up_to_the_frontier():
    pieces = ["我们", "希望", "它们", "向", "左"]
    d = make_draft(SRC, pieces, [0, 1, 2, 4, 5], committed_words=6, stop_reason="max_new_tokens")
    d.request.target_lang = "zh"
    r = decide(d, 3, PolicyConfig(border_words=0))
    assert r.emitted_text == "我们希望它们" and r.words_emitted == 6
    r = decide(d, 3, PolicyConfig(border_words=0, hold_back_words=1))
    assert r.emitted_text == "我们希望"
    d.request.target_lang = "de"  # the same pieces as one whitespace word: nothing to emit
    assert decide(d, 3, PolicyConfig(border_words=0)).emit_count == 0
