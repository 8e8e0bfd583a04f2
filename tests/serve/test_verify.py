"""Verify, then extend: a re-draft verifies the session's previous draft instead of decoding it again.

The session proposes its last draft's tokens beyond the accepted prefix; the seam keeps the
agreeing prefix, takes the model's own token at the first disagreement and decodes on. Whatever is
proposed, the draft's tokens and its kept tokens' rows are the from-scratch draft's.
"""

from dataclasses import replace

import numpy as np
import pytest

from alignatt.capture.hf.eager import HFEagerSeam
from alignatt.capture.hf.qk_fast import HFQKFastSeam
from alignatt.checks.seam_parity import PARITY_TOLERANCE
from alignatt.core.draft import DraftProposal, DraftRequest, Head, accept_proposal
from alignatt.core.policy import PolicyConfig
from alignatt.serve.session import DRAFT, FINAL, Session, SessionConfig
from tests.support.hf_cases import some_requests
from tests.fakes.verify_fakes import VerifyingFakeSeam

WORDS = "the causal encoder processes each block once .".split()


def session(seam=None, border=1, **config):
    seam = seam or VerifyingFakeSeam()
    policy = PolicyConfig(border_words=border, hold_back_words=0, min_emit_words=0)
    return seam, Session(seam, SessionConfig(policy=policy, **config))


# ---- greedy acceptance ----


def test_acceptance_keeps_the_agreeing_prefix_and_the_models_token_after_it():
    never = lambda t: False  # noqa: E731
    assert accept_proposal([1, 2, 3, 4], [1, 2, 3], 16, never) == ([1, 2, 3, 4], False)  # all + the next
    assert accept_proposal([9, 2, 3, 4], [1, 2, 3], 16, never) == ([9], False)  # first rejected
    assert accept_proposal([1, 2, 7, 4], [1, 2, 3], 16, never) == ([1, 2, 7], False)  # partial
    assert accept_proposal([1, 0, 3, 4], [1, 2, 3], 16, lambda t: t == 0) == ([1], True)  # stop
    assert accept_proposal([1, 2, 3, 4], [1, 2, 3], 2, never) == ([1, 2], False)  # draft length


def test_a_proposal_must_continue_the_requests_prefix():
    with pytest.raises(ValueError, match="another target prefix"):
        DraftRequest(source_words=["a"], committed_words=1, target_prefix="x",
                     proposal=DraftProposal(token_ids=(1,), target_prefix="y"))
    r = DraftRequest(source_words=["a"], committed_words=1, max_new_tokens=3,
                     proposal=DraftProposal(token_ids=(1, 2, 3, 4), target_prefix=""))
    assert r.proposed_tokens() == [1, 2]  # the verifying forward adds the model's own next token


# ---- the session's proposal ----


def test_a_new_tail_word_verifies_the_whole_held_draft():
    seam, s = session()
    s.update(WORDS[:2], WORDS[2:5], False)  # 2 committed, 3 tail words: the tail's tokens are held
    held = s.last_draft.tokens[s._open.draft_emitted:]
    assert held
    step = s.update(WORDS[:2], WORDS[2:6], False)
    assert step.path == DRAFT
    request = seam.requests[-1]
    assert request.proposal.token_ids == tuple(t.token_id for t in held)
    assert request.proposal.target_prefix == request.target_prefix == s.committed_text
    a = s.last_draft.acceptance
    assert a.proposed == len(held) and a.accepted == len(held)
    assert [t.token_id for t in s.last_draft.tokens] == [t.token_id for t in seam.from_scratch(request).tokens]


def test_a_rewritten_first_tail_word_rejects_the_first_proposed_token():
    seam, s = session(border=0)  # every committed word's token emitted: the proposal starts at the tail
    s.update(WORDS[:2], WORDS[2:5], False)
    assert s._open.draft_emitted == 2
    s.update(WORDS[:2], ["decoder"] + WORDS[3:5], False)  # the ASR changed its mind on tail word 0
    a = s.last_draft.acceptance
    assert a.proposed > 0 and a.accepted == 0
    assert s.last_draft.tokens[0].piece.endswith("decoder")


