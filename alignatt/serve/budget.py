"""Token bounds on one update's engine work: the whole prompt, the target prefix and the context.

A draft's cost grows with its prompt, so the server bounds it in tokens (what the engine pays),
not in frame bytes or words. The prompt bound counts everything the engine receives: the
template, `context_text`, the history turns (the client's and the session's own closed
utterances), the source and the target prefix. The bounds are `SessionLimits` fields, capped by
the engine's positions where the seam knows them (a prompt plus its draft must fit the model).
Counting needs the seam's tokenizer; a seam may offer `count_prompt_tokens(request)` /
`count_text_tokens(text)` and `max_positions` itself (the test fakes and the vLLM seam do),
otherwise the transformers seams' tokenizer is used through the same `build_prompt` the seam
drafts with.

Exact counting tokenizes the whole prompt, so it is skipped when a cheap upper bound already
fits: no token of these tokenizers covers less than one UTF-8 byte, so a prompt has at most
(tokens of the same prompt shape with one-byte texts) + (bytes of its texts) tokens. The shape
(languages, whether there is a context block, how many history turns) is counted once per shape.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable

from alignatt.core.draft import DraftRequest, Seam
from alignatt.serve.limits import BudgetExceeded, SessionLimits

# Slack on the byte bound, per place where a text meets the template (a token may straddle both).
_BOUND_SLACK = 4


def _tokenizer(seam: Seam) -> Any | None:
    tok = getattr(seam, "tokenizer", None)  # vllm_capture
    if tok is None:
        loaded = getattr(seam, "loaded", None)  # hf_eager, hf_qk_fast
        tok = getattr(loaded, "tokenizer", None)
    return tok


def seam_positions(seam: Seam) -> int | None:
    """How many positions (prompt + draft) the seam's model takes, where the seam says."""
    own = getattr(seam, "max_positions", None)  # the fakes; vllm_capture (its engine's max_model_len)
    if isinstance(own, int):
        return own
    model_len = getattr(seam, "max_model_len", None)
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


def _utf8_len(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


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
        # A known template count means the seam tokenizes real text: the byte bounds hold for it.
        self._byte_bounds = template_tokens is not None
        self._shapes: dict[tuple, int] = {}

    @classmethod
    def for_seam(cls, seam: Seam, limits: SessionLimits, draft_tokens: int) -> "PromptBudget | None":
        """The seam's budget, or None for a seam that cannot count (it is then unbounded in tokens)."""
        counting = token_counting(seam)
        if counting is None:
            return None
        return cls(limits, counting.prompt, counting.text, seam_positions(seam), draft_tokens, counting.template_tokens)

    # ---- counting ----

    def _shape_tokens(self, request: DraftRequest) -> int:
        """Tokens of a prompt shaped like `request` whose every text is one byte (counted once per shape)."""
        context = bool(request.context_text.strip())
        key = (request.source_lang, request.target_lang, context, len(request.history), bool(request.target_prefix))
        if key not in self._shapes:
            probe = DraftRequest(source_words=["a"], committed_words=1, max_new_tokens=1,
                                 target_prefix="a" if request.target_prefix else "",
                                 source_lang=request.source_lang, target_lang=request.target_lang,
                                 context_text="a" if context else "", history=[("a", "a")] * len(request.history))
            self._shapes[key] = self._count_prompt(probe)
        return self._shapes[key]

    def _prompt_upper_bound(self, request: DraftRequest) -> int | None:
        if not self._byte_bounds:
            return None
        texts = [*request.source_words, request.target_prefix, request.context_text,
                 *(part for turn in request.history for part in turn)]
        joins = len(request.source_words) + 2 * len(request.history) + 2  # spaces, turns, context, prefix
        return self._shape_tokens(request) + sum(map(_utf8_len, texts)) + joins * (1 + _BOUND_SLACK)

    def prompt_tokens(self, request: DraftRequest) -> int:
        return self._count_prompt(request)

    def text_tokens(self, text: str) -> int:
        if not text:
            return 0
        if self._byte_bounds and _utf8_len(text) <= min(self.max_target_prefix_tokens, self.max_context_tokens):
            return _utf8_len(text)  # an upper bound that fits every bound
        return self._count_text(text)

    def _over(self, request: DraftRequest) -> int | None:
        """The prompt's exact token count when it passes max_prompt_tokens, else None."""
        bound = self._prompt_upper_bound(request)
        if bound is not None and bound <= self.max_prompt_tokens:
            return None  # cheap: the whole prompt fits
        n = self.prompt_tokens(request)
        return n if n > self.max_prompt_tokens else None

    def _prompt_message(self, n: int) -> str:
        return (f"prompt of {n} tokens exceeds max_prompt_tokens={self.max_prompt_tokens} (template, context_text, "
                "history, source and target prefix counted"
                + (f"; the model takes {self.positions} positions)" if self.positions else ")"))

    # ---- the checks (each raises BudgetExceeded naming its bound) ----

    def check_request(self, request: DraftRequest) -> None:
        """The whole prompt of `request` within the bounds, else BudgetExceeded naming the one passed."""
        prefix = self.text_tokens(request.target_prefix)
        if prefix > self.max_target_prefix_tokens:
            raise BudgetExceeded(
                f"target prefix of {prefix} tokens exceeds max_target_prefix_tokens={self.max_target_prefix_tokens}"
            )
        n = self._over(request)
        if n is not None:
            raise BudgetExceeded(self._prompt_message(n) + "; send fewer or shorter words")

    def fit(self, request: DraftRequest) -> DraftRequest:
        """`request` within the bounds: as it is, or without its oldest history turns (the prompt's
        background, which the session's own closed utterances keep growing); else BudgetExceeded."""
        try:
            self.check_request(request)
            return request
        except BudgetExceeded:
            if not request.history:
                raise
        for kept in range(len(request.history) - 1, -1, -1):
            shorter = replace(request, history=list(request.history[len(request.history) - kept:]))
            if self._over(shorter) is None:
                return shorter
        alone = self.prompt_tokens(replace(request, history=[]))  # over even without any history
        raise BudgetExceeded(self._prompt_message(alone) + "; send fewer or shorter words")

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

    def check_init(self, prefix: str, history: list[tuple[str, str]], context_text: str,
                   source_lang: str, target_lang: str) -> None:
        """An init's prefix, context and history (the turns its prompts will hold) within every bound:
        with the template and a one-word source they must leave the prompt within max_prompt_tokens."""
        self.check_prefix(prefix)
        self.check_context(history, context_text)
        request = DraftRequest(source_words=["a"], committed_words=1, target_prefix=prefix, max_new_tokens=1,
                               source_lang=source_lang, target_lang=target_lang, context_text=context_text,
                               history=list(history))
        n = self._over(request)
        if n is not None:
            raise BudgetExceeded(
                f"context_text, history and accepted_target_prefix leave no room for a source: with the template "
                f"and a one-word source the prompt is {n} tokens, past max_prompt_tokens={self.max_prompt_tokens}"
                + (f" (the model takes {self.positions} positions)" if self.positions else "")
                + "; send less context or fewer history turns"
            )

    def describe(self) -> dict[str, int | None]:
        return {"positions": self.positions, "max_prompt_tokens": self.max_prompt_tokens,
                "max_target_prefix_tokens": self.max_target_prefix_tokens,
                "max_context_tokens": self.max_context_tokens}
