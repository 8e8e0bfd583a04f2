"""The typed messages between the server and an engine in a process of its own (its client,
`alignatt.serve.engine_client`, and its loop, `alignatt.serve.engine_process`): what the server
asks, and what the child answers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from alignatt.core.draft import Draft, DraftRequest


# ---- the messages: requests (server -> child) ----


@dataclass(frozen=True)
class Submit:
    handle: int  # the server's name for the draft (the child maps it to its seam's handle)
    request: DraftRequest
    prepared: Any = None  # the draft's prompt, prepared by the server with the child's preparer


@dataclass(frozen=True)
class Abort:
    handle: int


@dataclass(frozen=True)
class Step:
    """One engine step, after the submits and aborts the server queued since the last one (in order)."""

    work: tuple[Submit | Abort, ...] = ()


@dataclass(frozen=True)
class Count:
    """Tokens of a prompt (`request`) or of a text, with the seam's own counting."""

    request: DraftRequest | None = None
    text: str = ""


@dataclass(frozen=True)
class Describe:
    pass


@dataclass(frozen=True)
class Totals:
    """The seam's verification figures so far (`acceptance_totals`), for the load benchmark."""


@dataclass(frozen=True)
class Ping:
    """Are you there? (sent to an idle child by its engine's watcher)"""


@dataclass(frozen=True)
class Profile:
    """Start profiling the child's thread, to be written to `path`; `None`: stop and write it
    (`alignatt.serve.engine_profile`)."""

    path: str | None


@dataclass(frozen=True)
class KernelProfile:
    """Trace the kernels of the child's next `steps` steps and write their anatomy to `path`
    (`alignatt.serve.engine_profile.KernelWindow`); `None`: drop a window not yet written."""

    path: str | None
    steps: int


@dataclass(frozen=True)
class Close:
    pass


# ---- and their replies (child -> server) ----


@dataclass(frozen=True)
class Ready:
    name: str
    max_batch: int
    pid: int
    counts: bool  # the seam can count tokens
    positions: int | None
    template_tokens: int | None
    preparer: Any = None  # the seam's `preparer` (picklable `prepare`), so the server prepares drafts


@dataclass(frozen=True)
class ChildTotals:
    """The child's own figures, summed over all its steps so far: engine-wide, so with several front
    ends each one reads the same totals, and a step that served them all counts once."""

    steps: int = 0  # engine steps run
    drafts: int = 0  # drafts in the engine at each of them, summed (every front end's)
    wall_s: float = 0.0  # the child's own time in its rounds: submits, aborts and the step
    cpu_s: float = 0.0  # its thread's CPU time in them: the rest of a round trip is the pipe and waits


@dataclass(frozen=True)
class Stepped:
    # finished drafts, and the step's submits the seam refused (their error in place of a draft)
    finished: list[tuple[int, Draft | BaseException]]
    unfinished: bool
    totals: ChildTotals = ChildTotals()
    phases_s: dict[str, float] | None = None  # the seam's own step parts, summed so far (`step_phases_s`)
    gc_s: float = 0.0  # the child's garbage-collector pauses, summed so far (`gc_pauses`)


@dataclass(frozen=True)
class Counted:
    tokens: int


@dataclass(frozen=True)
class Described:
    facts: dict | None


@dataclass(frozen=True)
class Totalled:
    totals: dict | None  # None: the seam does not count them


@dataclass(frozen=True)
class Pong:
    pass


@dataclass(frozen=True)
class Failed:
    error: BaseException


@dataclass(frozen=True)
class Closed:
    pass


@dataclass(frozen=True)
class Profiled:
    path: str | None  # the statistics file written (None: a profile started)
    top: str  # the functions with the most time of their own, as `pstats` prints them