def test_a_rewritten_middle_tail_word_accepts_part_of_the_proposal():
    seam, s = session()
    s.update(WORDS[:2], WORDS[2:6], False)
    s.update(WORDS[:2], WORDS[2:4] + ["every"] + WORDS[5:6], False)
    a = s.last_draft.acceptance
    assert 0 < a.accepted < a.proposed
    request = seam.requests[-1]
    assert [t.token_id for t in s.last_draft.tokens] == [t.token_id for t in seam.from_scratch(request).tokens]


def test_a_context_change_before_the_source_is_verified_against_the_new_prompt():
    seam, s = session(VerifyingFakeSeam(shout_when="glossary: shout"))
    s.update(WORDS[:2], WORDS[2:5], False)
    s.context_text = "glossary: shout"  # the prompt changes before the source: every target token changes
    s.update(WORDS[:2], WORDS[2:6], False)
    request = seam.requests[-1]
    assert request.proposal is not None  # the proposal is only about the target continuation
    assert s.last_draft.acceptance.accepted == 0
    assert [t.piece for t in s.last_draft.tokens] == [t.piece for t in seam.from_scratch(request).tokens]
    assert all(t.piece == t.piece.upper() for t in s.last_draft.tokens)


def test_a_failed_or_superseded_draft_leaves_the_last_applied_draft_as_the_proposal():
    failing = {"on": False}
    seam, s = session(VerifyingFakeSeam(fail_when=lambda r: failing["on"]))
    s.update(WORDS[:2], WORDS[2:5], False)
    applied = s.last_draft
    held = tuple(t.token_id for t in applied.tokens[s._open.draft_emitted:])
    failing["on"] = True  # the scheduler raises Superseded / the engine aborted: the session is untouched
    with pytest.raises(RuntimeError):
        s.update(WORDS[:2], WORDS[2:6], False)
    failing["on"] = False
    s.update(WORDS[:2], WORDS[2:7], False)
    assert seam.requests[-1].proposal.token_ids == held
    assert s.last_draft.acceptance.accepted == len(held)


def test_nothing_is_reused_after_a_final_or_in_a_new_utterance():
    seam, s = session()
    s.update(WORDS[:2], WORDS[2:5], False, utterance_id=0)
    final = s.update(WORDS, [], True, utterance_id=0)
    assert final.final and final.path in (FINAL, "final_cached")
    s.update(WORDS[:2], WORDS[2:5], False, utterance_id=1)
    assert seam.requests[-1].proposal is None
    s.update(WORDS[:2], WORDS[2:5], False, utterance_id=1)  # unchanged: no engine call
    s.update(WORDS[:3], WORDS[3:6], False, utterance_id=2)  # moved on without a final
    assert seam.requests[-1].proposal is None


def test_the_final_verifies_the_open_utterances_draft():
    seam, s = session()
    s.update(WORDS[:2], WORDS[2:5], False)
    s.update(WORDS[:7], [], True)
    assert seam.requests[-1].proposal is not None
    assert s.history[-1][1]  # the final translated the utterance


def test_the_planned_request_is_the_request_update_sends():
    from alignatt.serve.session import SourceUpdate

    seam, s = session()
    s.update(WORDS[:2], WORDS[2:5], False, utterance_id=0)
    for args in ((WORDS[:2], WORDS[2:6], False, 0), (WORDS[:3], WORDS[3:6], False, 1)):
        planned = s.plan(SourceUpdate.of(*args))
        s.update(*args)
        assert planned == seam.requests[-1]
    assert seam.requests[-2].proposal is not None and seam.requests[-1].proposal is None


def test_verification_off_proposes_nothing():
    seam, s = session(verify_drafts=False)
    s.update(WORDS[:2], WORDS[2:5], False)
    s.update(WORDS[:2], WORDS[2:6], False)
    assert all(r.proposal is None for r in seam.requests)


