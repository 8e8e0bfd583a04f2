"""One speaker's sessions by target language (protocol v1 `target_langs`; one target otherwise).

`Targets` holds one `Session` per target, so each target keeps its own append-only committed
text, cached draft and commit fast path. An update is planned and fitted to the token budget for
every target first (a refusal raises before any draft is made); the drafts the targets need are
made together, in one engine batch (on the server: queued on the engine's scheduler at once), and
each target applies the update with its own draft, narrowed to its own heads by its `HeadRows`
view.
"""

from __future__ import annotations

from alignatt.core.draft import Draft, DraftRequest
from alignatt.serve.pool import HeadRows
from alignatt.serve.session import Session, SourceUpdate, Step


class Targets:
    """Sessions by target language (in the client's order), planned and applied together."""

    def __init__(self, sessions: dict[str, Session]) -> None:
        if not sessions:
            raise ValueError("a session needs at least one target")
        for target, session in sessions.items():
            if not isinstance(session.seam, HeadRows):
                raise ValueError(f"target {target}: its session must draft through a HeadRows view")
        self.sessions = sessions

    @property
    def targets(self) -> list[str]:
        return list(self.sessions)

    def plan(self, update: SourceUpdate) -> list[tuple[str, DraftRequest]]:
        """The drafts `apply` needs, by target (empty: every target answers from its cache)."""
        planned = [(t, s.plan(update)) for t, s in self.sessions.items()]
        return [(t, r) for t, r in planned if r is not None]

    def fit(self, wanted: list[tuple[str, DraftRequest]]) -> list[tuple[str, DraftRequest]]:
        """Every planned request within its session's token budget (it may count tokens: off the
        event loop), all of them before any is queued, so a refusal queues nothing."""
        return [(t, self.sessions[t].fit(r)) for t, r in wanted]

    def apply(self, update: SourceUpdate, drafts: dict[str, Draft]) -> list[tuple[str, Step]]:
        """Every target's step, in target order; `drafts` are the engine's (all heads) by target."""
        steps = []
        for t, s in self.sessions.items():
            draft = drafts.get(t)
            steps.append((t, s.apply(update, None if draft is None else s.seam.select(draft))))
        return steps
