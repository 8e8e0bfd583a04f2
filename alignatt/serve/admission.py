"""Opening a session: what an `init` frame asks for, checked, placed on an engine, and answered.

`admit` resolves the route of every target language (one engine must serve them all), the preset
and the client's overrides, takes a session slot (`busy` past the limit), places the session on
the least loaded live engine of its model (`serve/pool.py`; `busy` past the engine's capacity),
checks the context and history against the character bounds and the engine's token budget, and
opens one `Session` per target (the client's accepted prefix and history seed init's
`target_lang` only). Anything refused is a `ProtocolError` the connection answers with an error
frame; nothing is left held: the slot and the engine's session keys are given back.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from functools import partial
from typing import Any

from alignatt.core.prompt import SOURCE_MARK, ContextConfig, recent_history
from alignatt.serve.config import DirectionRoute, ServerConfig, head_set_name, resolve_heads, resolve_preset
from alignatt.serve.host import ConnectionHost
from alignatt.serve.limits import BudgetExceeded
from alignatt.serve.multi_target import Targets
from alignatt.serve.pool import Engine, route_key
from alignatt.serve.protocol import (
    BAD_PROTOCOL,
    BUSY,
    PROCESSING_FAILED,
    UNSUPPORTED_DIRECTION,
    InitFrame,
    InitOk,
    ProtocolError,
    override_policy_fields,
)
from alignatt.serve.scheduler import SchedulerBusy
from alignatt.serve.session import Session, SessionConfig

log = logging.getLogger(__name__)

# (direction, route) per target language, in the order the client named them.
Routes = dict[str, tuple[str, DirectionRoute]]


@dataclass
class Admitted:
    """An opened session, as the connection keeps it: the engine, the scheduler key and the
    `Session` of every target, the `init_ok` frame and the session log's entry."""

    engine: Engine
    keys: list  # the scheduler's session keys: the connection id, or (id, target) per target
    targets: Targets
    key_of: dict[str, object]  # target -> its scheduler key
    multi: bool  # `target_langs`: every frame names its target
    session: Session  # init's target_lang's
    ok: InitOk
    log_entry: dict[str, Any]


def resolve_routes(config: ServerConfig, frame: InitFrame) -> Routes:
    """(direction, route) per target language; every one must be served, by one engine."""
    targets = frame.targets
    if frame.target_langs is not None and frame.target_lang.strip().lower() not in targets:
        raise ProtocolError(BAD_PROTOCOL, f"target_lang {frame.target_lang!r} is not one of target_langs {targets}")
    routes = {}
    for target in targets:
        direction = f"{frame.source_lang.strip().lower()}-{target}"
        route = config.directions.get(direction)
        if route is None:
            supported = sorted(config.directions)
            raise ProtocolError(
                UNSUPPORTED_DIRECTION,
                f"direction {direction} is not served here; supported: {', '.join(supported)}",
                supported=supported,
            )
        routes[target] = (direction, route)
    if len({route_key(r) for _, r in routes.values()}) > 1:
        raise ProtocolError(BAD_PROTOCOL, f"target_langs {targets} are served by different models; "
                                          "a multi-target session needs one engine for all of them")
    return routes


def bounded_context(cfg: ContextConfig, frame: InitFrame) -> tuple[str, list[tuple[str, str]], int]:
    """The context text and the history turns kept (the newest), or bad_protocol past a bound."""
    context = frame.context_text.strip()
    if len(context) > cfg.max_context_chars:
        raise ProtocolError(BAD_PROTOCOL, f"context_text of {len(context)} characters exceeds the "
                                          f"{cfg.max_context_chars}-character bound")
    for i, pair in enumerate(frame.history):
        longest = max(len(x) for x in pair)
        if longest > cfg.max_history_entry_chars:
            raise ProtocolError(BAD_PROTOCOL, f"history[{i}] has a text of {longest} characters; the "
                                              f"bound is {cfg.max_history_entry_chars}")
    # The prompt builder finds the source by this marker: one in the context or the history
    # would make every draft of the session fail, so it is refused here, before the session.
    if SOURCE_MARK in context or any(SOURCE_MARK in x for pair in frame.history for x in pair):
        raise ProtocolError(BAD_PROTOCOL, f"context_text and history must not contain the prompt builder's "
                                          f"source marker {SOURCE_MARK!r}")
    kept = recent_history([tuple(p) for p in frame.history], cfg)
    return context, kept, len(frame.history) - len(kept)


