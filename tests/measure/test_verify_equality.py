"""Verified re-drafts against drafting from scratch on the bench prompts (`measure/verify_equality.py`):
with exact arithmetic nothing differs; a verifying forward that flips a token is counted."""

from dataclasses import replace

from alignatt.capture.hf.qk_fast import HFQKFastSeam
from alignatt.checks.seam_parity import PARITY_TOLERANCE
from alignatt.core.draft import Head
from alignatt.measure.verify_equality import verified_against_scratch
from tests.fakes.verify_fakes import VerifyingFakeSeam
from tests.support.hf_cases import some_requests


def test_on_tiny_gemma4_in_fp32_a_verified_draft_is_the_from_scratch_draft(tiny_gemma4):
    seam = HFQKFastSeam(tiny_gemma4, [Head(4, 0), Head(1, 1)], decode="dynamic")
    got = verified_against_scratch(seam, [r for _, r in some_requests(8)], decision_heads=2)
    assert got["prompts"] == 4 and got["tokens_differ"] == got["texts_differ"] == got["decisions_differ"] == 0
    assert got["proposed"] == got["accepted"] == 4 * 7  # the whole proposal kept (the forward adds the 8th)
    assert got["row_max_abs_diff"] <= PARITY_TOLERANCE


class FlippingSeam(VerifyingFakeSeam):
    """A verifying forward whose token `at` is another one: a bf16 near-tie that flipped."""

    def __init__(self, at: int) -> None:
        super().__init__()
        self.at = at

    def draft(self, request):
        draft = super().draft(request)
        if request.proposal is None or not draft.tokens:
            return draft
        tokens = list(draft.tokens)
        t = tokens[self.at]
        tokens[self.at] = replace(t, token_id=t.token_id + 1, piece=t.piece.upper())
        return replace(draft, tokens=tokens)


def test_a_flipped_token_is_counted_and_what_the_client_sees_only_where_it_shows():
    requests = [r for _, r in some_requests(6)]
    assert verified_against_scratch(VerifyingFakeSeam(), requests)["tokens_differ"] == 0
    last = verified_against_scratch(FlippingSeam(-1), requests)  # the held last token: the emitted text stays
    assert last["prompts"] == len(requests) and last["tokens_differ"] == len(requests)
    assert last["texts_differ"] == last["decisions_differ"] == 0 and last["row_max_abs_diff"] == 0.0
    first = verified_against_scratch(FlippingSeam(0), requests)  # the first, emitted token: the text differs
    assert first["tokens_differ"] == first["texts_differ"] == len(requests)
