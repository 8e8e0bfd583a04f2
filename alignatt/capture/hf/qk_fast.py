"""`hf_qk_fast`: sdpa attention; rows rebuilt from the q and k that the kernel received.

An attention function registered with transformers (`AttentionInterface`) runs in place of sdpa
on every layer. On the selected heads' layers it records, for the last query position only, the
post-RoPE query of the selected heads and the keys of the KV heads they read (a KV-shared layer
receives its donor layer's keys, so nothing special is needed for it), then delegates to
transformers' own sdpa function. After the draft, `attention_row` rebuilds each row with the
layer's scaling, fp32 softmax and causal + sliding-window masks.
"""

from __future__ import annotations

import time
from contextvars import ContextVar
from typing import Any, Literal

import torch

from transformers.integrations.sdpa_attention import sdpa_attention_forward

from alignatt.capture.attention import attention_row
from alignatt.core.draft import Acceptance, Head, Timings
from alignatt.core.errors import AlignattError
from alignatt.capture.hf.base import HFCaptureSeam, decoder_layers, key_positions, rows_buffer
from alignatt.capture.hf.static_decode import StaticDecoder, bucket_length, verify_then_greedy
from alignatt.models.presets import LoadedModel
from alignatt.core.prompt import PromptLayout

DecodeMode = Literal["dynamic", "static", "graph"]
DECODE_MODES = ("dynamic", "static", "graph")

ATTN_NAME = "alignatt_qk"

# The seam whose draft is running in this thread/context (None: plain sdpa, nothing recorded).
_ACTIVE: ContextVar["HFQKFastSeam | None"] = ContextVar("alignatt_qk_active", default=None)


def _recording_sdpa(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    attention_mask: Any, **kwargs: Any) -> tuple[torch.Tensor, Any]:
    seam = _ACTIVE.get()
    if seam is not None:
        seam.record(module, query, key)
    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


