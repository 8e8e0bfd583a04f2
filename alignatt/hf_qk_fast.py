"""`hf_qk_fast`: sdpa attention; rows rebuilt from the q and k that the kernel received.

An attention function registered with transformers (`AttentionInterface`) runs in place of sdpa
on every layer. On the selected heads' layers it records, for the last query position only, the
post-RoPE query of the selected heads and the keys of the KV heads they read (a KV-shared layer
receives its donor layer's keys, so nothing special is needed for it), then delegates to
transformers' own sdpa function. After the draft, `attention_row` rebuilds each row with the
layer's scaling, fp32 softmax and causal + sliding-window masks.
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import Any

import torch

from transformers.integrations.sdpa_attention import sdpa_attention_forward

from alignatt.capture import Head, attention_row
from alignatt.hf_decode import HFCaptureSeam, decoder_layers, key_positions, rows_buffer
from alignatt.models import LoadedModel
from alignatt.prompt import PromptLayout

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

    def __init__(self, loaded: LoadedModel, heads: list[Head]):
        register_attention()
        super().__init__(loaded, heads)
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
        self._step: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self._steps: list[tuple[int, dict[int, tuple[torch.Tensor, torch.Tensor]]]] = []
        self._token = None

    def begin(self, prompt: PromptLayout) -> None:
        self._steps = []
        self._token = _ACTIVE.set(self)

    def before_step(self, query_position: int) -> None:
        self._query_position = query_position
        self._step = {}

    def record(self, module: Any, query: torch.Tensor, key: torch.Tensor) -> None:
        """In-forward: keep the last query of the selected heads and the keys they read."""
        layer = self._layer_of.get(id(module))
        if layer is None:
            return
        q_heads, kv_heads = self._index[layer]
        # query [1, H, q_len, D], key [1, KV, n_keys, D]; index_select copies, so the
        # recorded tensors stay valid whatever the cache does next.
        q = query[0, :, -1, :].index_select(0, q_heads)
        k = key[0].index_select(0, kv_heads)
        self._step[layer] = (q, k)

    def capture(self, outputs: Any, query_position: int) -> None:
        self._steps.append((query_position, self._step))
        self._step = {}

    def reconstruct(self, n_steps: int, n_positions: int) -> torch.Tensor:
        layout = self.loaded.layout
        full = rows_buffer(n_steps, len(self.heads), n_positions, self.device)
        for s in range(n_steps):
            query_position, recorded = self._steps[s]
            for layer, (q, k) in recorded.items():
                la = layout[layer]
                positions = key_positions(query_position, k.shape[1], k.device)
                rows = attention_row(q, k, positions, query_position, la.scaling, la.sliding_window, la.softcap)
                full[s, self.row_index[layer][:, None], positions[None, :]] = rows
        return full

    def end(self) -> None:
        if self._token is not None:
            _ACTIVE.reset(self._token)
            self._token = None
        self._steps = []
