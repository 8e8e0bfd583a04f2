"""The greedy draft loop both transformers seams share, and the row/mass split they both use.

The loop is written out by hand (no `generate()`): prefill the prompt, take the argmax, feed it
back with the model's KV cache, stop at an EOS / end-of-turn token (or a line break for few-shot
prompts) or after `max_new_tokens`. Drafted token i is attributed the attention of the forward
step that *produced* its logits, i.e. of the query at absolute position `prompt_len - 1 + i`.

Verify, then extend: a request with a proposal (the session's previous draft beyond what it
accepted) prefills the prompt *and* the proposal in one forward and takes the argmax at the last
`len(proposal) + 1` positions. The agreeing prefix is kept, the argmax at the first disagreement
is the model's own next token, and the loop decodes on from there (after cropping the rejected
positions from the cache). A kept token's query saw exactly the prompt and the kept tokens before
it (causal mask), so its logits and rows are the from-scratch draft's, computed in one pass.

A seam plugs in three things: the attention implementation to run, what to collect after each
forward step (`capture`), and how to turn that into full rows over absolute key positions
(`reconstruct`). The rows stay on the model's device until the draft ends, then cross to the
host once.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch

from alignatt.capture.attention import sync
from alignatt.core.draft import (
    Acceptance, Draft, DraftRequest, Head, Timings, TokenCapture, accept_proposal, add_acceptance, agreeing_prefix,
)
from alignatt.core.errors import AlignattError
from alignatt.models.presets import LoadedModel
from alignatt.core.prompt import PromptLayout, build_prompt


def key_positions(query_position: int, n_keys: int, device: Any) -> torch.Tensor:
    """Absolute positions of the keys a layer's kernel received for the last query.

    The keys always end at the query itself. Full layers receive every position; sliding layers
    at decode time receive only the last `sliding_window` positions (HF keeps window-1 cached
    keys plus the new one), so cache index i holds position query_position - n_keys + 1 + i.
    """
    return torch.arange(n_keys, device=device) + (query_position - n_keys + 1)


def decoder_layers(model: Any) -> list[Any]:
    """The text decoder's layers, for a causal LM or a multimodal wrapper (Gemma-4 -it)."""
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else getattr(model, "model", None)
    layers = getattr(decoder, "layers", None)
    if layers is None:
        raise AlignattError(f"cannot find the decoder layers of {type(model).__name__}")
    return list(layers)


