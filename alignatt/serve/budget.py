"""Token bounds on one update's engine work: prompt, target prefix and context, counted per seam.

A draft's cost grows with its prompt, so the server bounds it in tokens (what the engine pays),
not in frame bytes or words. The bounds are `SessionLimits` fields, capped by the engine's
positions where the seam knows them (a prompt plus its draft must fit the model). Counting needs
the seam's tokenizer; a seam may offer `count_prompt_tokens(request)` / `count_text_tokens(text)`
and `max_positions` itself (the test fakes do), otherwise the transformers and vLLM seams'
tokenizer is used through the same `build_prompt` the seam drafts with.

Exact counting tokenizes the whole prompt, so it is skipped when a cheap upper bound already
fits: no token of these tokenizers covers less than one UTF-8 byte, so a prompt has at most
(template tokens) + (bytes of source and prefix) tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from alignatt.core.draft import DraftRequest, Seam
from alignatt.serve.session import BudgetExceeded, SessionLimits

# Slack on the byte bound for tokens that straddle the template and the text.
_BOUND_SLACK = 8


def _tokenizer(seam: Seam) -> Any | None:
    tok = getattr(seam, "tokenizer", None)  # vllm_capture
    if tok is None:
        loaded = getattr(seam, "loaded", None)  # hf_eager, hf_qk_fast
        tok = getattr(loaded, "tokenizer", None)
    return tok


def seam_positions(seam: Seam) -> int | None:
    """How many positions (prompt + draft) the seam's model takes, where the seam says."""
    own = getattr(seam, "max_positions", None)
    if isinstance(own, int):
        return own
    model_len = getattr(seam, "max_model_len", None)  # vLLM's configured context
    if isinstance(model_len, int):
        return model_len
    model = getattr(getattr(seam, "loaded", None), "model", None)
    config = getattr(model, "config", None)
    if config is not None:
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        pos = getattr(text, "max_position_embeddings", None)
        if isinstance(pos, int):
            return pos
    return None


@dataclass
class TokenCounting:
    """How a seam counts: a prompt's tokens, a text's tokens, and its template's (None: unknown)."""

    prompt: Callable[[DraftRequest], int]
    text: Callable[[str], int]
    template_tokens: int | None = None


def token_counting(seam: Seam) -> TokenCounting | None:
    """The seam's own counters, else its tokenizer's through `build_prompt`; None when it has neither."""
    own_prompt = getattr(seam, "count_prompt_tokens", None)
    own_text = getattr(seam, "count_text_tokens", None)
    if callable(own_prompt) and callable(own_text):
        return TokenCounting(own_prompt, own_text)
    tok = _tokenizer(seam)
    if tok is None:
        return None
    from alignatt.core.prompt import build_prompt

    def count_prompt(request: DraftRequest) -> int:
        return len(build_prompt(tok, request).input_ids)

    def count_text(text: str) -> int:
        return len(tok(text, add_special_tokens=False)["input_ids"])

    template = count_prompt(DraftRequest(source_words=["a"], committed_words=1, max_new_tokens=1))
    return TokenCounting(count_prompt, count_text, template)


class PromptBudget:
    """The effective token bounds of one engine, and the checks a session runs before drafting."""

    def __init__(
        self,
        limits: SessionLimits,
        count_prompt: Callable[[DraftRequest], int],
        count_text: Callable[[str], int],
        positions: int | None = None,
        draft_tokens: int = 0,
        template_tokens: int | None = None,
    ) -> None:
        self.positions = positions
        self.max_prompt_tokens = limits.max_prompt_tokens
        if positions is not None:  # prompt + the longest draft must fit the model
            self.max_prompt_tokens = max(min(self.max_prompt_tokens, positions - draft_tokens), 1)
        self.max_target_prefix_tokens = min(limits.max_target_prefix_tokens, self.max_prompt_tokens)
        self.max_context_tokens = limits.max_context_tokens
        self._count_prompt = count_prompt
        self._count_text = count_text
        self._template_tokens = template_tokens

    @classmethod
    def for_seam(cls, seam: Seam, limits: SessionLimits, draft_tokens: int) -> "PromptBudget | None":
        """The seam's budget, or None for a seam that cannot count (it is then unbounded in tokens)."""
        counting = token_counting(seam)
        if counting is None:
            return None
        return cls(limits, counting.prompt, counting.text, seam_positions(seam), draft_tokens, counting.template_tokens)

    # ---- counting ----

    def _prompt_upper_bound(self, request: DraftRequest) -> int | None:
        if self._template_tokens is None:
            return None
        text = " ".join(request.source_words) + " " + request.target_prefix
        return self._template_tokens + len(text.encode("utf-8", "surrogatepass")) + _BOUND_SLACK

    def prompt_tokens(self, request: DraftRequest) -> int:
        return self._count_prompt(request)

    def text_tokens(self, text: str) -> int:
        if not text:
            return 0
        if self._template_tokens is not None and len(text.encode("utf-8", "surrogatepass")) <= min(
            self.max_target_prefix_tokens, self.max_context_tokens
        ):
            return len(text.encode("utf-8", "surrogatepass"))  # an upper bound that fits every bound
        return self._count_text(text)

    # ---- the checks (each raises BudgetExceeded naming its bound) ----

    def check_request(self, request: DraftRequest) -> None:
        bound = self._prompt_upper_bound(request)
        if bound is not None and bound <= min(self.max_prompt_tokens, self.max_target_prefix_tokens):
            return  # cheap: the whole prompt fits even the smaller bound
        prefix = self.text_tokens(request.target_prefix)
        if prefix > self.max_target_prefix_tokens:
            raise BudgetExceeded(
                f"target prefix of {prefix} tokens exceeds max_target_prefix_tokens={self.max_target_prefix_tokens}"
            )
        if bound is not None and bound <= self.max_prompt_tokens:
            return
        n = self.prompt_tokens(request)
        if n > self.max_prompt_tokens:
            raise BudgetExceeded(
                f"prompt of {n} tokens exceeds max_prompt_tokens={self.max_prompt_tokens}"
                + (f" (the model takes {self.positions} positions)" if self.positions else "")
                + "; send fewer or shorter words"
            )

    def check_prefix(self, prefix: str) -> None:
        n = self.text_tokens(prefix)
        if n > self.max_target_prefix_tokens:
            raise BudgetExceeded(
                f"accepted_target_prefix of {n} tokens exceeds max_target_prefix_tokens={self.max_target_prefix_tokens}"
            )

    def check_context(self, history: list[tuple[str, str]], context_text: str) -> None:
        text = "\n".join([context_text] + [f"{s}\n{t}" for s, t in history])
        n = self.text_tokens(text.strip())
        if n > self.max_context_tokens:
            raise BudgetExceeded(
                f"history + context_text of {n} tokens exceeds max_context_tokens={self.max_context_tokens}"
            )

    def describe(self) -> dict[str, int | None]:
        return {"positions": self.positions, "max_prompt_tokens": self.max_prompt_tokens,
                "max_target_prefix_tokens": self.max_target_prefix_tokens,
                "max_context_tokens": self.max_context_tokens}
