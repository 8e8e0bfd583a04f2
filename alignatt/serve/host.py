"""What a connection needs from the server that accepted it: its config, counters, engines, records.

`Connection` (alignatt.serve.connection) is written against `ConnectionHost`, a protocol that
`MTServer` (alignatt.serve.server) satisfies, and `ServerStats` is the counters they share. Both
live here, below the two, so the connection never imports the server and the server imports the
connection only to run it.
"""

from __future__ import annotations

import collections
import time
from dataclasses import dataclass, field
from typing import Protocol

from alignatt.serve.budget import PromptBudget
from alignatt.serve.config import ServerConfig
from alignatt.serve.pool import Engine, EngineRegistry
from alignatt.serve.records import ByteBoundedLog


@dataclass
class ServerStats:
    connections: int = 0
    connections_before_init: int = 0  # open connections that have no session yet
    sessions_opened: int = 0
    sessions_active: int = 0
    updates: int = 0
    coalesced: int = 0  # partials dropped because a newer update of the session was queued
    engine_calls: int = 0
    paths: collections.Counter = field(default_factory=collections.Counter)
    errors: collections.Counter = field(default_factory=collections.Counter)
    closes: collections.Counter = field(default_factory=collections.Counter)  # server-side closes by reason

    def as_dict(self) -> dict:
        return {k: dict(v) if isinstance(v, collections.Counter) else v for k, v in vars(self).items()}


class WaitingPeers:
    """Connections without a session yet, per peer address, with when each opened (never in
    `/stats`: addresses stay private). An honest client sends init at once, so only those waiting
    past a grace count against the peer's bound: a burst of honest connections from one host (a
    WhisperLiveKit host reconnecting its sessions) is not refused."""

    GRACE_S = 1.0

    def __init__(self) -> None:
        self.opened: dict[str, dict[int, float]] = {}

    def enter(self, peer: str, connection_id: int) -> None:
        self.opened.setdefault(peer, {})[connection_id] = time.monotonic()

    def leave(self, peer: str, connection_id: int) -> None:
        waiting = self.opened.get(peer, {})
        waiting.pop(connection_id, None)
        if not waiting:
            self.opened.pop(peer, None)

    def silent(self, peer: str) -> int:
        """The peer's connections waiting past the grace."""
        since = time.monotonic() - self.GRACE_S
        return sum(1 for t in self.opened.get(peer, {}).values() if t <= since)


class ConnectionHost(Protocol):
    """The server as its connections see it."""

    config: ServerConfig
    stats: ServerStats
    registry: EngineRegistry
    step_log: ByteBoundedLog
    session_log: ByteBoundedLog
    waiting: WaitingPeers

    async def budget_for(self, engine: Engine) -> PromptBudget | None:
        """The engine's token bounds, built once."""
        ...