# ---- the transformers seams on tiny Gemma-4 (fp32): verified == from scratch ----


def _proposals(scratch_ids):
    """Whole proposal, rejection at the first token, partial acceptance (a wrong third token)."""
    wrong = lambda t: (t + 1) % 200  # noqa: E731 - any other id
    whole = list(scratch_ids)
    first = [wrong(scratch_ids[0])] + list(scratch_ids[1:])
    partial = list(scratch_ids[:2]) + [wrong(scratch_ids[2])] + list(scratch_ids[3:])
    return {"whole": (whole, None), "first": (first, 0), "partial": (partial, 2)}


SEAMS = {
    "hf_eager": lambda m, h, v=True: HFEagerSeam(m, h, verify=v),
    "hf_qk_fast": lambda m, h, v=True: HFQKFastSeam(m, h, decode="dynamic", verify=v),
    "hf_qk_fast_static": lambda m, h, v=True: HFQKFastSeam(m, h, decode="static", verify=v),
}


@pytest.mark.parametrize("seam_name", list(SEAMS))
def test_verified_drafts_equal_from_scratch_drafts(tiny_gemma4, seam_name):
    heads = tiny_gemma4.layout.all_heads()
    seam = SEAMS[seam_name](tiny_gemma4, heads)
    checked = 0
    for _, request in some_requests(max_new_tokens=8):
        scratch = seam.draft(request)
        ids = [t.token_id for t in scratch.tokens]
        if len(ids) < 4:
            continue
        assert scratch.acceptance.proposed == 0 and scratch.acceptance.forward_steps >= len(ids)
        for kind, (proposal, accepted) in _proposals(ids).items():
            verified = seam.draft(replace(request, proposal=DraftProposal(tuple(proposal), request.target_prefix)))
            assert [t.token_id for t in verified.tokens] == ids, kind
            assert verified.stop_reason == scratch.stop_reason
            a = verified.acceptance
            assert a.proposed == min(len(proposal), request.max_new_tokens - 1)
            assert a.accepted == (a.proposed if accepted is None else accepted), kind
            assert a.forward_steps < scratch.acceptance.forward_steps or kind == "first"
            for x, y in zip(verified.tokens, scratch.tokens):
                assert float(np.abs(x.rows - y.rows).max()) <= PARITY_TOLERANCE, kind
                assert float(np.abs(x.other_prompt_mass - y.other_prompt_mass).max()) <= PARITY_TOLERANCE
                assert float(np.abs(x.generated_mass - y.generated_mass).max()) <= PARITY_TOLERANCE
            checked += 1
    assert checked >= 3


def test_verification_off_ignores_the_proposal(tiny_gemma4):
    request = some_requests(max_new_tokens=6)[0][1]
    off = HFQKFastSeam(tiny_gemma4, [Head(4, 0)], decode="dynamic", verify=False)
    scratch = off.draft(request)
    ids = tuple(t.token_id for t in scratch.tokens)
    again = off.draft(replace(request, proposal=DraftProposal(ids, request.target_prefix)))
    assert again.acceptance.proposed == 0
    assert again.acceptance.forward_steps == scratch.acceptance.forward_steps
    assert all(np.array_equal(x.rows, y.rows) for x, y in zip(again.tokens, scratch.tokens))


def test_a_session_on_hf_qk_fast_shows_the_same_text_with_and_without_verification(tiny_gemma4):
    shown = {}
    for verify in (False, True):
        seam = HFQKFastSeam(tiny_gemma4, [Head(4, 0), Head(1, 1)], decode="dynamic")
        _, s = session(seam, verify_drafts=verify, max_new_tokens=6)
        words = "the quick brown fox jumps over the lazy dog .".split()
        steps = [s.update(words[:c], words[c:c + 3], False) for c in range(1, 8)]
        steps.append(s.update(words, [], True))
        shown[verify] = [(st.committed_text, st.buffer_text, st.path) for st in steps]
    assert shown[True] == shown[False]