async def admit(host: ConnectionHost, frame: InitFrame, connection_id: int) -> Admitted:
    """Open the session `frame` asks for, holding one of the host's session slots (given back on
    any failure, cancellation included), or raise the `ProtocolError` that says why not."""
    limits = host.config.limits
    routes = resolve_routes(host.config, frame)
    direction, route = routes[frame.target_lang.strip().lower()]  # the primary target's
    preset = resolve_preset(frame.preset or host.config.default_preset)
    fields, unknown = override_policy_fields(frame.overrides)
    policy = preset.policy.model_copy(update=fields)
    if not host.slots.take(limits.max_sessions):  # one count across the front ends
        raise ProtocolError(BUSY, f"all {limits.max_sessions} sessions are in use; retry later")
    try:
        opened = await _open(host, frame, routes, direction, preset, policy, connection_id)
    except BaseException as e:
        host.slots.give()
        if isinstance(e, ProtocolError):
            raise
        if isinstance(e, BudgetExceeded):
            raise ProtocolError(BAD_PROTOCOL, str(e)) from None
        if isinstance(e, SchedulerBusy):
            raise ProtocolError(BUSY, f"{e}; retry later") from None
        if not isinstance(e, Exception):
            raise
        log.exception("session for %s could not be opened", direction)
        raise ProtocolError(PROCESSING_FAILED, f"cannot open a session for {direction}: {e}") from None
    engine, keys, sessions, described = opened
    target = frame.target_lang.strip().lower()
    session, primary = sessions[target], described[list(routes).index(target)]
    multi = frame.target_langs is not None
    ok = InitOk(
        direction=direction,
        preset=preset.name,
        model=route.model,
        seam=route.seam,
        heads=primary["heads"],
        policy=policy.model_dump(),
        unknown_overrides=unknown,
        ignored_fields=frame.unknown_fields(),
        source_lang=frame.source_lang.strip().lower(),
        target_lang=primary["target_lang"],
        head_set=primary["head_set"],
        session=session.config.model_dump(),
        context_chars=len(session.context_text),
        history_received=len(frame.history),
        history_used=len(session.history),
        history_trimmed=len(frame.history) - len(session.history),
        targets=described if multi else None,
    )
    log_entry = {
        "connection": connection_id,
        **ok.model_dump(include={"direction", "preset", "policy", "unknown_overrides"}),
        "accepted_target_prefix": frame.accepted_target_prefix, "history": len(frame.history),
        "history_trimmed": len(frame.history) - len(session.history),
        "context_chars": len(session.context_text), "targets": list(routes),
    }
    return Admitted(engine, keys, Targets(sessions), dict(zip(sessions, keys)), multi, session, ok, log_entry)


async def _open(host: ConnectionHost, frame: InitFrame, routes: Routes, direction: str, preset, policy,
                connection_id: int) -> tuple[Engine, list, dict[str, Session], list[dict[str, Any]]]:
    """The engine (loaded on first use, the least loaded of the route's), the init's bounds
    checked, and a session per target, with each target's description for `init_ok`."""
    loop = asyncio.get_running_loop()
    primary = frame.target_lang.strip().lower()  # one of `routes` (`resolve_routes` checked it)
    route = routes[primary][1]
    keys = [(connection_id, t) for t in routes] if frame.target_langs is not None else [connection_id]
    source_lang = frame.source_lang.strip().lower()
    # SchedulerBusy past the engine's capacity; every target on the one engine placed
    engine = await _placed(loop.run_in_executor(None, host.registry.place, route, direction, keys), keys)
    try:
        budget = await host.budget_for(engine)
        received = [tuple(p) for p in frame.history]
        if budget is not None:  # tokenizing runs where the engine's tokenizer lives
            await loop.run_in_executor(engine.tokenizing, budget.check_context, received, frame.context_text)
        context, history, _ = bounded_context(host.config.context, frame)
        if budget is not None:  # the whole prompt these will make, with a one-word source
            await loop.run_in_executor(engine.tokenizing, budget.check_init, frame.accepted_target_prefix,
                                       history, context, source_lang, primary)
        config = SessionConfig(policy=policy, max_new_tokens=preset.max_new_tokens, limits=host.config.limits,
                               context=host.config.context, settle_buffer_tokens=host.config.settle_buffer_tokens)
        sessions: dict[str, Session] = {}
        described = []
        for key, (target, (d, r)) in zip(keys, routes.items()):
            view = engine.view(key, resolve_heads(r, d))  # `place` admitted it
            # The client's prefix and history are in its target_lang: they seed that target only.
            seeded = target == primary
            sessions[target] = Session(
                view, config, source_lang=source_lang, target_lang=target,
                accepted_target_prefix=frame.accepted_target_prefix if seeded else "",
                history=history if seeded else [], context_text=context, budget=budget,
            )
            described.append({"target_lang": target, "direction": d, "model": r.model, "seam": r.seam,
                              "head_set": head_set_name(r, d), "heads": [(h.layer, h.head) for h in view.heads]})
    except BaseException:
        for key in keys:
            engine.close_session(key)
        raise
    return engine, keys, sessions, described


async def _placed(placing: asyncio.Future, keys: list) -> Engine:
    """The engine `placing` admitted `keys` to. An init cancelled meanwhile (its connection
    closed) cannot stop the placing thread: what that admits is given back when it ends, so no
    engine keeps a session that no connection owns."""
    try:
        return await asyncio.shield(placing)
    except asyncio.CancelledError:
        placing.add_done_callback(partial(_give_back, keys))
        raise


def _give_back(keys: list, placing: asyncio.Future) -> None:
    if not placing.cancelled() and placing.exception() is None:
        for key in keys:
            placing.result().close_session(key)
