"""`VllmCaptureSeam.step` on CPU, around a scripted stand-in of vLLM's engine core and the stand-in
caches of tests/capture/test_vllm_fetch.py: a request that finishes while others still run has its rows
queued at once and its draft delivered at the next step; the last ones are delivered at once; a
request aborted after it finished is dropped; every delivered draft has its own rows."""

from types import SimpleNamespace

import numpy as np

from alignatt.capture.vllm.fetch import DraftState
from alignatt.capture.vllm.seam import STEP_PHASES, VllmCaptureSeam, draft_sampling
from alignatt.capture.vllm.settling import Settler
from alignatt.core.draft import DraftRequest
from alignatt.core.prompt import PrefixCacheCounts, PromptLayout
from tests.capture.test_vllm_fetch import HEADS, StandInEngine

# (request id, block ids per group, prompt length, drafted tokens, source positions, prefix start)
REQUESTS = {
    "a": (([3, 0], [5, 1]), 14, 5, [3, 4, 5, 7, 9, 10], 12),
    "b": (([1, 6], [2, 7, 9]), 20, 9, [2, 3, 4, 5, 6, 8, 11, 12, 13], 17),
    "c": (([4], [0, 3]), 9, 1, [1, 2, 3], 8),
}


class ScriptedCore:
    """vLLM's engine core as the seam sees it: each `step` returns the next scripted outputs."""

    def __init__(self, script, cached=None):
        self.script = list(script)
        self.aborted = []
        self.cached = cached or {}  # prompt tokens vLLM's prefix cache served, by request

    def step(self):
        outputs = self.script.pop(0) if self.script else []
        return [SimpleNamespace(request_id=rid, finished=True, num_cached_tokens=self.cached.get(rid, 0),
                                outputs=[SimpleNamespace(token_ids=list(range(7, 7 + REQUESTS[rid][2])),
                                                         finish_reason="length")])
                for rid in outputs]

    def has_unfinished_requests(self):
        return bool(self.script)

    def abort_request(self, ids):
        self.aborted += ids


class Tokens:
    def decode(self, ids):
        return "".join(f"<{i}>" for i in ids)


def scripted_seam(script, cached=None):
    engine = StandInEngine()
    items = {rid: engine.add(rid, *args) for rid, args in REQUESTS.items()}
    seam = VllmCaptureSeam.__new__(VllmCaptureSeam)  # everything but the vLLM engine
    seam.engine = SimpleNamespace(core=ScriptedCore(script, cached), hooks=SimpleNamespace(block_ids=engine.block_ids))
    seam.fetcher, seam.plans, seam.heads, seam.tokenizer = engine.fetcher, engine.plans, HEADS, Tokens()
    seam.config = SimpleNamespace(capture=True)
    seam.fixed_length, seam.reconstruct, seam.keep_raw = True, "batched", False
    seam.stop_ids, seam._newline_ids = set(), set()
    seam.raw, seam.last_raw_id = {}, None
    seam._states, seam._pending, seam._aborted, seam._warned = {}, [], set(), set()
    seam.prefix_cache = PrefixCacheCounts()
    seam.step_phases_s = dict.fromkeys(STEP_PHASES, 0.0)
    seam.step_token_counts = {"prefill": 0, "decode": 0}
    seam.settler = Settler(engine.fetcher, 3, seam.step_phases_s)
    for rid, (_, n_prompt, n, source, prefix_start) in REQUESTS.items():
        prompt = PromptLayout("", list(range(n_prompt)), source, [0] * len(source), prefix_start, "chat", False)
        request = DraftRequest(source_words=["w"], committed_words=1, max_new_tokens=n)
        seam._states[rid] = DraftState(rid, rid, request, prompt, 0.0)
    return seam, items


def reference_rows(rid):
    engine = StandInEngine()
    item = engine.add(rid, *REQUESTS[rid])
    return engine.fetcher.fetch_one(item)[0].rows


