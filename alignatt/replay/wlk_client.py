"""The WhisperLiveKit client (`whisperlivekit.translation_alignatt`), loaded unmodified.

WhisperLiveKit's package `__init__` imports its whole audio/ASR stack (faster-whisper, fastapi,
torchaudio...), but the alignatt client module needs only `websockets` and the package's
`timed_objects` dataclasses. Installed with `pip install --no-deps whisperlivekit==0.2.26`, the
two modules are imported from the package's own files, unchanged, without running `__init__`.

`replay_wlk` drives that client the way WhisperLiveKit's translation loop does (committed tokens,
then the tail snapshot; its own pacing decides what is sent).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import time
import types
from typing import Any, Callable

from alignatt.core.errors import AlignattError
from alignatt.record.events import ReplayEvent
from alignatt.replay.events import RunRecord
from alignatt.replay.stream import SmokeStream, asr_events

WLK_VERSION = "0.2.26"
WLK_INSTALL_HINT = f"pip install --no-deps whisperlivekit=={WLK_VERSION}"


def load_wlk_client() -> types.ModuleType:
    """`whisperlivekit.translation_alignatt` without running the package's `__init__`.

    The package's `__init__` imports its audio/ASR stack (numpy audio processing, faster-whisper,
    fastapi...); the client module itself needs only `websockets` and the package's
    dataclasses. So when the package is installed (`pip install --no-deps whisperlivekit`) but
    not importable as a whole, register a bare package object for its directory and import just
    the two modules from their files, unchanged.
    """
    if "whisperlivekit.translation_alignatt" in sys.modules:
        return sys.modules["whisperlivekit.translation_alignatt"]
    spec = importlib.util.find_spec("whisperlivekit")
    if spec is None or not spec.submodule_search_locations:
        raise AlignattError(f"the WhisperLiveKit client is not installed: {WLK_INSTALL_HINT}")
    if "whisperlivekit" not in sys.modules:
        package = types.ModuleType("whisperlivekit")
        package.__path__ = list(spec.submodule_search_locations)
        package.__spec__ = spec
        package.__file__ = spec.origin
        sys.modules["whisperlivekit"] = package
    try:
        return importlib.import_module("whisperlivekit.translation_alignatt")
    except ImportError as e:  # another release without the module, or `websockets` missing
        raise AlignattError(f"the WhisperLiveKit client cannot be imported ({e}): {WLK_INSTALL_HINT}") from None


def wlk_version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("whisperlivekit")
    except PackageNotFoundError:
        return None


def wlk_available() -> bool:
    try:
        load_wlk_client()
        return True
    except Exception:
        return False


def replay_wlk(url: str, stream: SmokeStream, speed: float, preset: str, latency: str,
               server_log: Callable[[], list[dict]]) -> RunRecord:
    """Drive `AlignAttTranslationClient` the way WhisperLiveKit's translation loop does.

    Due events are batched (the loop drains its queue), committed tokens are inserted before the
    tail snapshot, and `process()` runs once per batch; the client decides what it sends.
    `server_log()` returns the server's step records of this client's connection.
    """
    wlk = load_wlk_client()
    timed = importlib.import_module("whisperlivekit.timed_objects")
    engine = wlk.AlignAttRemoteEngine(url=url, source_language="en", preset=preset, latency=latency)
    client = engine.new_session("de")
    words = stream.words
    per_word = 1.0 / stream.words_per_second
    pending = asr_events(stream)
    records: list[dict[str, Any]] = []
    committed = arrived = 0
    max_lag = 0.0
    start = time.perf_counter()

    disconnects: list[ReplayEvent] = []

    def process(stream_s: float, lag: float) -> None:
        seq_before = client._seq  # read-only peeks: which updates this call sent, and whether
        was_up = client._ws is not None  # the client dropped its connection (it then retries)
        began = time.perf_counter()
        segment, buffer = client.process()
        took = (time.perf_counter() - began) * 1000.0
        if not client._connected_once:
            raise AlignattError("the WhisperLiveKit client could not open a session (see the log)")
        if was_up and client._ws is None:
            # e.g. a reply slower than the client's 15 s call timeout; it reconnects with its
            # accepted text as accepted_target_prefix, which the artifact then shows.
            disconnects.append(ReplayEvent(client="wlk", event="disconnect", stream_s=round(stream_s, 3),
                                           after_ms=round(took, 3)))
        records.append({
            "client": "wlk", "stream_s": round(stream_s, 3), "lag_s": round(lag, 3),
            "sent_seqs": list(range(seq_before + 1, client._seq + 1)),
            "process_ms": round(took, 3), "segment": segment.text if segment else None,
            "buffer": buffer.text or "",
        })

    i = 0
    while i < len(pending):
        due = start + pending[i].t / speed
        now = time.perf_counter()
        if now < due:
            time.sleep(due - now)
        lag = max(time.perf_counter() - due, 0.0)
        max_lag = max(max_lag, lag)
        horizon = (time.perf_counter() - start) * speed
        items: list[Any] = []
        while i < len(pending) and pending[i].t <= horizon:
            ev = pending[i]
            if ev.kind == "arrive":
                arrived = ev.index + 1
            else:
                committed = ev.index + 1
                t0 = ev.index * per_word
                items.append(timed.ASRToken(start=t0, end=t0 + per_word, text=" " + words[ev.index]))
            i += 1
        tail = " ".join(words[committed:arrived])
        if tail:
            items.append(timed.HypothesisTail(start=None, end=horizon, text=tail))
        client.insert_tokens(items)
        process(horizon, lag)
    # Remaining finals go one per process() call, like WhisperLiveKit; a client that dropped its
    # connection gets its backoff time to come back (bounded).
    deadline = time.monotonic() + 120.0
    while client._pending_finals and time.monotonic() < deadline:
        if client._ws is None:
            time.sleep(max(client._retry_at - time.monotonic(), 0.0) + 0.05)
        process(horizon, 0.0)
    wall = time.perf_counter() - start
    if client._ws is not None:
        client._ws.close()

    steps = {s["seq"]: s for s in server_log()}
    events: list[ReplayEvent] = []
    for r in records:
        for seq in r["sent_seqs"]:
            s = steps.get(seq)
            if s is None:
                continue  # coalesced or failed: the client reads on to a newer seq
            events.append(ReplayEvent(**{"client": "wlk", "stream_s": r["stream_s"], "lag_s": r["lag_s"],
                                         "process_ms": r["process_ms"], "segment": r["segment"],
                                         "buffer": r["buffer"], **s}))
    events += disconnects
    if client._pending_finals:
        events.append(ReplayEvent(client="wlk", event="unsent_finals", count=len(client._pending_finals)))
    return RunRecord("wlk", events, wall, max_lag)