def register_attention() -> None:
    """Register the recording kernel (and sdpa's mask builder under the same name). Idempotent."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(ATTN_NAME, _recording_sdpa)
    # Without a mask function of its own name transformers would build no mask at all
    # (sliding layers would then see every key).
    if ATTN_NAME not in ALL_MASK_ATTENTION_FUNCTIONS._global_mapping:
        AttentionMaskInterface.register(ATTN_NAME, sdpa_mask)


class HFQKFastSeam(HFCaptureSeam):
    name = "hf_qk_fast"
    attn_implementation = ATTN_NAME

    def __init__(self, loaded: LoadedModel, heads: list[Head], decode: DecodeMode | None = None,
                 verify: bool = True):
        register_attention()
        super().__init__(loaded, heads, verify)
        if decode is None:
            decode = "graph" if self.device.type == "cuda" else "dynamic"
        if decode not in DECODE_MODES:
            raise AlignattError(f"unknown hf_qk_fast decode mode {decode!r}: use one of {', '.join(DECODE_MODES)}")
        if decode == "graph" and self.device.type != "cuda":
            raise AlignattError("hf_qk_fast decode mode 'graph' needs CUDA; use 'static' or 'dynamic' here")
        self.decode_mode = decode
        self._index = {
            layer: (
                torch.tensor(q_heads, device=self.device),
                torch.tensor(kv_heads, device=self.device),
            )
            for layer, (_, q_heads, kv_heads) in self.by_layer.items()
        }
        # Recognise the selected layers by module identity: a multimodal wrapper's vision or
        # audio towers run through the same kernel name with layer indices of their own.
        self._layer_of = {
            id(layer.self_attn): i for i, layer in enumerate(decoder_layers(loaded.model)) if i in self._index
        }
        self._query_position = 0
        self._n_queries = 1  # queries of the running forward that decide drafted tokens
        self._next_token = 0
        self._step: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        # One entry per forward: (first drafted token, queries kept, last query position, recorded).
        self._steps: list[tuple[int, int, int, dict[int, tuple[torch.Tensor, torch.Tensor]]]] = []
        self._token = None
        # static / graph: one decoder + query buffers per cache-length bucket
        self._decoders: dict[int, tuple[StaticDecoder, dict[int, torch.Tensor]]] = {}
        self._static: tuple[StaticDecoder, dict[int, torch.Tensor]] | None = None
        self._first_query = 0

    def close(self) -> None:
        """Free the static caches and captured graphs, then the model reference."""
        self._decoders.clear()
        self._static = None
        super().close()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    @property
    def variant(self) -> str:
        return {
            "dynamic": "dynamic KV cache, one forward call per token",
            "static": "static KV cache, uncaptured step",
            "graph": "static KV cache, one-token step replayed as a CUDA graph",
        }[self.decode_mode]

    def begin(self, prompt: PromptLayout) -> None:
        self._steps, self._next_token, self._n_queries = [], 0, 1
        self._token = _ACTIVE.set(self)

    def before_step(self, query_position: int, n_queries: int = 1) -> None:
        self._query_position = query_position
        self._n_queries = n_queries
        self._step = {}

    def record(self, module: Any, query: torch.Tensor, key: torch.Tensor) -> None:
        """In-forward: keep the last query of the selected heads (and, dynamic, the keys they read)."""
        layer = self._layer_of.get(id(module))
        if layer is None:
            return
        q_heads, kv_heads = self._index[layer]
        # query [1, H, q_len, D], key [1, KV, n_keys, D]
        n = self._n_queries
        if n == 1:
            q = query[0, :, -1, :].index_select(0, q_heads)  # [H, D]
        else:  # a verifying forward: its last n queries each decide a drafted token
            q = query[0, :, -n:, :].index_select(0, q_heads).transpose(0, 1)  # [n, H, D]
        if self._static is not None:
            decoder, qbuf = self._static
            if n == 1:
                qbuf[layer].index_copy_(0, decoder.pos, q[None])  # graph-safe: addressed by a tensor
            else:  # only in the uncaptured verifying prefill
                qbuf[layer].index_copy_(0, decoder.pos - n + 1 + torch.arange(n, device=q.device), q)
            return
        # index_select copies, so the recorded tensors stay valid whatever the cache does next.
        self._step[layer] = (q, key[0].index_select(0, kv_heads))

    def capture(self, outputs: Any, query_position: int, n_queries: int = 1) -> None:
        self._steps.append((self._next_token, n_queries, query_position, self._step))
        self._next_token += n_queries
        self._step = {}
        self._n_queries = 1

    def keep_rows(self, n_tokens: int) -> None:
        if self._steps:  # dynamic path; the static one addresses rows by position, later steps overwrite
            first, n, qp, rec = self._steps[-1]
            self._steps[-1] = (first, max(min(n, n_tokens - first), 0), qp, rec)
        self._next_token = n_tokens

    # ---- static / graph decoding ----
    def _decoder_for(self, n_positions: int) -> tuple[StaticDecoder, dict[int, torch.Tensor]]:
        length = bucket_length(n_positions)
        if length not in self._decoders:
            layout, model = self.loaded.layout, self.loaded.model
            decoder = StaticDecoder(model, length, self.device, use_graph=self.decode_mode == "graph")
            dtype = next(model.parameters()).dtype
            qbuf = {
                layer: torch.zeros(length, len(q_heads), layout[layer].head_dim, dtype=dtype, device=self.device)
                for layer, (_, q_heads, _) in self.by_layer.items()
            }
            self._decoders[length] = (decoder, qbuf)
            self._static = self._decoders[length]
            decoder.capture()  # the recording kernel runs inside it, into these buffers
        return self._decoders[length]

    def decode(self, prompt: PromptLayout, max_new_tokens: int, timings: Timings,
               proposal: list[int] | None = None, acceptance: Acceptance | None = None) -> tuple[list[int], str]:
        acceptance = acceptance if acceptance is not None else Acceptance()
        if self.decode_mode == "dynamic":
            self._static = None
            return super().decode(prompt, max_new_tokens, timings, proposal, acceptance)
        proposal = list(proposal or [])
        n_prompt = len(prompt.input_ids)
        self._static = self._decoder_for(n_prompt + max_new_tokens)  # a proposal is < max_new_tokens
        self._first_query = n_prompt - 1

        def clock() -> float:
            self._sync()
            return time.perf_counter()

        # The recorder keeps the verifying prefill's last len(proposal) + 1 queries.
        self._n_queries = len(proposal) + 1
        try:
            drafted, stop_reason, verify = verify_then_greedy(
                self._static[0], list(prompt.input_ids), proposal, max_new_tokens,
                lambda t: self.is_stop(prompt, t), clock, on_verified=lambda: setattr(self, "_n_queries", 1),
            )
        finally:
            self._n_queries = 1
        timings.prefill_ms += verify.verify_ms
        timings.decode_ms += verify.extend_ms
        for name in ("proposed", "accepted", "decoded", "forward_steps", "verify_ms", "extend_ms"):
            setattr(acceptance, name, getattr(acceptance, name) + getattr(verify, name))
        return drafted, stop_reason

    def reconstruct(self, n_steps: int, n_positions: int) -> torch.Tensor:
        layout = self.loaded.layout
        full = rows_buffer(n_steps, len(self.heads), n_positions, self.device)
        if self._static is not None:
            decoder, qbuf = self._static
            positions = torch.arange(n_positions, device=self.device)
            queries = positions[self._first_query:self._first_query + n_steps]
            for layer, (_, kv_heads) in self._index.items():
                la = layout[layer]
                keys = decoder.keys(la.kv_source_layer).index_select(0, kv_heads)[:, :n_positions]
                q = qbuf[layer][self._first_query:self._first_query + n_steps]  # [T, H, D]
                full[:, self.row_index[layer], :] = attention_row(
                    q, keys, positions, queries, la.scaling, la.sliding_window, la.softcap)
            return full
        for first, n, query_position, recorded in self._steps:
            n = min(n, n_steps - first)
            if n <= 0:
                continue
            for layer, (q, k) in recorded.items():
                la = layout[layer]
                positions = key_positions(query_position, k.shape[1], k.device)
                if q.ndim == 2:  # one query: the forward's last
                    rows = attention_row(q, k, positions, query_position, la.scaling, la.sliding_window, la.softcap)
                    full[first, self.row_index[layer][:, None], positions[None, :]] = rows
                    continue
                queries = torch.arange(n, device=k.device) + (query_position - q.shape[0] + 1)
                rows = attention_row(q[:n], k, positions, queries, la.scaling, la.sliding_window, la.softcap)
                inside = positions < n_positions  # keys after the kept queries: masked to 0
                full[first:first + n, self.row_index[layer][:, None], positions[inside][None, :]] = rows[..., inside]
        return full

    def end(self) -> None:
        if self._token is not None:
            _ACTIVE.reset(self._token)
            self._token = None
        self._steps = []
