"""vllm_capture's verified re-drafts, the parts that run without vLLM: the proposal book the
runner's drafter reads, the acceptance figures, and that verification off changes no engine argument."""

import numpy as np

from alignatt.capture.vllm.engine import ModelSpec, VllmEngineConfig
from alignatt.capture.vllm.verify import ProposalBook, acceptance_of


class FakeBatch:
    def __init__(self, rows: dict[str, list[int]]):
        self.req_ids = list(rows)
        self.num_tokens_no_spec = np.asarray([len(r) for r in rows.values()])
        self.token_ids_cpu = np.zeros((len(rows), 64), dtype=np.int64)
        for i, r in enumerate(rows.values()):
            self.token_ids_cpu[i, : len(r)] = r


class FakeRunner:
    def __init__(self, rows):
        self.input_batch = FakeBatch(rows)


def test_the_book_proposes_what_continues_the_agreeing_draft():
    book = ProposalBook(num_speculative_tokens=3)
    book.add("a", n_prompt=2, token_ids=[10, 11, 12, 13, 14])
    book.add("b", n_prompt=2, token_ids=[20, 21])
    prompt = [1, 2]
    runner = FakeRunner({"a": prompt + [10], "b": prompt + [99], "c": prompt + [5]})
    # a agrees so far: the next 3; b diverged at its first token: none; c has no proposal.
    assert book.propose_for_batch(runner) == [[11, 12, 13], [], []]
    runner = FakeRunner({"a": prompt + [10, 11, 12, 13, 14]})
    assert book.propose_for_batch(runner) == [[]]  # used up: decode on
    book.drop("a")
    assert book.next_tokens("a", [10]) == []
    assert book.proposed_tokens == 3


def test_acceptance_figures_of_a_finished_request():
    a = acceptance_of([10, 11, 12, 7, 8], [10, 11, 12, 13], steps_with_tokens=[1, 3, 1], verify_ms=5.0, extend_ms=2.0)
    assert (a.proposed, a.accepted, a.decoded, a.forward_steps) == (4, 3, 1, 3)


def test_verification_off_leaves_the_engine_arguments_as_they_were():
    spec = ModelSpec("m", "/models/m", "dummy", True, "/models/m")
    off = VllmEngineConfig(model="m", vllm_mode="fullgraph").llm_arguments(spec)
    assert "speculative_config" not in off and "async_scheduling" not in off
    on = VllmEngineConfig(model="m", vllm_mode="fullgraph", verify=True, verify_tokens=7).llm_arguments(spec)
    assert on["speculative_config"]["method"] == "ngram" and on["speculative_config"]["num_speculative_tokens"] == 7
    assert on["async_scheduling"] is False
    assert {k: v for k, v in on.items() if k not in ("speculative_config", "async_scheduling")} == off


def test_the_load_benchmark_runs_verification_off_and_on_in_one_run():
    from alignatt.measure.load_configurations import LoadConfiguration

    assert LoadConfiguration(vllm_mode="fullgraph").seam_options() == {"vllm_mode": "fullgraph"}
    assert LoadConfiguration(vllm_mode="fullgraph", verify=True).seam_options() == {"vllm_mode": "fullgraph", "verify": True}
