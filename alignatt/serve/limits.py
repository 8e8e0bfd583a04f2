"""What one session may cost, and the errors that refuse an update: below both `session` and `budget`.

`SessionLimits` is the one definition of the per-session bounds (`ServerLimits` extends it);
`UpdateRejected` / `BudgetExceeded` are what the session and the token budget raise. They live
here, apart from the session that enforces them and the budget that counts against them, so that
neither of those two needs the other's module to name them.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class SessionLimits(BaseModel):
    """What one session may cost: the one definition of these limits (`ServerLimits` extends it)."""

    model_config = ConfigDict(extra="forbid")

    max_utterance_words: int = Field(80, ge=1, description="longer utterances are forced final")
    max_tail_words: int = Field(64, ge=0, description="tail words past this are ignored")
    # Token bounds on one draft's work. The engine's positions cap them further (`serve.budget`).
    max_prompt_tokens: int = Field(
        2048, ge=16, description="tokens of one draft's whole prompt: template, context_text, history, source "
                                 "and target prefix (bad_protocol past it)"
    )
    max_target_prefix_tokens: int = Field(
        1024, ge=0, description="tokens of the target prefix a draft continues (bad_protocol past it)"
    )
    max_context_tokens: int = Field(
        4096, ge=0, description="tokens of init's history + context_text (bad_protocol past it)"
    )


class UpdateRejected(ValueError):
    """An update that contradicts the session's state (e.g. an utterance id going backwards)."""


class BudgetExceeded(UpdateRejected):
    """An update whose draft would pass a token bound (the message names the bound)."""


class DraftTooLarge(UpdateRejected):
    """A draft whose work could not be bounded within the engine's `max_step_s` (refused before it runs)."""
