"""Per-layer attention geometry that capture needs, read from a Hugging Face config.

Rebuilding an attention row from captured q/k needs, per layer: head dim, query and KV head
counts (GQA: query head h reads KV head h // (H / KV)), the score scaling, the sliding window
(None on full layers), an optional logit softcap, and, for Gemma-4's KV-shared layers, which
earlier layer's keys the layer reads. Everything is derived from the config, so E2B, E4B and the
tiny test configs all go through the same code.
"""

from __future__ import annotations

from typing import Any, Iterable, Literal

from pydantic import BaseModel, ConfigDict

from alignatt.core.draft import Head
from alignatt.core.errors import AlignattError

LayerKind = Literal["sliding", "full"]


class LayerAttention(BaseModel):
    model_config = ConfigDict(frozen=True)

    layer: int
    kind: LayerKind
    head_dim: int
    n_heads: int
    n_kv_heads: int
    scaling: float
    sliding_window: int | None  # None on full-attention layers
    kv_source_layer: int  # the layer whose keys this layer reads (itself unless KV-shared)
    softcap: float | None = None

    @property
    def kv_shared(self) -> bool:
        return self.kv_source_layer != self.layer

    def kv_head(self, head: int) -> int:
        """GQA map: the KV head that query head `head` reads."""
        return head // (self.n_heads // self.n_kv_heads)


class AttentionLayout(BaseModel):
    model_config = ConfigDict(frozen=True)

    family: str  # "gemma4_text" | "gemma3_text"
    layers: list[LayerAttention]

    @property
    def n_layers(self) -> int:
        return len(self.layers)

    def __getitem__(self, layer: int) -> LayerAttention:
        return self.layers[layer]

    def all_heads(self) -> list[Head]:
        return [Head(la.layer, h) for la in self.layers for h in range(la.n_heads)]

    def validate_heads(self, heads: Iterable[Head]) -> list[Head]:
        """Return the heads as a list, or raise naming the valid range of the first bad one."""
        heads = list(heads)
        if not heads:
            raise AlignattError("no alignment heads selected: give at least one (layer, head)")
        for h in heads:
            if not 0 <= h.layer < self.n_layers:
                raise AlignattError(
                    f"head (layer={h.layer}, head={h.head}) is out of range: this {self.family} "
                    f"model has layers 0..{self.n_layers - 1}"
                )
            n = self.layers[h.layer].n_heads
            if not 0 <= h.head < n:
                raise AlignattError(
                    f"head (layer={h.layer}, head={h.head}) is out of range: layer {h.layer} "
                    f"has heads 0..{n - 1}"
                )
        return heads

    @classmethod
    def from_config(cls, config: Any) -> "AttentionLayout":
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        model_type = getattr(text, "model_type", "")
        if model_type in ("gemma4_text", "gemma4"):
            return cls(family="gemma4_text", layers=_gemma4_layers(text))
        if model_type in ("gemma3_text", "gemma3"):
            return cls(family="gemma3_text", layers=_gemma3_layers(text))
        raise AlignattError(
            f"no attention layout for model type {model_type!r}: supported are Gemma-4 text "
            "(gemma4_text) and Gemma-3 text (gemma3_text)"
        )


def _kinds(config: Any) -> list[LayerKind]:
    types = getattr(config, "layer_types", None) or ["full_attention"] * config.num_hidden_layers
    kinds: list[LayerKind] = []
    for t in types:
        if t not in ("sliding_attention", "full_attention"):
            raise AlignattError(f"unsupported layer type {t!r} in the model config")
        kinds.append("sliding" if t == "sliding_attention" else "full")
    return kinds


def _gemma4_layers(config: Any) -> list[LayerAttention]:
    kinds = _kinds(config)
    n_layers = config.num_hidden_layers
    # Layers [first_shared, n) own no K/V projections: each reads the keys of the last
    # non-shared layer of the same kind (E4B: 22 for sliding, 23 for full).
    first_shared = n_layers - (getattr(config, "num_kv_shared_layers", 0) or 0)
    donors = {kind: max(i for i in range(first_shared) if kinds[i] == kind) for kind in set(kinds[:first_shared])}
    layers = []
    for i, kind in enumerate(kinds):
        full = kind == "full"
        # attention_k_eq_v swaps in the "global" KV head count on full layers
        alt = bool(getattr(config, "attention_k_eq_v", False)) and full
        n_kv = (config.num_global_key_value_heads if alt else None) or config.num_key_value_heads
        head_dim = (config.global_head_dim if full and getattr(config, "global_head_dim", None) else config.head_dim)
        if i >= first_shared and kind not in donors:
            raise AlignattError(f"KV-shared layer {i} ({kind}) has no earlier {kind} layer to read keys from")
        layers.append(
            LayerAttention(
                layer=i,
                kind=kind,
                head_dim=head_dim,
                n_heads=config.num_attention_heads,
                n_kv_heads=n_kv,
                scaling=1.0,  # Gemma-4 normalises q and k (q_norm/k_norm) and scores unscaled
                sliding_window=config.sliding_window if kind == "sliding" else None,
                kv_source_layer=donors[kind] if i >= first_shared else i,
                softcap=None,
            )
        )
    return layers


def _gemma3_layers(config: Any) -> list[LayerAttention]:
    return [
        LayerAttention(
            layer=i,
            kind=kind,
            head_dim=config.head_dim,
            n_heads=config.num_attention_heads,
            n_kv_heads=config.num_key_value_heads,
            scaling=config.query_pre_attn_scalar**-0.5,
            sliding_window=config.sliding_window if kind == "sliding" else None,
            kv_source_layer=i,
            # Gemma-3 configs carry attn_logit_softcapping (null in released models) but the
            # transformers kernel never applies it; mirror the kernel, not the field.
            softcap=None,
        )
        for i, kind in enumerate(_kinds(config))
    ]
