"""`VllmCaptureSeam` (with its `Settler`) stops a running draft once its rows hold the policy's answer (request.settle),
on CPU around a stand-in engine core that delivers one token per step: the rows so far are read
while the request runs, the request leaves the engine at the first held token plus its buffer, and
its draft is the whole draft cut there (tokens and rows, the rows its last check read). Without a held token it runs to its end."""

from types import SimpleNamespace

import numpy as np

from alignatt.capture.vllm.fetch import DraftState
from alignatt.capture.vllm.settling import Settler
from alignatt.core.draft import DraftRequest, SettleRule
from alignatt.core.settle import SETTLED
from tests.capture.test_vllm_seam_step import REQUESTS, reference_rows, scripted_seam


class OneTokenPerStep:
    """vLLM's engine core as the seam sees it: every running request gets one token per step."""

    def __init__(self, lengths):
        self.lengths = dict(lengths)
        self.done = {rid: 0 for rid in lengths}
        self.aborted, self.steps = [], 0

    def step(self):
        self.steps += 1
        out = []
        for rid in list(self.done):
            self.done[rid] += 1
            finished = self.done[rid] == self.lengths[rid]
            out.append(SimpleNamespace(request_id=rid, finished=finished, num_cached_tokens=0,
                                       outputs=[SimpleNamespace(token_ids=[6 + self.done[rid]], finish_reason="length")]))
            if finished:
                del self.done[rid]
        return out

    def has_unfinished_requests(self):
        return bool(self.done)

    def abort_request(self, ids):
        self.aborted += ids
        for rid in ids:
            self.done.pop(rid, None)


def settling_seam(rid, border_words, buffer_tokens, settle_every=3):
    seam, _ = scripted_seam([])
    seam.engine.core = OneTokenPerStep({rid: REQUESTS[rid][2]})
    seam.settler = Settler(seam.fetcher, settle_every, seam.step_phases_s)
    state = seam._states[rid]
    # Every source token of the stand-in prompt belongs to word 0 of a one-word source.
    request = DraftRequest(source_words=["w"], committed_words=1, max_new_tokens=REQUESTS[rid][2],
                           settle=SettleRule(border_words, 0.99, buffer_tokens))
    seam.fixed_length = False
    seam._states = {rid: DraftState(rid, rid, request, state.prompt, 0.0, check_at=seam.settler.first_check(request, False))}
    return seam


def run(seam):
    done = {}
    while seam.has_unfinished():
        done.update(seam.step())
    return done


def test_a_draft_leaves_the_engine_once_its_rows_hold_the_answer():
    seam = settling_seam("b", border_words=1, buffer_tokens=1)  # word 0 is the border: token 0 is held
    fetches = []
    enqueue = seam.fetcher.enqueue
    seam.fetcher.enqueue = lambda items, running=False: fetches.append(running) or enqueue(items, running)
    (draft,) = run(seam).values()
    assert fetches == [[True]]  # the check's rows cover the settled draft: no second fetch at its finish
    assert draft.stop_reason == SETTLED and [t.token_id for t in draft.tokens] == [7, 8]  # held + 1 buffer
    np.testing.assert_allclose(np.stack([t.rows for t in draft.tokens]), reference_rows("b")[:2], atol=1e-6)
    assert seam.engine.core.aborted == ["b"]
    assert seam.engine.core.steps == 3 < REQUESTS["b"][2]  # checked at 2 tokens, read and stopped at 3
    assert draft.acceptance.forward_steps == 3
    assert "b" not in seam.engine.hooks.block_ids  # read while running, dropped at its finish
    phases = seam.step_phases_s  # the check's parts are timed in the seam's step parts
    assert all(phases[name] > 0 for name in ("check_wait", "check_scan", "stop", "fetch_pack", "fetch_queue"))


def test_a_draft_without_a_held_token_runs_to_its_end():
    seam = settling_seam("b", border_words=0, buffer_tokens=1)  # word 0 is trusted: nothing is held
    (draft,) = run(seam).values()
    assert draft.stop_reason == "max_new_tokens" and len(draft.tokens) == REQUESTS["b"][2]
    np.testing.assert_allclose(np.stack([t.rows for t in draft.tokens]), reference_rows("b"), atol=1e-6)
    assert seam.engine.core.aborted == [] and seam.engine.core.steps == REQUESTS["b"][2]
    # one token a step: the first came with the prompt's prefill, every later one was decoded
    assert seam.step_token_counts == {"prefill": REQUESTS["b"][1], "decode": REQUESTS["b"][2] - 1}


def test_checks_come_every_settle_every_tokens_until_the_buffer_is_drafted():
    seam = settling_seam("b", border_words=1, buffer_tokens=5, settle_every=2)
    (draft,) = run(seam).values()
    assert len(draft.tokens) == 6 and draft.stop_reason == SETTLED  # held at 0, five tokens of buffer
    np.testing.assert_allclose(np.stack([t.rows for t in draft.tokens]), reference_rows("b")[:6], atol=1e-6)
    assert seam.engine.core.steps == 7  # first read at 6 tokens (queued after the 6th step), stopped at 7


def test_a_draft_superseded_while_its_check_is_on_the_way_is_dropped():
    seam = settling_seam("b", border_words=1, buffer_tokens=1)
    seam.step(), seam.step()  # the check of its first 2 tokens is queued
    seam.abort("b")
    assert run(seam) == {} and seam.engine.core.aborted == ["b"] and "b" not in seam.engine.hooks.block_ids


def test_a_steps_checks_and_finished_requests_share_one_fetch_and_each_gets_its_own_rows():
    """The settle checks due in a step and the requests finished in it are queued in one batched
    fetch (one pack, one launch of the kernels): here "a" finishes at its 5th token in the step
    where the running "b" is checked at its 5th; each comes back with the reference rows."""
    seam = settling_seam("b", border_words=0, buffer_tokens=1)  # word 0 trusted: "b" is checked, never held
    seam.engine.core = OneTokenPerStep({"a": REQUESTS["a"][2], "b": REQUESTS["b"][2]})
    a = DraftRequest(source_words=["w"], committed_words=1, max_new_tokens=REQUESTS["a"][2])
    seam._states["a"] = DraftState("a", "a", a, scripted_seam([])[0]._states["a"].prompt, 0.0)
    fetches = []
    enqueue = seam.fetcher.enqueue
    seam.fetcher.enqueue = lambda items, running=False: (fetches.append((
        [it.request_id for it in items], list(running))), enqueue(items, running))[1]
    done = run(seam)
    assert (["b", "a"], [True, False]) in fetches  # b's check at 5 tokens and a's finish, one fetch
    assert all(len(f[0]) == len(f[1]) for f in fetches) and len(fetches) == 4  # b checked at 2, 5, 8; its finish
    for rid in ("a", "b"):
        np.testing.assert_allclose(np.stack([t.rows for t in done[rid].tokens]), reference_rows(rid), atol=1e-6)
