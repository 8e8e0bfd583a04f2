"""Stand-in engines that tokenize like the real seams and record the prompt length each draft received.

Their drafts come from `FakeSeam` (word-by-word, known alignments); their token counts come from a
real tokenizer through the same `build_prompt` the real seams draft with, so the server's budget
counts them as it counts the transformers and vLLM seams (they offer no counters of their own).
`received` is what the engine was handed: a test asserts that no prompt past the bound got there.
"""

from __future__ import annotations

from alignatt.core.draft import Draft, DraftRequest, Head
from alignatt.core.prompt import build_prompt
from tests.fakes.mt_fakes import FakeSeam


class TokenizerSeam:
    """Looks like a transformers seam to the budget: `loaded.tokenizer` and its model's positions."""

    name = "tokenizer-fake"

    def __init__(self, loaded, heads: list[Head]) -> None:
        self.loaded = loaded  # a transformers model: its tokenizer and config give the budget
        self.heads = heads
        self._drafts = FakeSeam(heads=heads)
        self.received: list[int] = []  # prompt tokens of every draft the engine was handed

    def draft(self, request: DraftRequest) -> Draft:
        self.received.append(len(build_prompt(self.loaded.tokenizer, request).input_ids))
        return self._drafts.draft(request)

    def close(self) -> None:
        pass


def stand_in_vllm_class():
    """`VllmCaptureSeam` with its budget facts (engine config, tokenizer) and no engine: drafts one
    at a time from `FakeSeam`, refusing as the real `submit` does past `max_model_len`."""
    from alignatt.capture.vllm.engine import VllmEngineConfig
    from alignatt.capture.vllm.seam import VllmCaptureSeam
    from alignatt.core.prompt import PromptPreparer

    class StandInVllmSeam(VllmCaptureSeam):
        def __init__(self, tokenizer, heads: list[Head], max_model_len: int) -> None:  # noqa: D107 - no engine
            self.config = VllmEngineConfig(model="gemma4-e4b-synthetic", max_model_len=max_model_len)
            self.tokenizer = tokenizer
            self.heads = heads
            self.preparer = PromptPreparer(tokenizer, max_model_len)
            self._drafts = FakeSeam(heads=heads)
            self.received: list[int] = []
            self._queue: list[tuple[int, DraftRequest]] = []
            self._counter = 0

        def submit(self, request: DraftRequest, prompt=None) -> int:  # prompt: the inherited `prepare`'s
            n = len((prompt if prompt is not None else build_prompt(self.tokenizer, request)).input_ids)
            self.received.append(n)
            if n + request.max_new_tokens > self.config.max_model_len:
                raise AssertionError(f"the engine got a prompt of {n} tokens past max_model_len")
            self._counter += 1
            self._queue.append((self._counter, request))
            return self._counter

        def abort(self, handle) -> None:
            self._queue = [(h, r) for h, r in self._queue if h != handle]

        def has_unfinished(self) -> bool:
            return bool(self._queue)

        def step(self):
            done, self._queue = self._queue, []
            return [(h, self._drafts.draft(r)) for h, r in done]

        def close(self) -> None:
            pass

    return StandInVllmSeam