def test_every_step_is_timed_in_its_parts():
    """`step_phases_s` sums each part of the step's wall (the load benchmark reports it per step):
    the parts add up to no more than the steps took, and the parts that did work are not zero."""
    import time

    seam, _ = scripted_seam([["a"], ["b"], ["c"]])
    started = time.perf_counter()
    while seam.has_unfinished():
        seam.step()
    took = time.perf_counter() - started
    phases = seam.step_phases_s
    assert set(phases) == set(STEP_PHASES) and 0 < sum(phases.values()) <= took
    assert phases["finish"] > 0 and phases["drafts"] > 0  # fetches queued, drafts built
    # each request's whole draft came in its first output: its uncached prompt counts as prefill
    assert seam.step_token_counts == {"prefill": sum(r[1] for r in REQUESTS.values()), "decode": 0}


def test_drafts_finishing_while_others_run_arrive_one_step_later_and_the_last_at_once():
    seam, _ = scripted_seam([["a"], ["b"], ["c"]])
    assert seam.step() == []  # a finished; b and c still run: its rows are on their way
    assert seam.has_unfinished()
    (handle, draft), = seam.step()  # b finished: a is delivered, b waits
    assert handle == "a"
    seam.abort("b")  # superseded after it finished: dropped, not delivered
    (handle, last), = seam.step()  # c was the last running request: delivered at once
    assert handle == "c" and not seam.has_unfinished()
    assert seam.engine.core.aborted == []  # b had left the engine already
    for rid, got in (("a", draft), ("c", last)):
        rows = np.stack([t.rows for t in got.tokens])
        np.testing.assert_allclose(rows, reference_rows(rid), atol=1e-6)
        assert got.timings.capture_ms > 0 and got.timings.reconstruct_ms > 0
    assert not seam.engine.hooks.block_ids  # every finished request's block ids consumed


def test_requests_finishing_in_one_step_are_all_delivered_with_their_own_rows():
    seam, _ = scripted_seam([[], ["a", "c"], ["b"]])
    done = {}
    while seam.has_unfinished():
        done.update(seam.step())
    assert set(done) == {"a", "b", "c"}
    for rid, got in done.items():
        np.testing.assert_allclose(np.stack([t.rows for t in got.tokens]), reference_rows(rid), atol=1e-6)


def test_a_drafts_sampling_fields_are_its_own_and_spare_vllms_deep_copy():
    stops = {9, 2, 5}
    free, again = draft_sampling(16, False, stops), draft_sampling(16, False, stops)
    assert free["skip_clone"] is True  # vLLM's input processor copies the params shallowly
    assert free["stop_token_ids"] == [2, 5, 9] and free["stop_token_ids"] is not again["stop_token_ids"]
    assert (free["min_tokens"], free["ignore_eos"], free["temperature"], free["detokenize"]) == (0, False, 0.0, False)
    fixed = draft_sampling(16, True, stops)  # fixed-length drafts (latency runs): no stops, all 16 tokens
    assert (fixed["stop_token_ids"], fixed["min_tokens"], fixed["max_tokens"], fixed["ignore_eos"]) == (None, 16, 16, True)


def test_the_prompt_tokens_the_prefix_cache_did_not_serve_are_counted_by_where_they_sit():
    """a: 8 of 14 served (source 3..10, prefix from 12); b: 16 of 20 (source 2..13, prefix from 17); c: none."""
    seam, _ = scripted_seam([["a", "b", "c"]], cached={"a": 8, "b": 16})
    seam.step()
    counts = seam.prefix_cache.describe()
    assert (counts["prompt_tokens"], counts["cached_prompt_tokens"], counts["prompt_drafts"]) == (43, 24, 3)
    assert counts["uncached_prompt_tokens"] == {"before the source": 1, "source": 3 + 3, "after the source": 1 + 1 + 4,
                                           "target prefix": 2 + 3 + 1}
    assert sum(counts["uncached_prompt_tokens"].values()) == counts["prompt_tokens"] - counts["cached_prompt_tokens"]
