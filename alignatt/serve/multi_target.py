"""One speaker translated into several target languages at once (protocol v1 `target_langs`).

A `MultiTargetSession` holds one `Session` per target, so each target keeps its own append-only
committed text, cached draft and commit fast path. An update is applied to every target; the
targets that need the engine have their drafts made together first, in one engine batch
(`Engine.draft_many`: one vLLM batch, or one after another on seams that do not batch), and each
session then takes its own draft from its seam view instead of calling the engine itself.
"""

from __future__ import annotations

from typing import Protocol, Sequence

from alignatt.core.draft import Draft, DraftRequest
from alignatt.serve.pool import HeadRows
from alignatt.serve.session import Session, Step


class BatchEngine(Protocol):
    def draft_many(self, requests: Sequence[DraftRequest]) -> list[Draft]: ...


class MultiTargetSession:
    """Sessions by target language (in the client's order), updated together."""

    def __init__(self, sessions: dict[str, Session], engines: dict[str, BatchEngine]) -> None:
        if not sessions or set(sessions) != set(engines):
            raise ValueError("every target needs a session and an engine")
        for target, session in sessions.items():
            if not isinstance(session.seam, HeadRows):
                raise ValueError(f"target {target}: its session must draft through a HeadRows view")
        self.sessions = sessions
        self.engines = engines
        self.batches: list[int] = []  # drafts per engine batch, for tests and logs

    @property
    def targets(self) -> list[str]:
        return list(self.sessions)

    def needs_engine(self, committed_words: list[str], tail_words: list[str], is_final: bool,
                     utterance_id: int | None = None) -> bool:
        return any(s.needs_engine(committed_words, tail_words, is_final, utterance_id)
                   for s in self.sessions.values())

    def update(self, committed_words: list[str], tail_words: list[str], is_final: bool,
               utterance_id: int | None = None) -> list[tuple[str, Step]]:
        """Apply one update to every target; returns (target_lang, step) in target order."""
        args = (committed_words, tail_words, is_final, utterance_id)
        planned = {t: s.planned_request(*args) for t, s in self.sessions.items()}
        # One batch per engine (targets of one model share an engine).
        by_engine: dict[int, list[str]] = {}
        for t, request in planned.items():
            if request is not None:
                by_engine.setdefault(id(self.engines[t]), []).append(t)
        for targets in by_engine.values():
            engine = self.engines[targets[0]]
            drafts = engine.draft_many([planned[t] for t in targets])
            self.batches.append(len(targets))
            for t, draft in zip(targets, drafts):
                view: HeadRows = self.sessions[t].seam
                view.prefetched.append((planned[t], view.select(draft)))
        try:
            return [(t, s.update(*args)) for t, s in self.sessions.items()]
        finally:
            for s in self.sessions.values():  # an update that failed leaves nothing behind
                s.seam.prefetched.clear()
