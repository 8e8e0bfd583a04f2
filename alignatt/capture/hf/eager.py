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

    def __init__(self, loaded: LoadedModel, heads: list[Head]):
        super().__init__(loaded, heads)
        self._steps: list[list[tuple[int, torch.Tensor, torch.Tensor]]] = []

    def forward_kwargs(self) -> dict[str, Any]:
        return {"output_attentions": True}

    def begin(self, prompt: PromptLayout) -> None:
        self._steps = []

    def capture(self, outputs: Any, query_position: int) -> None:
        step = []
        for layer in self.layers:
            _, q_heads, _ = self.by_layer[layer]
            weights = outputs.attentions[layer]  # [1, H, q_len, n_keys]
            rows = weights[0, q_heads, -1, :].float()  # a copy: the step's tensors can go
            step.append((layer, rows, key_positions(query_position, rows.shape[-1], rows.device)))
        self._steps.append(step)

    def reconstruct(self, n_steps: int, n_positions: int) -> torch.Tensor:
        full = rows_buffer(n_steps, len(self.heads), n_positions, self.device)
        for s in range(n_steps):
            for layer, rows, positions in self._steps[s]:
                full[s, self.row_index[layer][:, None], positions[None, :]] = rows
        return full

    def end(self) -> None:
        self._steps = []