class HFCaptureSeam:
    """Base of `hf_eager` and `hf_qk_fast`: greedy drafting with the HF KV cache."""

    name = ""
    attn_implementation = ""

    def __init__(self, loaded: LoadedModel, heads: list[Head], verify: bool = True):
        self.loaded = loaded
        self.verify = verify  # False: every draft from scratch, a request's proposal ignored
        self.totals: dict[str, float] = {}  # acceptance figures over every draft (`acceptance_totals`)
        self.heads = loaded.layout.validate_heads(heads)
        self.layers = sorted({h.layer for h in self.heads})
        # For each selected layer: (rows in `self.heads` order, query heads, KV heads they read).
        self.by_layer: dict[int, tuple[list[int], list[int], list[int]]] = {}
        for layer in self.layers:
            idx = [i for i, h in enumerate(self.heads) if h.layer == layer]
            q_heads = [self.heads[i].head for i in idx]
            self.by_layer[layer] = (idx, q_heads, [loaded.layout[layer].kv_head(h) for h in q_heads])
        self.device = torch.device(loaded.device)
        self.stop_ids = set(loaded.stop_token_ids)
        # Where each selected layer's rows go in the [n_heads] axis, as a device index.
        self.row_index = {
            layer: torch.tensor(idx, device=self.device) for layer, (idx, _, _) in self.by_layer.items()
        }

    def acceptance_totals(self) -> dict[str, float]:
        return dict(self.totals)

    def close(self) -> None:
        """The loaded model belongs to whoever loaded it (tests share one); drop our reference."""
        self.loaded = None

    # ---- what a seam provides ----
    def forward_kwargs(self) -> dict[str, Any]:
        return {}

    def begin(self, prompt: PromptLayout) -> None:
        """Called once per draft before the prefill."""

    def before_step(self, query_position: int, n_queries: int = 1) -> None:
        """Called before each forward; `query_position` is the absolute position of its last query,
        and its last `n_queries` queries decide drafted tokens (more than one: a verifying forward)."""

    def capture(self, outputs: Any, query_position: int, n_queries: int = 1) -> None:
        """Collect what the step recorded for its last `n_queries` queries (after every forward)."""

    def keep_rows(self, n_tokens: int) -> None:
        """Only the first `n_tokens` drafted tokens' captures are valid (the rest were rejected)."""

    def reconstruct(self, n_steps: int, n_positions: int) -> torch.Tensor:
        """fp32 [n_steps, n_heads, n_positions]: each step's rows over absolute positions."""
        raise NotImplementedError

    def end(self) -> None:
        """Called once per draft when it is over (also on errors)."""

    # ---- the shared loop ----
    def _sync(self) -> None:
        sync(self.device)

    def draft(self, request: DraftRequest) -> Draft:
        model, tokenizer = self.loaded.model, self.loaded.tokenizer
        prompt = build_prompt(tokenizer, request)
        n_prompt = len(prompt.input_ids)
        max_pos = getattr(model.config.get_text_config(), "max_position_embeddings", None)
        if max_pos and n_prompt + request.max_new_tokens > max_pos:
            raise AlignattError(f"prompt of {n_prompt} tokens + draft exceeds the model's {max_pos} positions")
        if model.config._attn_implementation != self.attn_implementation:
            model.set_attn_implementation(self.attn_implementation)
        timings, acceptance = Timings(), Acceptance()
        proposal = request.proposed_tokens() if self.verify else []
        self.begin(prompt)
        try:
            with torch.inference_mode():
                drafted, stop_reason = self.decode(prompt, request.max_new_tokens, timings, proposal, acceptance)
                t2 = time.perf_counter()
                tokens = self._tokens(prompt, drafted)
                self._sync()
                timings.reconstruct_ms = (time.perf_counter() - t2) * 1e3
        finally:
            self.end()
        add_acceptance(self.totals, acceptance, len(tokens))
        return Draft(
            request=request,
            heads=list(self.heads),
            prompt_token_count=n_prompt,
            source_token_positions=list(prompt.source_token_positions),
            source_word_of_token=list(prompt.source_word_of_token),
            tokens=tokens,
            stop_reason=stop_reason,
            timings=timings,
            seam=self.name,
            acceptance=acceptance,
        )

    def is_stop(self, prompt: PromptLayout, token: int) -> bool:
        return token in self.stop_ids or (
            prompt.stop_at_newline and "\n" in self.loaded.tokenizer.decode([token])
        )

    def decode(self, prompt: PromptLayout, max_new_tokens: int, timings: Timings,
               proposal: list[int] | None = None, acceptance: Acceptance | None = None) -> tuple[list[int], str]:
        """The greedy loop on transformers' dynamic cache; returns (drafted ids, stop reason).

        With a proposal, the first forward verifies it (see the module docstring)."""
        acceptance = acceptance if acceptance is not None else Acceptance()
        proposal = list(proposal or [])
        k = len(proposal)
        n_prompt = len(prompt.input_ids)
        ids = torch.tensor([list(prompt.input_ids) + proposal], device=self.device)
        # A cache of full-length layers: a rejected suffix can be cropped from it, which a
        # sliding-window layer past its window cannot do. The sliding window is then the mask's
        # alone, as on the static path. Without a proposal the model builds its own cache, as ever.
        cache = self._croppable_cache() if k else None
        self.before_step(n_prompt - 1 + k, k + 1)
        self._sync()
        t0 = time.perf_counter()
        out = self.loaded.model(
            input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=k + 1, **self.forward_kwargs(),
        )
        scored = out.logits[0].argmax(-1).tolist()  # the one host sync per forward
        t1 = time.perf_counter()
        timings.prefill_ms += (t1 - t0) * 1e3
        acceptance.verify_ms += (t1 - t0) * 1e3
        acceptance.forward_steps += 1
        self.capture(out, n_prompt - 1 + k, k + 1)
        self._sync()
        timings.capture_ms += (time.perf_counter() - t1) * 1e3
        cache = out.past_key_values
        del out
        drafted, stopped = accept_proposal(scored, proposal, max_new_tokens, lambda t: self.is_stop(prompt, t))
        acceptance.proposed, acceptance.accepted = k, agreeing_prefix(drafted, proposal)
        self.keep_rows(len(drafted))
        if stopped:
            return drafted, "eos"
        if len(drafted) >= max_new_tokens:
            return drafted, "max_new_tokens"
        if k:  # keep the prompt and the tokens before the last drafted one, which is fed next
            cache.crop(n_prompt + len(drafted) - 1)
        ids = torch.tensor([[drafted[-1]]], device=self.device)
        for step in range(len(drafted), max_new_tokens):
            query_position = n_prompt - 1 + step
            self.before_step(query_position)
            self._sync()
            t0 = time.perf_counter()
            out = self.loaded.model(
                input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1,
                **self.forward_kwargs(),
            )
            token = int(out.logits[0, -1].argmax())  # the one host sync per step
            t1 = time.perf_counter()
            timings.decode_ms += (t1 - t0) * 1e3
            acceptance.extend_ms += (t1 - t0) * 1e3
            acceptance.forward_steps += 1
            self.capture(out, query_position)
            self._sync()
            timings.capture_ms += (time.perf_counter() - t1) * 1e3
            cache = out.past_key_values
            del out
            if self.is_stop(prompt, token):
                return drafted, "eos"
            drafted.append(token)
            acceptance.decoded += 1
            ids = torch.tensor([[token]], device=self.device)
        return drafted, "max_new_tokens"

    def _croppable_cache(self) -> Any:
        from transformers.cache_utils import DynamicCache

        return DynamicCache()  # no config: every layer a full-length `DynamicLayer`

    def _tokens(self, prompt: PromptLayout, drafted: list[int]) -> list[TokenCapture]:
        if not drafted:
            return []
        n = len(drafted)
        full = self.reconstruct(n, len(prompt.input_ids) + n)  # [n, H, P+n]
        src = torch.tensor(prompt.source_token_positions, device=full.device)
        other = torch.ones(full.shape[-1], dtype=torch.bool, device=full.device)
        other[prompt.prefix_start:] = False
        other[src] = False
        rows = full.index_select(-1, src)
        other_mass = (full * other).sum(-1)
        generated_mass = full[..., prompt.prefix_start:].sum(-1)
        rows, other_mass, generated_mass = (t.float().cpu().numpy() for t in (rows, other_mass, generated_mass))
        blocks = block_masses(full, prompt)
        pieces = _pieces(self.loaded.tokenizer, drafted)
        return [
            TokenCapture(
                token_id=tok,
                piece=pieces[i],
                rows=np.ascontiguousarray(rows[i], dtype=np.float32),
                other_prompt_mass=other_mass[i].astype(np.float32),
                generated_mass=generated_mass[i].astype(np.float32),
                **{f"{k}_mass": None if v is None else v[i] for k, v in blocks.items()},
            )
            for i, tok in enumerate(drafted)
        ]


