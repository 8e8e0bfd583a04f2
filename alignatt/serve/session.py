"""One streaming translation session: committed source, unstable tail, append-only target.

A session follows one speaker's utterances. It is a state machine with no engine inside:
`plan(update)` says which draft, if any, the update needs (a `DraftRequest`, finality carried in
it; None when a cached path answers), and `apply(update, draft)` applies the update with that
draft and returns a `Step`: the accepted target text so far, what changed, and how it was
obtained. Whoever holds the engine makes the draft in between (the server awaits its scheduler's
future; `update` drafts through the session's own seam, for offline use). Every update carries
the full state of the open utterance (all committed source words, plus the unstable ASR tail).

- `fast_path`: the source text (committed + tail, in order) is the one the cached draft was made
  for and only the commit frontier moved; the policy re-judges the cached rows at the new frontier
  and releases held tokens. No engine call.
- `unchanged`: nothing moved since the last step; the last answer stands. No engine call.
- `draft`: a new draft over all known source words, continuing the committed target, judged by the
  AlignAtt policy. One engine call.
- `final` / `final_cached`: the utterance's complete translation, continuing the committed target
  and bounded by the utterance's own words (the tail is not used, later sentences never leak in);
  `final_cached` reuses a cached draft that already ended on EOS over exactly these words.

`committed_text` never shrinks or changes within an utterance (0 retractions): text is only ever
appended. `engine_calls` counts every draft applied, so the zero-call paths are provable. The
session holds its last applied draft, which it proposes for the next draft to verify.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict, Field

from alignatt.core.draft import Draft, DraftProposal, DraftRequest, Seam
from alignatt.core.policy import (
    AFTER_STOP, CONTEXT_LEAK, SOURCE_FRONTIER, UNSTABLE_TAIL, PolicyConfig, PolicyResult, decide,
)
from alignatt.core.prompt import ContextConfig, recent_history
from alignatt.core.settle import cut, passes_end, rule_for
from alignatt.serve.budget import PromptBudget
from alignatt.serve.limits import BudgetExceeded, SessionLimits, UpdateRejected  # noqa: F401 - their home is limits

# Step.path values.
FAST_PATH = "fast_path"
UNCHANGED = "unchanged"
DRAFT = "draft"
FINAL = "final"
FINAL_CACHED = "final_cached"
EMPTY = "empty"

_ATTENTION_STOPS = (UNSTABLE_TAIL, SOURCE_FRONTIER, AFTER_STOP, CONTEXT_LEAK)


class SessionConfig(BaseModel):
    """How a session drafts and when it forces an utterance to close."""

    model_config = ConfigDict(extra="forbid")

    policy: PolicyConfig = Field(default_factory=PolicyConfig)
    max_new_tokens: int = Field(16, ge=1, description="tokens per partial draft")
    final_tokens_per_word: float = Field(3.0, gt=0, description="final budget per uncovered word")
    final_extra_tokens: int = Field(8, ge=1)
    final_max_new_tokens: int = Field(256, ge=1)
    limits: SessionLimits = Field(default_factory=SessionLimits)
    context: ContextConfig = Field(default_factory=ContextConfig, description="context/history in the prompt")
    verify_drafts: bool = Field(
        True, description="propose the last draft's unaccepted tokens for the seam to verify (verify, then extend)"
    )
    settle_buffer_tokens: int | None = Field(
        None, ge=0, description="stop a partial draft once the policy's answer is known, this many tokens past its "
                                "first held token (the client's buffer); None: draft max_new_tokens (core/settle.py)")


# Characters never emitted: C0/C1 controls (category Cc) other than newline, and the bidi
# embedding/override/isolate controls, which could reorder or hide text on the client's screen.
_UNSAFE_CHARS = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def emitted_text(text: str) -> str:
    """`text` without the characters the server never emits (a per-character filter, so the
    filtered concatenation is the concatenation of the filtered parts: append-only holds)."""
    return _UNSAFE_CHARS.sub("", text)


@dataclass(frozen=True)
class SourceUpdate:
    """One client update: the open utterance's whole state (protocol v1's `update` frame)."""

    committed_words: tuple[str, ...]
    tail_words: tuple[str, ...] = ()
    is_final: bool = False
    utterance_id: int | None = None

    @classmethod
    def of(cls, committed_words, tail_words=(), is_final: bool = False,
           utterance_id: int | None = None) -> "SourceUpdate":
        return cls(tuple(committed_words), tuple(tail_words), bool(is_final), utterance_id)


@dataclass
class Step:
    utterance_id: int
    final: bool
    forced_final: bool
    committed_text: str  # the utterance's accepted target so far (append-only)
    committed_delta: str  # what this step appended
    buffer_text: str  # drafted but held (speculative) target text
    covered_source_units: int  # source words the accepted target covers
    stop_reason: str | None
    path: str
    engine_calls: int  # drafts this step applied (0 on fast_path / unchanged)
    elapsed_ms: float  # from `plan` to the end of `apply`: the draft's making included
    policy: PolicyResult | None = None
    source_rewritten: bool = False  # committed words contradicted earlier committed words
    ignored_tail_words: int = 0


@dataclass
class _Utterance:
    utterance_id: int | None = None  # None until the first update names it
    committed_words: list[str] = field(default_factory=list)
    tail_words: list[str] = field(default_factory=list)
    committed_text: str = ""
    covered_source_units: int = 0
    # The cached draft and how much of it is already in committed_text.
    draft: Draft | None = None
    draft_emitted: int = 0  # tokens [0, draft_emitted) of the draft are committed
    draft_stale: bool = False  # the draft was used up and may not cover the whole source
    result: PolicyResult | None = None


def _clean(words: list[str]) -> list[str]:
    return [w.strip() for w in words if w and w.strip()]


# A sentence end: terminal punctuation (optionally closed by quotes/brackets) before space or end.
# CJK full stops end a sentence without a following space (zh/ja put none).
_SENTENCE_END = re.compile(r"[.!?。！？…]+[\"'»«”’)\]]*(?=\s|$)|[。！？]+[”’」』）]*")
# Tokens ending in a period that do not end a sentence (German and English abbreviations, initials).
_ABBREVIATION = re.compile(
    r"(?:^|\s)(?:[A-Za-zÄÖÜäöü]|z\.\s?B|d\.\s?h|u\.\s?a|bzw|usw|ca|vgl|Nr|Dr|Prof|St|etc|e\.g|i\.e|vs)\.$"
)


def count_sentence_ends(text: str) -> int:
    return sum(1 for m in _SENTENCE_END.finditer(text) if not _ABBREVIATION.search(text[: m.end()]))


def bound_to_source(committed: str, continuation: str, source_words: list[str]) -> str:
    """Cut a final's continuation so the utterance's target has no more sentences than its source.

    The continuation ends at its first line break (a model that goes on writes a new line), and
    when the source ends a sentence, right after the target sentence end that matches the source's
    count: whatever follows would translate words that are not in this utterance. `committed` is
    never cut (it is already on screen).
    """
    continuation = continuation.split("\n", 1)[0]
    source = " ".join(source_words)
    wanted = count_sentence_ends(source)
    if wanted == 0 or not _SENTENCE_END.search(source.rstrip() + " "):
        return continuation.rstrip()
    text = committed + continuation
    seen = 0
    for m in _SENTENCE_END.finditer(text):
        if _ABBREVIATION.search(text[: m.end()]):
            continue
        seen += 1
        if seen >= wanted and m.end() > len(committed):
            return text[len(committed) : m.end()]
    return continuation.rstrip()


class Session:
    """Streaming state of one client connection (one source→target direction)."""

    def __init__(
        self,
        seam: Seam,
        config: SessionConfig | None = None,
        source_lang: str = "en",
        target_lang: str = "de",
        accepted_target_prefix: str = "",
        history: list[tuple[str, str]] | None = None,
        context_text: str = "",
        budget: PromptBudget | None = None,
    ) -> None:
        self.seam = seam
        self.config = config or SessionConfig()
        self.source_lang = source_lang
        self.target_lang = target_lang
        # Both reach the prompt (outside the source region); the prompt gets the turns
        # `context` keeps (`recent_history`), which is what a reconnecting client sends back.
        self.history: list[tuple[str, str]] = [tuple(p) for p in history or []]
        self.context_text = context_text
        self.budget = budget  # counts prompt tokens; None: no token bounds (tests, offline use)
        self.engine_calls = 0
        self.fast_path_releases = 0  # fast-path steps that appended text
        self.source_rewrites = 0
        self.steps = 0
        self._open = _Utterance(committed_text=emitted_text(accepted_target_prefix).lstrip())
        self._planned: tuple[SourceUpdate | None, float] = (None, 0.0)  # the update `plan` saw last, and when

    # ---- read-only views ----

    @property
    def utterance_id(self) -> int | None:
        return self._open.utterance_id

    @property
    def committed_text(self) -> str:
        return self._open.committed_text

    @property
    def last_draft(self) -> Draft | None:
        return self._open.draft

    @property
    def last_result(self) -> PolicyResult | None:
        return self._open.result

    # ---- the decision ----

    def _normalise(self, update: SourceUpdate) -> tuple[list[str], list[str], int]:
        words = _clean(update.committed_words)
        tail = [] if update.is_final else _clean(update.tail_words)
        max_tail = self.config.limits.max_tail_words
        ignored = max(len(tail) - max_tail, 0)
        return words, tail[:max_tail], ignored

    def _cached_path(self, words: list[str], tail: list[str], is_final: bool) -> str | None:
        """Which zero-engine-call path answers this update, or None when a draft is needed."""
        u = self._open
        if not words and not tail:
            return EMPTY
        d = u.draft
        if d is None or d.request.source_words != words + tail:
            return None
        if is_final:
            # The cached draft translated exactly this utterance and ended by itself.
            done = not tail and d.stop_reason == "eos" and not u.draft_stale
            return FINAL_CACHED if done else None
        if len(words) > self.config.limits.max_utterance_words:
            return None  # forced final
        if u.draft_stale:
            return None
        frontier = u.result.committed_words if u.result else d.request.committed_words
        if len(words) == frontier:
            return UNCHANGED
        if len(words) > frontier and not passes_end(d, len(words)):
            return FAST_PATH  # (a settled draft re-judged past its end would release less: draft again)
        return None

    def plan(self, update: SourceUpdate) -> DraftRequest | None:
        """The draft `apply(update, ...)` needs (None: a cached path answers, no engine call), not
        yet fitted to the token budget: `fit` does that, off the event loop (it may count tokens).

        Changes nothing but the clock `apply` measures from. An update `apply` would refuse raises
        here, before any draft is made: `UpdateRejected` (an utterance id going back)."""
        self._planned = (update, time.perf_counter())
        self._check_order(update.utterance_id)
        u = self._open
        fresh = update.utterance_id is not None and u.utterance_id not in (None, update.utterance_id)
        words, tail, _ = self._normalise(update)
        if fresh:
            if not words and not tail:
                return None
        elif self._cached_path(words, tail, update.is_final) is not None:
            return None
        committed_text = "" if fresh else u.committed_text
        covered = 0 if fresh else u.covered_source_units
        history = self.history
        if fresh and (u.committed_words or u.committed_text):  # `apply` closes the open one first
            history = history + [(" ".join(u.committed_words), u.committed_text)]
        proposal = None if fresh else self._proposal(committed_text)
        if update.is_final or len(words) > self.config.limits.max_utterance_words:
            return self._request(words, len(words), committed_text, self._final_budget(len(words), covered),
                                 history, proposal, final=True)
        return self._request(words + tail, len(words), committed_text, self.config.max_new_tokens, history,
                             proposal, final=False)

    def apply(self, update: SourceUpdate, draft: Draft | None = None) -> Step:
        """Apply one update with the draft of `plan(update)`'s request (None when it planned none)."""
        planned, at = self._planned
        started = at if planned is update else time.perf_counter()
        self._planned = (None, 0.0)
        self._check_order(update.utterance_id)
        self._enter_utterance(update.utterance_id)
        u = self._open
        words, tail, ignored = self._normalise(update)
        is_final = update.is_final
        rewritten = words[: len(u.committed_words)] != u.committed_words[: len(words)] or (
            len(words) < len(u.committed_words)
        )
        forced = not is_final and len(words) > self.config.limits.max_utterance_words
        path = self._cached_path(words, tail, is_final)
        if path is None:
            expected = words if is_final or forced else words + tail
            if draft is None or draft.request.source_words != expected:
                raise ValueError("apply needs the draft of plan's request for this update "
                                 f"(source {expected!r}, got {None if draft is None else draft.request.source_words!r})")
            self.engine_calls += 1
        elif draft is not None:
            raise ValueError(f"this update is answered by the {path} path: it takes no draft")
        calls = 1 if path is None else 0

        before = u.committed_text
        if is_final or forced:
            if path == FINAL_CACHED:
                continuation = emitted_text("".join(t.piece for t in u.draft.tokens[u.draft_emitted :]))
                result = u.result
            elif words:
                result = decide(draft, len(words), self.config.policy, final=True)
                continuation = emitted_text(result.emitted_text)
                path = FINAL
            else:
                result, continuation, path = None, "", EMPTY
            delta = bound_to_source(u.committed_text, continuation, words) if words else ""
            stop = result.stop_reason if result else None
            step = self._step(u, before, delta, "", len(words), stop, path, calls, started, result,
                              final=True, forced=forced)
            self._remember(" ".join(words), u.committed_text + delta)
            self._open = _Utterance(utterance_id=(u.utterance_id or 0) + 1)
            return self._finish(step, rewritten, ignored)

        if path == EMPTY:
            u.committed_words, u.tail_words = words, tail
            step = self._step(u, before, "", "", u.covered_source_units, None, EMPTY, calls, started, None)
            return self._finish(step, rewritten, ignored)
        if path == UNCHANGED:
            r = u.result
            step = self._step(u, before, "", r.held_text if r else "", u.covered_source_units,
                              r.stop_reason if r else None, UNCHANGED, calls, started, r)
            return self._finish(step, rewritten, ignored)
        if path == FAST_PATH:
            result = decide(u.draft, len(words), self.config.policy)
            delta = self._release(u, result)
            if delta:
                self.fast_path_releases += 1
        else:
            draft = cut(draft)  # a seam that drafted past the settled answer: the same draft as one that stopped
            result = decide(draft, len(words), self.config.policy)
            u.draft, u.draft_emitted, u.draft_stale = draft, 0, False
            delta = self._release(u, result)
            path = DRAFT
        u.committed_words, u.tail_words, u.result = words, tail, result
        # A draft cut by max_new_tokens whose every token passed the attention scan is used up:
        # only its unfinished last word is held, so the next update drafts again (continuing the
        # longer committed text) instead of re-judging it. Only if it released something, else
        # a new draft would be the same one.
        scan_passed = not any(d.reason in _ATTENTION_STOPS for d in result.decisions)
        if u.draft.stop_reason != "eos" and scan_passed and u.draft_emitted > 0:
            u.draft_stale = True
        held = emitted_text("".join(t.piece for t in u.draft.tokens[u.draft_emitted :]))
        step = self._step(u, before, delta, held, u.covered_source_units, result.stop_reason,
                          path, calls, started, result)
        return self._finish(step, rewritten, ignored)

    def update(self, committed_words: list[str], tail_words: list[str], is_final: bool,
               utterance_id: int | None = None) -> Step:
        """`plan`, the draft through this session's own seam, `apply`: the offline way. Raises the
        engine's exception with the state unchanged."""
        update = SourceUpdate.of(committed_words, tail_words, is_final, utterance_id)
        request = self.plan(update)
        return self.apply(update, None if request is None else self.seam.draft(self.fit(request)))

    def fit(self, request: DraftRequest) -> DraftRequest:
        """`request` within the token budget (`PromptBudget.fit`): as planned, or without its oldest
        history turns; else `BudgetExceeded`, naming the bound. It may count the prompt's tokens
        exactly, in an engine process over its pipe: never call it on the event loop."""
        return request if self.budget is None else self.budget.fit(request)

    # ---- internals ----

    def _remember(self, source: str, target: str) -> None:
        """Record a closed utterance; only the turns a prompt can use are kept."""
        self.history = recent_history(self.history + [(source, target)], self.config.context) or \
            [(source, target)]

    def _check_order(self, utterance_id: int | None) -> None:
        open_id = self._open.utterance_id
        if utterance_id is not None and open_id is not None and utterance_id < open_id:
            raise UpdateRejected(f"utterance_id {utterance_id} is behind the open utterance {open_id}")

    def _enter_utterance(self, utterance_id: int | None) -> None:
        u = self._open
        if utterance_id is None or u.utterance_id == utterance_id:
            return
        if u.utterance_id is None:
            u.utterance_id = utterance_id  # first update (a reconnect resumes the client's count)
            return
        self._check_order(utterance_id)
        # The client moved on without a final: keep what was shown, open the new utterance.
        if u.committed_words or u.committed_text:
            self._remember(" ".join(u.committed_words), u.committed_text)
        self._open = _Utterance(utterance_id=utterance_id)

    def _proposal(self, prefix: str) -> DraftProposal | None:
        """The open utterance's last draft beyond its accepted tokens, for the seam to verify.

        None when there is nothing to reuse: verification is off, no draft yet (a new utterance,
        or the one after a final), the draft is wholly accepted, or the accepted text is not the
        draft's own prefix plus its accepted pieces (the character filter or the first emission's
        lstrip changed it: the prompt then continues other text). A superseded or aborted draft
        never reached the session, so the last applied draft stays the proposal. The source and
        context may have changed since: the seam keeps a proposed token only where the model
        picks it on the new prompt, so the proposal is only ever a guess.
        """
        u, d = self._open, self._open.draft
        if not self.config.verify_drafts or d is None:
            return None
        rest = tuple(t.token_id for t in d.tokens[u.draft_emitted :])
        continued = d.request.target_prefix + "".join(t.piece for t in d.tokens[: u.draft_emitted])
        if not rest or continued != prefix:
            return None
        return DraftProposal(token_ids=rest, target_prefix=prefix)

    def _request(self, source: list[str], committed: int, prefix: str, max_new: int,
                 history: list[tuple[str, str]], proposal: DraftProposal | None, final: bool) -> DraftRequest:
        return DraftRequest(
            source_words=source,
            committed_words=committed,
            target_prefix=prefix,
            max_new_tokens=max_new,
            source_lang=self.source_lang,
            target_lang=self.target_lang,
            context_text=self.context_text,
            history=recent_history(history, self.config.context),
            proposal=proposal,
            final=final,
            settle=None if final else rule_for(self.config.policy, self.config.settle_buffer_tokens),
        )

    def _final_budget(self, n_words: int, covered: int) -> int:
        # The committed text already covers part of the source: budget only the rest, so a final
        # stays about as quick as a partial (clients time out on slow ones).
        cfg = self.config
        uncovered = max(n_words - covered, 1)
        return min(cfg.final_max_new_tokens, int(cfg.final_tokens_per_word * uncovered) + cfg.final_extra_tokens)

    def _release(self, u: _Utterance, result: PolicyResult) -> str:
        """Append the newly accepted draft tokens; never takes anything back."""
        if result.emit_count <= u.draft_emitted:
            return ""
        new = u.draft.tokens[u.draft_emitted : result.emit_count]
        delta = emitted_text("".join(t.piece for t in new))
        if not u.committed_text:
            delta = delta.lstrip()
        u.committed_text += delta
        covered = [d.aligned_word + 1 for d in result.decisions[: result.emit_count]]
        u.covered_source_units = max([u.covered_source_units, *covered])
        u.draft_emitted = result.emit_count
        return delta

    def _step(self, u, before, delta, held, covered, stop, path, calls, started, result,
              final=False, forced=False) -> Step:
        if final:
            if not before:
                delta = delta.lstrip()
            committed = before + delta
        else:
            committed = u.committed_text
            delta = committed[len(before) :]
        assert committed.startswith(before), "append-only violated"  # structurally impossible
        return Step(
            utterance_id=u.utterance_id if u.utterance_id is not None else 0,
            final=final,
            forced_final=forced,
            committed_text=committed,
            committed_delta=delta,
            buffer_text=held,
            covered_source_units=covered,
            stop_reason=stop,
            path=path,
            engine_calls=calls,
            elapsed_ms=(time.perf_counter() - started) * 1000.0,
            policy=result,
        )

    def _finish(self, step: Step, rewritten: bool, ignored: int) -> Step:
        self.steps += 1
        if rewritten:
            self.source_rewrites += 1
        step.source_rewritten = rewritten
        step.ignored_tail_words = ignored
        return step
