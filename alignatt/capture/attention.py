"""The model's own attention math, rebuilt from captured q and cached keys (every seam's rows).

Kept out of `core` so that the draft types, the policy and every `alignatt` process that only
speaks the protocol (the CLI's help included) do not import torch.
"""

from __future__ import annotations

import math

import torch


def sync(device: torch.device) -> None:
    """Wait for the device, so that a wall-clock reading covers the work queued on it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def attention_row(
    q: torch.Tensor,
    keys: torch.Tensor,
    key_positions: torch.Tensor,
    query_position: int | torch.Tensor,
    scaling: float,
    sliding_window: int | None,
    softcap: float | None = None,
) -> torch.Tensor:
    """Rebuild softmax attention of queries over keys exactly as the model's kernel does.

    q: [H, D] post-RoPE query of one new token for the selected heads, or [T, H, D] for T tokens
    (then `query_position` is a tensor [T]).
    keys: [H, L, D] the keys those heads read (already mapped query head -> KV head).
    key_positions: [L] absolute position of each key (-1 for an empty cache slot).
    Returns fp32 [H, L] (or [T, H, L]); masked positions get exactly 0.

    Visibility is the model's own: causal (pos <= query_position) and, on sliding layers,
    pos > query_position - sliding_window (HF and vLLM both keep `window` keys incl. the query).
    """
    scores = torch.einsum("...hd,hld->...hl", q.float(), keys.float()) * scaling
    if softcap:
        scores = torch.tanh(scores / softcap) * softcap
    qp = torch.as_tensor(query_position, device=key_positions.device)
    if qp.ndim:
        qp = qp[:, None, None]  # one position per query token
    visible = (key_positions >= 0) & (key_positions <= qp)
    if sliding_window is not None:
        visible = visible & (key_positions > qp - sliding_window)
    return torch.softmax(scores.masked_fill(~visible, -math.inf), dim=-1)