def block_masses(full: torch.Tensor, prompt: PromptLayout, key_lo: int = 0) -> dict[str, np.ndarray | None]:
    """fp32 [T, heads] mass on the context block and on the history turns (None: no such block).

    `full` holds rows over the contiguous key positions key_lo..; positions outside it (a
    sliding window) contribute 0.
    """
    out: dict[str, np.ndarray | None] = {}
    for name, positions in (("context", prompt.context_token_positions),
                            ("history", prompt.history_token_positions)):
        rel = [p - key_lo for p in positions if 0 <= p - key_lo < full.shape[-1]]
        if not positions:
            out[name] = None
        elif not rel:
            out[name] = np.zeros(full.shape[:2], dtype=np.float32)
        else:
            idx = torch.tensor(rel, device=full.device)
            out[name] = full.index_select(-1, idx).sum(-1).float().cpu().numpy().astype(np.float32)
    return out


def _pieces(tokenizer: Any, ids: list[int]) -> list[str]:
    """Each token's text as it appears within the draft (decoded in context, spaces kept)."""
    pieces, previous = [], ""
    for i in range(len(ids)):
        text = tokenizer.decode(ids[: i + 1])
        pieces.append(text[len(previous):] if text.startswith(previous) else tokenizer.decode([ids[i]]))
        previous = text
    return pieces


def rows_buffer(n_steps: int, n_heads: int, n_positions: int, device: Any) -> torch.Tensor:
    return torch.zeros(n_steps, n_heads, n_positions, dtype=torch.float32, device=device)

