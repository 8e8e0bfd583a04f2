"""Verified re-drafts in vLLM: the session's previous draft as the speculative proposer.

vLLM's own speculative decoding does the work: with `speculative_config={"method": "ngram", ...}`
the runner schedules each request's draft tokens with it, one forward scores them all, and the
rejection sampler (greedy at temperature 0: a draft token is kept while it equals the target
argmax, then the argmax is taken) decides what is kept. Only the *proposer* is ours: the runner's
ngram drafter is asked, per request, for the tokens of the proposal the request was submitted with
that continue what it has drafted so far (nothing once it diverged). See docs/batching.md,
"Verified re-drafts", for why and how the captured rows stay the model's own.

The first step of a request is its prefill (vLLM proposes after a step and verifies in the next),
so a wholly accepted proposal costs two forwards instead of `max_new_tokens`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

from alignatt.core.draft import Acceptance, agreeing_prefix


@dataclass
class Proposed:
    n_prompt: int
    token_ids: tuple[int, ...]


@dataclass
class ProposalBook:
    """Per vLLM request id: the proposal to verify. Read by the runner's drafter after each step."""

    num_speculative_tokens: int
    by_request: dict[str, Proposed] = field(default_factory=dict)
    proposed_tokens: int = 0  # tokens handed to the rejection sampler, over the engine's life

    def add(self, request_id: str, n_prompt: int, token_ids: Sequence[int]) -> None:
        if token_ids:
            self.by_request[request_id] = Proposed(n_prompt, tuple(token_ids))

    def drop(self, request_id: str) -> None:
        self.by_request.pop(request_id, None)

    def next_tokens(self, request_id: str, drafted: Sequence[int]) -> list[int]:
        """The proposal's tokens after `drafted`, while `drafted` agrees with it; else none."""
        p = self.by_request.get(request_id)
        if p is None or len(drafted) >= len(p.token_ids) or list(p.token_ids[: len(drafted)]) != list(drafted):
            return []
        out = list(p.token_ids[len(drafted): len(drafted) + self.num_speculative_tokens])
        self.proposed_tokens += len(out)
        return out

    def propose_for_batch(self, runner: Any) -> list[list[int]]:
        """One list per request of the runner's input batch, in its order (what the drafter returns)."""
        batch = runner.input_batch
        out = []
        for i, req_id in enumerate(batch.req_ids):
            p = self.by_request.get(req_id)
            if p is None:
                out.append([])
                continue
            n = int(batch.num_tokens_no_spec[i])  # prompt + accepted output, no draft tokens
            out.append(self.next_tokens(req_id, batch.token_ids_cpu[i, p.n_prompt:n].tolist()))
        return out


def speculative_config(num_speculative_tokens: int) -> dict:
    """The LLM(...) argument that turns vLLM's spec decode on with a drafter we replace."""
    # The ngram lookup sizes are required by its config and unused: `install` replaces its propose.
    return {"method": "ngram", "num_speculative_tokens": num_speculative_tokens,
            "prompt_lookup_min": 1, "prompt_lookup_max": 1}


def install(runner: Any, book: ProposalBook) -> None:
    """Route the runner's ngram drafting to `book` (this runner only). Raises naming what is absent."""
    from vllm.v1.spec_decode.ngram_proposer import NgramProposer

    drafter = getattr(runner, "drafter", None)
    if not isinstance(drafter, NgramProposer):
        raise RuntimeError(f"alignatt verify: the runner's drafter is {type(drafter).__name__}, not NgramProposer")
    batch = getattr(runner, "input_batch", None)
    for name in ("req_ids", "num_tokens_no_spec", "token_ids_cpu"):
        if not hasattr(batch, name):
            raise RuntimeError(f"alignatt verify: the runner's input batch has no {name}")

    def propose(*args: Any, **kwargs: Any) -> list[list[int]]:
        return book.propose_for_batch(runner)

    # The runner reaches the drafter either through its own helper or directly; cover both.
    if callable(getattr(runner, "propose_ngram_draft_token_ids", None)):
        runner.propose_ngram_draft_token_ids = propose
    drafter.propose = propose


def acceptance_of(tokens: Sequence[int], proposal: Sequence[int], steps_with_tokens: Sequence[int],
                  verify_ms: float, extend_ms: float) -> Acceptance:
    """A finished request's figures: `steps_with_tokens` holds the new-token count of each of its steps."""
    proposal = list(proposal)
    return Acceptance(
        proposed=len(proposal), accepted=agreeing_prefix(tokens, proposal),
        decoded=sum(1 for n in steps_with_tokens[1:] if n == 1), forward_steps=len(steps_with_tokens),
        verify_ms=verify_ms, extend_ms=extend_ms,
    )
