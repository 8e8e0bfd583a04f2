"""Session: draft / commit fast path / final, append-only target, counted engine calls."""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from alignatt.core.policy import PolicyConfig
from alignatt.serve.session import (
    DRAFT,
    FAST_PATH,
    FINAL,
    FINAL_CACHED,
    UNCHANGED,
    Session,
    SessionConfig,
    SessionLimits,
    UpdateRejected,
    bound_to_source,
    count_sentence_ends,
)
from tests.fakes.mt_fakes import FakeSeam
from tests.support.source_ops import SourceOps

WORDS = "the causal encoder processes each block once.".split()  # 7 words


def make(border=1, hold_back=0, min_emit=0, **kw):
    seam = FakeSeam(**{k: kw.pop(k) for k in ("look_ahead", "leak", "fail_when") if k in kw})
    policy = PolicyConfig(border_words=border, hold_back_words=hold_back, min_emit_words=min_emit)
    limits = SessionLimits(**{k: kw.pop(k) for k in ("max_utterance_words", "max_tail_words") if k in kw})
    return seam, Session(seam, SessionConfig(policy=policy, limits=limits, **kw))


def test_partial_drafts_over_tail_and_emits_only_settled_source():
    seam, s = make(border=1)
    step = s.update(WORDS[:3], WORDS[3:5], is_final=False, utterance_id=0)
    assert step.path == DRAFT and step.engine_calls == 1 and seam.calls == 1
    # border 1: words 0..1 are trusted; the token on word 2 (last committed) stops emission
    assert step.committed_text == "W0:the W1:causal"
    assert step.buffer_text == " W2:encoder W3:processes W4:each"
    assert step.stop_reason == "alignatt:source_frontier"
    assert step.covered_source_units == 2
    req = seam.requests[0]
    assert req.source_words == WORDS[:5] and req.committed_words == 3 and req.target_prefix == ""


def test_commit_fast_path_releases_held_tokens_with_zero_engine_calls():
    seam, s = make(border=1)
    s.update(WORDS[:3], WORDS[3:5], False, 0)
    step = s.update(WORDS[:4], WORDS[4:5], False, 0)  # one word moved from tail to committed
    assert step.path == FAST_PATH and step.engine_calls == 0 and seam.calls == 1
    assert step.committed_delta == " W2:encoder"
    assert step.committed_text == "W0:the W1:causal W2:encoder"
    assert step.buffer_text == " W3:processes W4:each"
    assert s.fast_path_releases == 1
    # the whole known source committed: everything but the border word is released
    step = s.update(WORDS[:5], [], False, 0)
    assert step.path == FAST_PATH and seam.calls == 1
    assert step.committed_text.endswith("W3:processes") and step.buffer_text == " W4:each"


def test_repeated_update_is_answered_from_cache():
    seam, s = make()
    first = s.update(WORDS[:3], WORDS[3:4], False, 0)
    again = s.update(WORDS[:3], WORDS[3:4], False, 0)
    assert again.path == UNCHANGED and again.engine_calls == 0 and seam.calls == 1
    assert again.committed_text == first.committed_text and again.committed_delta == ""
    assert again.buffer_text == first.buffer_text


def test_new_tail_word_redrafts_continuing_the_committed_text():
    seam, s = make(border=1)
    a = s.update(WORDS[:3], WORDS[3:4], False, 0)
    b = s.update(WORDS[:3], WORDS[3:5], False, 0)
    assert b.path == DRAFT and seam.calls == 2
    assert seam.requests[1].target_prefix == a.committed_text
    assert b.committed_text.startswith(a.committed_text)


