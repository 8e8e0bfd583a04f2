"""Greedy decoding on a static KV cache, with the one-token step replayed as a CUDA graph.

Why: at batch 1 a ~4B model's transformers decode step is bound by Python and kernel launches
(tens of ms per token for ~40 layers on an H200), not by the GPU. Replaying the step as one CUDA
graph removes that overhead. A graph replays kernels only, so everything the step reads or writes
is a tensor allocated before capture: the token id, the query position, the KV cache and whatever
an attention function records (`hf_qk_fast`'s query buffer). The step body uses no host values, so
a replay does exactly what an uncaptured call of the same body does (tested on CPU without the
graph; the graph itself is checked against it on CUDA).

The cache is one full-length `StaticLayer` per cache-owning layer (KV-shared layers own none and
read their donor's), so cache index == absolute position on *every* layer, sliding ones included:
the sliding window is applied by the mask, exactly as transformers' own sdpa mask does
(`key_pos > query_pos - window`). Lengths come in buckets so that a handful of graphs serve every
prompt; each bucket's graph is captured once, on its first draft.

Verify, then extend (`verify_then_greedy`): the prefill runs over the prompt and the proposal
together and scores the last `len(proposal) + 1` positions; `rewind` then sets every layer's
write position and the step's query position back to the kept tokens, so the captured step goes
on from there. Rejected positions' keys stay in the cache past the write position, masked
(key position > query position) until a later step overwrites them.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from alignatt.core.draft import Acceptance, accept_proposal, agreeing_prefix
from alignatt.core.errors import AlignattError

BUCKET = 256  # cache lengths are multiples of this: few graphs, little wasted attention


def bucket_length(n_positions: int) -> int:
    return -(-n_positions // BUCKET) * BUCKET


class StaticDecoder:
    """Prefill + one-token greedy steps of a transformers causal LM on a static cache.

    `pos` holds the absolute position of the step's (last) query while its forward runs, so an
    attention function can address what it records by it without a host value.
    """

    def __init__(self, model: Any, max_len: int, device: torch.device, use_graph: bool):
        text = model.config.get_text_config()
        from transformers.cache_utils import Cache, StaticLayer

        self.decoder = model.get_decoder()
        self.lm_head = model.get_output_embeddings()
        self.softcap = getattr(text, "final_logit_softcapping", None)
        self.window = getattr(text, "sliding_window", None)
        n_cache = text.num_hidden_layers - (getattr(text, "num_kv_shared_layers", 0) or 0)
        self.cache = Cache(layers=[StaticLayer(max_len) for _ in range(n_cache)])
        self.max_len = max_len
        self.device = device
        self.ids = torch.zeros(1, 1, dtype=torch.long, device=device)  # the step's input token
        self.pos = torch.zeros(1, dtype=torch.long, device=device)  # absolute position of the last query
        self.key_pos = torch.arange(max_len, device=device)
        self.graph: Any = None
        self.use_graph = use_graph and device.type == "cuda"

    # ---- the step body: tensors in, tensors out, no host values ----
    def _masks(self, query_pos: torch.Tensor) -> dict[str, torch.Tensor]:
        visible = self.key_pos[None, :] <= query_pos[:, None]  # [q, L] causal
        sliding = visible
        if self.window:
            sliding = visible & (self.key_pos[None, :] > query_pos[:, None] - self.window)
        return {"full_attention": visible[None, None], "sliding_attention": sliding[None, None]}

    def _next_token(self, input_ids: torch.Tensor, query_pos: torch.Tensor) -> torch.Tensor:
        out = self.decoder(
            input_ids=input_ids, attention_mask=self._masks(query_pos), position_ids=query_pos[None],
            past_key_values=self.cache, use_cache=True,
        )
        logits = self.lm_head(out.last_hidden_state[:, -1:])
        if self.softcap:  # same ops as the model's own head, so greedy ties break the same way
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits[:, -1].argmax(-1, keepdim=True)

    def _step_body(self) -> None:
        self.pos.add_(1)
        self.ids.copy_(self._next_token(self.ids, self.pos))

    # ---- driving it ----
    def prefill(self, prompt_ids: list[int]) -> int:
        n = len(prompt_ids)
        if n + 1 > self.max_len:
            raise AlignattError(f"prompt of {n} tokens does not fit a static cache of {self.max_len}")
        self.cache.reset()
        self.pos.fill_(n - 1)
        ids = torch.tensor([prompt_ids], device=self.device)
        self.ids.copy_(self._next_token(ids, torch.arange(n, device=self.device)))
        return int(self.ids)

    def verify(self, prompt_ids: list[int], proposal: list[int]) -> list[int]:
        """Prefill the prompt and the proposal; the argmax at the last len(proposal) + 1 positions."""
        ids = list(prompt_ids) + list(proposal)
        n, k = len(ids), len(proposal)
        if n + 1 > self.max_len:
            raise AlignattError(f"prompt and proposal of {n} tokens do not fit a static cache of {self.max_len}")
        self.cache.reset()
        self.pos.fill_(n - 1)  # the last query: a recorder addresses the kept queries from it
        query_pos = torch.arange(n, device=self.device)
        out = self.decoder(
            input_ids=torch.tensor([ids], device=self.device), attention_mask=self._masks(query_pos),
            position_ids=query_pos[None], past_key_values=self.cache, use_cache=True,
        )
        logits = self.lm_head(out.last_hidden_state[:, -(k + 1):])
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits[0].argmax(-1).tolist()

    def rewind(self, n_cached: int, next_input: int) -> None:
        """Keep positions [0, n_cached) and feed `next_input` at position n_cached next."""
        for layer in self.cache.layers:
            layer.cumulative_length.fill_(n_cached)
        self.pos.fill_(n_cached - 1)  # `step` adds one before its forward
        self.ids.fill_(next_input)

    def step(self) -> int:
        """One greedy step after the prefill (or the previous step); returns the new token id."""
        if self.graph is not None:
            self.graph.replay()
        else:
            self._step_body()
        return int(self.ids)  # the one host sync per step

    def capture(self) -> None:
        """Record the step as a CUDA graph (once). Warm-up and capture write into the cache and the
        recording buffers; the next `prefill` resets what matters (cache lengths, position)."""
        if not self.use_graph or self.graph is not None:
            return
        self.prefill([0])  # allocates the cache tensors before capture
        stream = torch.cuda.Stream(device=self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for _ in range(2):  # as torch.cuda.graphs advises: warm up off the default stream
                self._step_body()
        torch.cuda.current_stream(self.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        # thread_local: another engine thread working on the GPU meanwhile does not void the capture
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            self._step_body()
        torch.cuda.synchronize(self.device)
        self.graph = graph

    def keys(self, cache_layer: int) -> torch.Tensor:
        """[KV, max_len, D] keys of a cache-owning layer, index == absolute position."""
        return self.cache.layers[cache_layer].keys[0]


def greedy(decoder: StaticDecoder, prompt_ids: list[int], max_new_tokens: int,
           is_stop: Callable[[int], bool], clock: Callable[[], float]) -> tuple[list[int], str, float, float]:
    """Draft up to `max_new_tokens`; returns (tokens, stop reason, prefill ms, decode ms)."""
    drafted: list[int] = []
    t0 = clock()
    token = decoder.prefill(prompt_ids)
    t1 = clock()
    prefill_ms, stop_reason = (t1 - t0) * 1e3, "max_new_tokens"
    for step in range(max_new_tokens):
        if step:
            token = decoder.step()
        if is_stop(token):
            stop_reason = "eos"
            break
        drafted.append(token)
    return drafted, stop_reason, prefill_ms, (clock() - t1) * 1e3


def verify_then_greedy(decoder: StaticDecoder, prompt_ids: list[int], proposal: list[int], max_new_tokens: int,
                       is_stop: Callable[[int], bool], clock: Callable[[], float],
                       on_verified: Callable[[], None] = lambda: None) -> tuple[list[int], str, Acceptance]:
    """`greedy`, with the first forward verifying `proposal`; returns (tokens, stop reason, figures).
    `on_verified` runs after the verifying forward (a recorder goes back to one query per step)."""
    acceptance = Acceptance()
    if not proposal:
        drafted, stop_reason, prefill_ms, decode_ms = greedy(decoder, prompt_ids, max_new_tokens, is_stop, clock)
        steps = len(drafted) + (stop_reason == "eos")  # the prefill, and one step per later token or stop
        acceptance.decoded = max(len(drafted) - 1, 0)
        acceptance.forward_steps = max(steps, 1)
        acceptance.verify_ms, acceptance.extend_ms = prefill_ms, decode_ms
        return drafted, stop_reason, acceptance
    n_prompt = len(prompt_ids)
    t0 = clock()
    scored = decoder.verify(prompt_ids, proposal)
    on_verified()
    t1 = clock()
    drafted, stopped = accept_proposal(scored, proposal, max_new_tokens, is_stop)
    acceptance.proposed, acceptance.accepted = len(proposal), agreeing_prefix(drafted, proposal)
    acceptance.forward_steps, acceptance.verify_ms = 1, (t1 - t0) * 1e3
    stop_reason = "eos" if stopped else "max_new_tokens"
    if not stopped and len(drafted) < max_new_tokens:
        decoder.rewind(n_prompt + len(drafted) - 1, drafted[-1])
        while len(drafted) < max_new_tokens:
            token = decoder.step()
            acceptance.forward_steps += 1
            if is_stop(token):
                stop_reason = "eos"
                break
            drafted.append(token)
            acceptance.decoded += 1
    acceptance.extend_ms = (clock() - t1) * 1e3
    return drafted, stop_reason, acceptance
