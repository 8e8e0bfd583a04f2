"""`hf_eager`: eager attention with `output_attentions=True`; rows read from the returned weights.

This is the reference seam: the model materialises every layer's attention probabilities and we
read the selected heads' last-query rows. It is slow (no fused kernel) but needs no model math
of our own, which is what makes it the yardstick for `hf_qk_fast`.
"""

from __future__ import annotations

from typing import Any

import torch

from alignatt.core.draft import Head
from alignatt.capture.hf.base import HFCaptureSeam, key_positions, rows_buffer
from alignatt.models.presets import LoadedModel
from alignatt.core.prompt import PromptLayout


class HFEagerSeam(HFCaptureSeam):
    name = "hf_eager"
    attn_implementation = "eager"

    def __init__(self, loaded: LoadedModel, heads: list[Head], verify: bool = True):
        super().__init__(loaded, heads, verify)
        # One entry per forward: (first drafted token it decides, queries kept, per-layer rows
        # [H, q, n_keys] with the keys' absolute positions).
        self._forwards: list[tuple[int, int, list[tuple[int, torch.Tensor, torch.Tensor]]]] = []
        self._next_token = 0

    def forward_kwargs(self) -> dict[str, Any]:
        return {"output_attentions": True}

    def begin(self, prompt: PromptLayout) -> None:
        self._forwards, self._next_token = [], 0

    def capture(self, outputs: Any, query_position: int, n_queries: int = 1) -> None:
        step = []
        for layer in self.layers:
            _, q_heads, _ = self.by_layer[layer]
            weights = outputs.attentions[layer]  # [1, H, q_len, n_keys]: the keys end at the last query
            rows = weights[0, q_heads, -n_queries:, :].float()  # a copy: the step's tensors can go
            step.append((layer, rows, key_positions(query_position, rows.shape[-1], rows.device)))
        self._forwards.append((self._next_token, n_queries, step))
        self._next_token += n_queries

    def keep_rows(self, n_tokens: int) -> None:
        first, n, step = self._forwards[-1]
        self._forwards[-1] = (first, max(min(n, n_tokens - first), 0), step)
        self._next_token = n_tokens

    def reconstruct(self, n_steps: int, n_positions: int) -> torch.Tensor:
        full = rows_buffer(n_steps, len(self.heads), n_positions, self.device)
        for first, n, step in self._forwards:
            n = min(n, n_steps - first)
            if n <= 0:
                continue
            for layer, rows, positions in step:
                inside = positions < n_positions  # a verifying forward's later keys: masked for kept queries
                kept = rows[:, :n, :][..., inside].transpose(0, 1)  # [n, H, keys]
                full[first:first + n, self.row_index[layer][:, None], positions[inside][None, :]] = kept
        return full

    def end(self) -> None:
        self._forwards = []
