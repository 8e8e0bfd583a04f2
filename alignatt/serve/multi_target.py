"""One speaker translated into several target languages at once (protocol v1 `target_langs`).

A `MultiTargetSession` holds one `Session` per target, so each target keeps its own append-only
committed text, cached draft and commit fast path. An update is applied to every target; the
targets that need the engine have their drafts made together first, in one engine batch
(`Engine.draft_many`: one vLLM batch, or one after another on seams that do not batch), and each
session then takes its own draft from its seam view instead of calling the engine itself.
On the server the batch is the engine's scheduler: the targets' requests are queued at once
(`Engine.draft_together`), so they run in one engine batch.
"""

from __future__ import annotations

from typing import Callable, Sequence

from alignatt.core.draft import Draft, DraftRequest
from alignatt.serve.pool import HeadRows
from alignatt.serve.session import Session, Step


# (target, request) pairs and whether they are finals -> one draft per pair, made together.
DraftTogether = Callable[[Sequence[tuple[str, DraftRequest]], bool], list[Draft]]


class MultiTargetSession:
    """Sessions by target language (in the client's order), updated together."""

    def __init__(self, sessions: dict[str, Session], draft_together: DraftTogether) -> None:
        if not sessions:
            raise ValueError("a multi-target session needs at least one target")
        for target, session in sessions.items():
            if not isinstance(session.seam, HeadRows):
                raise ValueError(f"target {target}: its session must draft through a HeadRows view")
        self.sessions = sessions
        self.draft_together = draft_together
        self.batches: list[int] = []  # drafts per engine batch, for tests and logs

    @property
    def targets(self) -> list[str]:
        return list(self.sessions)

    def needs_engine(self, committed_words: list[str], tail_words: list[str], is_final: bool,
                     utterance_id: int | None = None) -> bool:
        """Whether any target drafts; every target is asked, so a refused update raises here."""
        wanted = [s.needs_engine(committed_words, tail_words, is_final, utterance_id) for s in self.sessions.values()]
        return any(wanted)

    def update(self, committed_words: list[str], tail_words: list[str], is_final: bool,
               utterance_id: int | None = None) -> list[tuple[str, Step]]:
        """Apply one update to every target; returns (target_lang, step) in target order."""
        args = (committed_words, tail_words, is_final, utterance_id)
        # Every target's request first: an update a session refuses (an utterance id going back, a
        # token bound) raises here, before any target's draft is made.
        planned = {t: s.planned_request(*args) for t, s in self.sessions.items()}
        wanted = [(t, r) for t, r in planned.items() if r is not None]
        if wanted:
            drafts = self.draft_together(wanted, bool(is_final))
            self.batches.append(len(wanted))
            for (t, request), draft in zip(wanted, drafts):
                view: HeadRows = self.sessions[t].seam
                view.prefetched.append((request, view.select(draft)))
        try:
            return [(t, s.update(*args)) for t, s in self.sessions.items()]
        finally:
            for s in self.sessions.values():  # an update that failed leaves nothing behind
                s.seam.prefetched.clear()