def test_final_continues_committed_text_and_stops_at_the_sentence_end():
    seam, s = make(border=1, leak="Das nächste. Auch")
    p = s.update(WORDS[:6], WORDS[6:] + ["This"], False, 0)
    f = s.update(WORDS, [], True, 0)
    assert f.final and f.path == FINAL and not f.forced_final
    assert f.committed_text.startswith(p.committed_text)
    assert f.committed_text.endswith("W6:once.")  # the leaked sentence is cut off
    assert "nächste" not in f.committed_text and f.buffer_text == ""
    assert f.covered_source_units == len(WORDS)
    assert seam.requests[-1].source_words == WORDS and seam.requests[-1].committed_words == len(WORDS)
    # the final's token budget covers only the words the committed text does not cover yet
    assert p.covered_source_units == 5 and seam.requests[-1].max_new_tokens == 3 * (7 - 5) + 8
    # a new utterance starts empty; the finished one is in the history
    assert s.utterance_id == 1 and s.committed_text == ""
    assert s.history[-1] == (" ".join(WORDS), f.committed_text)


def test_final_over_the_cached_draft_needs_no_engine_call():
    seam, s = make(border=2)
    s.update(WORDS, [], False, 0)  # draft over exactly the utterance, ends with EOS
    f = s.update(WORDS, [], True, 0)
    assert f.path == FINAL_CACHED and f.engine_calls == 0 and seam.calls == 1
    assert f.committed_text == " ".join(f"W{i}:{w}" for i, w in enumerate(WORDS))


def test_final_ignores_the_tail():
    seam, s = make()
    s.update(WORDS[:3], WORDS[3:], False, 0)
    s.update(WORDS[:4], ["next", "sentence"], True, 0)
    assert seam.requests[-1].source_words == WORDS[:4]


def test_long_utterance_is_forced_final():
    seam, s = make(max_utterance_words=5)
    step = s.update(WORDS[:6], WORDS[6:], False, 3)
    assert step.final and step.forced_final and step.utterance_id == 3
    assert seam.requests[-1].source_words == WORDS[:6]
    assert s.utterance_id == 4


def test_engine_failure_leaves_the_session_untouched():
    seam, s = make(fail_when=lambda r: len(r.source_words) == 5)
    a = s.update(WORDS[:3], WORDS[3:4], False, 0)
    with pytest.raises(RuntimeError):
        s.update(WORDS[:3], WORDS[3:5], False, 0)
    assert s.committed_text == a.committed_text and s.last_draft.request.source_words == WORDS[:4]
    b = s.update(WORDS[:4], [], False, 0)  # the cached draft still serves the fast path
    assert b.path == FAST_PATH and b.committed_text.startswith(a.committed_text)
    c = s.update(WORDS[:6], [], False, 0)
    assert c.path == DRAFT and c.committed_text.startswith(b.committed_text)


def test_accepted_target_prefix_seeds_a_reconnected_session():
    seam = FakeSeam()
    s = Session(seam, SessionConfig(policy=PolicyConfig(border_words=0)), accepted_target_prefix="W0:the W1:causal")
    step = s.update(WORDS[:4], [], False, 7)
    assert step.utterance_id == 7
    assert seam.requests[0].target_prefix == "W0:the W1:causal"
    assert step.committed_text == "W0:the W1:causal W2:encoder W3:processes"
    assert step.committed_delta == " W2:encoder W3:processes"


def test_utterance_ids_going_back_are_rejected_and_skips_open_a_new_utterance():
    seam, s = make(border=0)
    s.update(WORDS[:3], [], False, 2)
    with pytest.raises(UpdateRejected):
        s.update(WORDS[:3], [], False, 1)
    shown = s.committed_text
    step = s.update(["hello"], [], False, 4)  # utterances 2..3 abandoned without a final
    assert step.utterance_id == 4 and step.committed_text == "W0:hello"
    assert s.history[-1] == (" ".join(WORDS[:3]), shown)


def test_rewritten_committed_words_never_change_the_committed_target():
    seam, s = make(border=0)
    a = s.update(WORDS[:4], [], False, 0)
    b = s.update(["a", "causal", "decoder", "processes", "each"], [], False, 0)
    assert b.source_rewritten and s.source_rewrites == 1
    assert b.committed_text.startswith(a.committed_text)


