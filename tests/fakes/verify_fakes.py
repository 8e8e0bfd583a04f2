"""A fake seam that verifies proposals the way the real seams do (greedy speculative decoding).

Its "model" is `FakeSeam`'s word-by-word translation, with token ids taken from each token's text
(so the same word drafted twice is the same token, as with a real tokenizer), and `shout_when`
upper-cases the translation when the request's context says so (a prompt change before the source
that changes every target token). With a proposal, the first "forward" scores it with
`accept_proposal` against the from-scratch tokens, exactly as `HFCaptureSeam.decode` does with the
model's argmax; the draft's tokens are the from-scratch ones whatever was proposed.
"""

from __future__ import annotations

import zlib
from dataclasses import replace

from alignatt.core.draft import Acceptance, Draft, DraftRequest, accept_proposal, agreeing_prefix
from tests.fakes.mt_fakes import FakeSeam


def token_id(piece: str) -> int:
    return 10 + zlib.crc32(piece.encode()) % 1_000_000


class VerifyingFakeSeam(FakeSeam):
    name = "fake_verify"

    def __init__(self, *args, shout_when: str | None = None, verify: bool = True, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.shout_when = shout_when  # a context_text that upper-cases the translation
        self.verify = verify
        self.drafts: list[Draft] = []

    def from_scratch(self, request: DraftRequest) -> Draft:
        """The draft without verification (not counted as an engine call)."""
        calls, n = self.calls, len(self.requests)
        draft = super().draft(replace(request, proposal=None))
        self.calls, self.requests[n:] = calls, []
        shout = self.shout_when is not None and request.context_text == self.shout_when
        tokens = []
        for t in draft.tokens:
            piece = t.piece.upper() if shout else t.piece
            tokens.append(replace(t, piece=piece, token_id=token_id(piece)))
        return replace(draft, request=request, tokens=tokens)

    def draft(self, request: DraftRequest) -> Draft:
        scratch = self.from_scratch(request)
        self.calls += 1
        self.requests.append(request)
        ids = [t.token_id for t in scratch.tokens]
        proposal = request.proposed_tokens() if self.verify else []
        # The "model's argmax" at every verified position: the from-scratch token, or EOS after it.
        eos = -1
        scored = (ids + [eos] * (len(proposal) + 1))[: len(proposal) + 1]
        kept, stopped = accept_proposal(scored, proposal, request.max_new_tokens, lambda t: t == eos)
        assert kept == ids[: len(kept)], "verification must reproduce the from-scratch tokens"
        n_after = len(ids) - len(kept)  # decoded one by one after the verifying forward
        acceptance = Acceptance(
            proposed=len(proposal), accepted=agreeing_prefix(kept, proposal), decoded=n_after if not stopped else 0,
            forward_steps=1 + (0 if stopped else n_after + (scratch.stop_reason == "eos")),
        )
        draft = replace(scratch, acceptance=acceptance)
        self.drafts.append(draft)
        return draft
