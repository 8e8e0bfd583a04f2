"""What a connection needs from the server that accepted it: its config, counters, engines, records.

`Connection` (alignatt.serve.connection) is written against `ConnectionHost`, a protocol that
`MTServer` (alignatt.serve.server) satisfies, and `ServerStats` is the counters they share. Both
live here, below the two, so the connection never imports the server and the server imports the
connection only to run it.
"""

from __future__ import annotations

import collections
import contextlib
import multiprocessing
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

from alignatt.serve.budget import PromptBudget
from alignatt.serve.config import ServerConfig
from alignatt.serve.pool import Engine, EngineRegistry
from alignatt.serve.records import ByteBoundedLog


class SessionSlots:
    """The open sessions counted against `max_sessions`: one count per front end, in shared memory
    with several (taken and given back under its lock, so that a front end that dies leaves no slot
    taken: `forget`), in this process's memory with one."""

    def __init__(self, shared: Any = None, index: int = 0) -> None:
        self.shared = shared  # a multiprocessing Array("i", front ends), or None: one process counts alone
        self.index = index  # this front end's place in it
        self._counts = [0] if shared is None else shared
        self._lock = contextlib.nullcontext if shared is None else shared.get_lock

    @classmethod
    def for_front_ends(cls, front_ends: int) -> "SessionSlots":
        return cls(multiprocessing.get_context("spawn").Array("i", front_ends) if front_ends > 1 else None)

    @property
    def count(self) -> int:
        """Every front end's sessions."""
        return sum(self._counts[:])

    @property
    def own(self) -> int:
        """This front end's sessions."""
        return self._counts[self.index]

    def take(self, limit: int) -> bool:
        """One slot, if fewer than `limit` are taken."""
        with self._lock():
            if sum(self._counts[:]) >= limit:
                return False
            self._counts[self.index] += 1
            return True

    def give(self) -> None:
        with self._lock():
            self._counts[self.index] -= 1

    def forget(self, index: int) -> int:
        """Drop what front end `index` held (it is gone, and its sessions with it); how many it held."""
        with self._lock():
            held, self._counts[index] = self._counts[index], 0
            return held


@dataclass
class ServerStats:
    connections: int = 0
    connections_before_init: int = 0  # open connections that have no session yet
    sessions_opened: int = 0
    updates: int = 0
    coalesced: int = 0  # partials dropped because a newer update of the session was queued
    engine_calls: int = 0
    paths: collections.Counter = field(default_factory=collections.Counter)
    errors: collections.Counter = field(default_factory=collections.Counter)
    closes: collections.Counter = field(default_factory=collections.Counter)  # server-side closes by reason
    slots: SessionSlots = field(default_factory=SessionSlots, repr=False)  # the server's, which counts them

    @property
    def sessions_active(self) -> int:
        """This process's open sessions: the slots it holds."""
        return self.slots.own

    def as_dict(self) -> dict:
        out = {k: dict(v) if isinstance(v, collections.Counter) else v for k, v in vars(self).items() if k != "slots"}
        return {**out, "sessions_active": self.sessions_active}


class WaitingPeers:
    """Connections without a session yet: each one's peer address, when it opened, and how to close
    it (never in `/stats`: addresses stay private).

    When a bound is reached (the peer's, or the server's), the connection that has waited longest,
    if it has waited past a grace, makes room: it is closed, and the newcomer is let in. An honest
    client sends init at once, so it is never the one that has waited longest: sockets held idle,
    from one address or many, displace each other, never an honest client, and one address cannot
    hold more than its bound. Only when every waiting connection is within the grace (a burst) is a
    newcomer refused."""

    GRACE_S = 1.0

    def __init__(self) -> None:
        # connection id -> (peer, opened at, close it); in the order they opened, oldest first
        self.opened: dict[int, tuple[str, float, Callable[[], None]]] = {}

    def count(self, peer: str | None = None) -> int:
        """The peer's waiting connections (None: everyone's)."""
        return len(self.opened) if peer is None else sum(1 for p, _, _ in self.opened.values() if p == peer)

    def _oldest_past_grace(self, peer: str | None = None) -> int | None:
        since = time.monotonic() - self.GRACE_S
        for cid, (p, opened, _) in self.opened.items():
            if opened > since:
                return None  # the rest opened later still
            if peer is None or p == peer:
                return cid
        return None

    def room_for(self, peer: str | None, per_peer: int, total: int) -> bool:
        """Whether a new connection from `peer` (None: any peer) would be let in now."""
        peer_full = peer is not None and self.count(peer) >= per_peer
        if peer_full and self._oldest_past_grace(peer) is None:
            return False
        return self.count() - peer_full < total or self._oldest_past_grace() is not None

    def enter(self, peer: str, connection_id: int, close: Callable[[], None], per_peer: int, total: int) -> bool:
        """Let a new connection in, closing the longest-waiting one past the grace where a bound is
        reached (`close` is how this one is closed in its turn); False: no room, refuse it."""
        if self.count(peer) >= per_peer and not self._make_room(peer):
            return False
        if self.count() >= total and not self._make_room(None):
            return False
        self.opened[connection_id] = (peer, time.monotonic(), close)
        return True

    def _make_room(self, peer: str | None) -> bool:
        oldest = self._oldest_past_grace(peer)
        if oldest is None:
            return False
        _, _, close = self.opened.pop(oldest)
        close()
        return True

    def leave(self, connection_id: int) -> None:
        self.opened.pop(connection_id, None)


class ConnectionHost(Protocol):
    """The server as its connections see it."""

    config: ServerConfig
    stats: ServerStats  # this process's: sessions_active counts its own sessions
    slots: SessionSlots  # the sessions counted against max_sessions (one count across front ends)
    registry: EngineRegistry
    step_log: ByteBoundedLog
    session_log: ByteBoundedLog
    waiting: WaitingPeers
    draining: bool  # SIGTERM: sessions are handed over between utterances

    async def budget_for(self, engine: Engine) -> PromptBudget | None:
        """The engine's token bounds, built once."""
        ...