def test_used_up_draft_cut_by_max_tokens_is_redrafted():
    seam, s = make(border=0, max_new_tokens=2)
    a = s.update(WORDS[:5], [], False, 0)
    # 2 tokens, both on settled source; the second may be an unfinished word, so it is held
    assert a.committed_text == "W0:the" and a.buffer_text == " W1:causal"
    b = s.update(WORDS[:5], [], False, 0)  # same update: the used-up draft is not reused
    assert b.path == DRAFT and seam.requests[-1].target_prefix == "W0:the"
    assert b.committed_text == "W0:the W1:causal"
    # a draft stopped by attention is not used up: the same update is answered from the cache
    seam, s = make(border=0, max_new_tokens=4)
    s.update(WORDS[:2], WORDS[2:5], False, 0)
    assert s.update(WORDS[:2], WORDS[2:5], False, 0).path == UNCHANGED


def test_sentence_bound():
    assert count_sentence_ends("Das ist z.B. gut. Und dann? Ja") == 2
    src = "This works. It is good.".split()
    assert bound_to_source("", "Das geht. Es ist gut. Nächster Satz.", src) == "Das geht. Es ist gut."
    assert bound_to_source("Das geht.", " Es ist gut.\nEnglish: next", src) == " Es ist gut."
    # an abbreviation is not a sentence end
    assert bound_to_source("", "Zum Beispiel Dr. Meier. Und mehr", ["Dr.", "Meier."]) == "Zum Beispiel Dr. Meier."
    # a source without a sentence end only loses the part after a line break
    assert bound_to_source("", "eins zwei. drei\nvier", ["one", "two"]) == "eins zwei. drei"


# ---- property: committed_text only ever grows, whatever the stream ----

OPS = st.sampled_from(["arrive", "commit", "commit_all", "final", "rewrite", "skip", "drop_tail", "fail"])


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    ops=st.lists(st.tuples(OPS, st.integers(1, 3)), min_size=1, max_size=30),
    border=st.integers(0, 2),
    hold_back=st.integers(0, 1),
    look_ahead=st.integers(0, 1),
    max_new=st.integers(1, 8),
    leak=st.booleans(),
)
def test_committed_text_only_ever_grows(ops, border, hold_back, look_ahead, max_new, leak):
    fail = {"now": False}
    seam = FakeSeam(look_ahead=look_ahead, leak="Mehr. Text" if leak else "", fail_when=lambda r: fail["now"])
    cfg = SessionConfig(
        policy=PolicyConfig(border_words=border, hold_back_words=hold_back),
        max_new_tokens=max_new,
        limits=SessionLimits(max_utterance_words=12),
    )
    s = Session(seam, cfg)
    source = SourceOps()
    shown, failed = "", 0
    for op, n in ops:
        is_final = source.apply(op, n)
        if op == "skip":
            shown = ""
        calls = seam.calls
        fail["now"] = op == "fail"
        try:
            step = s.update(source.committed, source.tail, is_final, source.uid)
        except RuntimeError:
            assert op == "fail" and s.committed_text == shown
            failed += seam.calls - calls
            continue
        assert step.engine_calls == seam.calls - calls == (0 if step.path in (FAST_PATH, UNCHANGED, FINAL_CACHED) else step.engine_calls)
        assert step.engine_calls <= 1
        assert step.committed_text.startswith(shown), (shown, step.committed_text)
        assert step.committed_text == shown + step.committed_delta
        if step.final:
            source.new_utterance(step.utterance_id + 1)
            shown = ""
        else:
            shown = step.committed_text
    assert s.engine_calls == seam.calls - failed  # every draft applied; a failed one is not


# ---- issue 10: emitted text, token bounds, one source of limits ----


def test_controls_and_bidi_overrides_never_reach_committed_text():
    from alignatt.serve.session import emitted_text

    evil = "ev\u202eil\x07\x1b[31m\u2066x\u0085y\x7f"
    seam, s = make(border=0)
    step = s.update(["plain", evil], [], is_final=False, utterance_id=0)
    final = s.update(["plain", evil, "end"], [], is_final=True, utterance_id=0)
    for text in (step.committed_text, step.buffer_text, final.committed_text, final.committed_delta):
        assert not any(c in text for c in "\u202e\x07\x1b\u2066\u0085\x7f"), repr(text)
    assert "evil[31mxy" in final.committed_text
    assert emitted_text("a\nb\tc\r") == "a\nbc"  # newline kept, other C0 controls gone
    prefixed = Session(seam, accepted_target_prefix="Das \u202dHaus")
    assert prefixed.committed_text == "Das Haus"


def test_a_draft_past_the_token_bound_is_refused_before_the_engine_runs():
    from alignatt.serve.budget import PromptBudget
    from alignatt.serve.session import BudgetExceeded

    seam = FakeSeam()
    budget = PromptBudget.for_seam(seam, SessionLimits(max_prompt_tokens=40), draft_tokens=16)
    s = Session(seam, budget=budget)
    ok = s.update(["short"] * 10, [], False, 0)  # 5 + 10 tokens
    assert ok.path == DRAFT and seam.calls == 1
    with pytest.raises(BudgetExceeded, match="max_prompt_tokens=40"):
        s.update(["short"] * 10 + ["x" * 200], [], False, 0)  # + 50 tokens
    assert seam.calls == 1 and s.engine_calls == 1 and s.committed_text == ok.committed_text
    with pytest.raises(BudgetExceeded, match="max_prompt_tokens=40"):
        s.update(["w"] * 40, [], True, 0)  # a final too


def test_session_limits_are_defined_once():
    from alignatt.serve.config import ServerLimits

    assert issubclass(ServerLimits, SessionLimits)
    assert "max_utterance_words" not in SessionConfig.model_fields  # no second copy
    limits = ServerLimits(max_utterance_words=3)
    s = Session(FakeSeam(), SessionConfig(limits=limits))
    assert s.config.limits is limits
    assert s.update(WORDS[:4], [], False, 0).forced_final


# ---- plan / apply: the session holds no engine ----


def test_plan_changes_nothing_and_apply_takes_the_draft_made_for_it():
    from alignatt.serve.session import SourceUpdate

    seam, s = make(border=1)
    first = SourceUpdate.of(WORDS[:3], WORDS[3:5], False, 0)
    request = s.plan(first)
    assert request is not None and request.source_words == WORDS[:5] and not request.final
    assert s.plan(first) == request and s.committed_text == "" and seam.calls == 0  # planning is free
    step = s.apply(first, seam.draft(request))
    assert step.path == DRAFT and step.engine_calls == 1 and s.engine_calls == 1
    # a commit-only update plans no draft and is answered from the cached one
    commit = SourceUpdate.of(WORDS[:5], [], False, 0)
    assert s.plan(commit) is None
    assert s.apply(commit).path == FAST_PATH and s.engine_calls == 1
    final = SourceUpdate.of(WORDS, [], True, 0)
    assert s.plan(final).final  # finality travels in the request


def test_apply_refuses_a_missing_a_stale_or_an_unwanted_draft():
    from alignatt.serve.session import SourceUpdate

    seam, s = make(border=1)
    update = SourceUpdate.of(WORDS[:3], WORDS[3:5], False, 0)
    request = s.plan(update)
    with pytest.raises(ValueError, match="needs the draft"):
        s.apply(update)
    stale = seam.draft(s.plan(SourceUpdate.of(WORDS[:2], WORDS[2:3], False, 0)))
    with pytest.raises(ValueError, match="needs the draft"):
        s.apply(update, stale)
    assert s.committed_text == "" and s.engine_calls == 0  # refused: nothing applied
    s.apply(update, seam.draft(request))
    unchanged = SourceUpdate.of(WORDS[:3], WORDS[3:5], False, 0)
    with pytest.raises(ValueError, match="takes no draft"):
        s.apply(unchanged, seam.draft(request))


def test_a_refused_update_raises_in_plan_before_any_draft():
    from alignatt.serve.session import SourceUpdate

    seam, s = make()
    s.update(WORDS[:2], [], False, 3)
    with pytest.raises(UpdateRejected, match="behind the open utterance 3"):
        s.plan(SourceUpdate.of(WORDS[:3], [], False, 2))
    assert seam.calls == 1
