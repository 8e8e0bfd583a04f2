"""The one protocol-v1 client: the frames a client sends, and the loop that waits for a reply.

Frames are built here and checked against the server's own models (`serve/protocol.py`'s
`InitFrame` and `UpdateFrame`), so a replay never drifts from what the server parses. Words go
out as WhisperLiveKit sends them, `[word, null, null]`. Every driver that talks to a server
(lockstep, real time, the failover speaker, eval's WebSocket driver, the soak's well-formed
sessions, the tests) sends through these builders; the soak's hostile cases and the protocol
fuzzers send raw text on purpose, through `ProtocolClient.send`.

A reply answers update `seq` when it is a `translation` at or past `seq` (the server answers the
newest update of a superseded run of partials) or an `error` for `seq` or for no update at all.
"""

from __future__ import annotations

import json
import time
from typing import Any, Iterable

from alignatt.core.errors import AlignattError
from alignatt.serve.protocol import PROTOCOL_VERSION, InitFrame, UpdateFrame


def _wire_words(words: Iterable[str]) -> list[list[Any]]:
    return [[w, None, None] for w in words]


def init_frame(source_lang: str = "en", target_lang: str = "de", *, check: bool = True,
               **fields: Any) -> dict[str, Any]:
    """An `init` frame; `fields` are the frame's optional fields (preset, overrides, history, ...).
    `check=False` leaves a frame the server must refuse as it is (tests of the server's answers)."""
    frame = {"type": "init", "protocol_version": PROTOCOL_VERSION, "source_lang": source_lang,
             "target_lang": target_lang, **fields}
    if check:
        InitFrame.model_validate(frame)
    return frame


def update_frame(seq: int, words: Iterable[str], tail: Iterable[str] = (), is_final: bool = False,
                 utterance_id: int | None = 0, clock_ms: float | None = None, *, check: bool = True,
                 **extra: Any) -> dict[str, Any]:
    """An `update` frame: the open utterance's committed words and its unstable tail. A missing
    `utterance_id` (None) means the open utterance; no `tail` field is sent for an empty tail."""
    frame: dict[str, Any] = {"type": "update", "seq": seq}
    if utterance_id is not None:
        frame["utterance_id"] = utterance_id
    frame["words"] = _wire_words(words)
    if clock_ms is not None:
        frame["clock_ms"] = clock_ms
    frame["is_final"] = is_final
    tail = list(tail)
    if tail:
        frame["tail"] = {"words": _wire_words(tail)}
    frame.update(extra)
    if check:
        UpdateFrame.model_validate(frame)
    return frame


def answers(reply: dict[str, Any], seq: int) -> bool:
    """Whether `reply` is the server's answer to update `seq` (see the module's docstring)."""
    if reply.get("type") == "error":
        return reply.get("seq") in (None, seq)
    return reply.get("type") == "translation" and reply.get("seq", -1) >= seq


class NoReply(AlignattError, TimeoutError):
    """The server did not answer an update in time (a `TimeoutError` too, like a silent socket)."""


def refused(reply: dict[str, Any]) -> AlignattError:
    return AlignattError(f"server refused the session: {reply.get('code')}: {reply.get('message')}")


class ProtocolClient:
    """One WebSocket to `alignatt serve` over websockets' sync API (what WhisperLiveKit uses too)."""

    def __init__(self, ws: Any, timeout: float = 600.0, check: bool = True) -> None:
        self.ws = ws
        self.timeout = timeout  # how long one reply may take
        self.check = check  # False: frames go out unchecked (a test of what the server refuses)
        self.seq = 0

    @classmethod
    def connect(cls, url: str, timeout: float = 600.0, open_timeout: float = 10.0, check: bool = True,
                token: str | None = None, **options: Any) -> "ProtocolClient":
        """`options` go to websockets' `connect` (`ssl=` an SSLContext for a wss:// URL); the connection
        is opened directly (`legacy`), not as a context manager, and takes frames of any size unless
        `max_size` says otherwise. `token`: sent as `Authorization: Bearer`, never in the URL."""
        from websockets.sync.client import connect

        if token is not None:
            options["additional_headers"] = {**dict(options.get("additional_headers") or {}),
                                             "Authorization": f"Bearer {token}"}
        options.setdefault("max_size", None)
        options.setdefault("legacy", True)
        return cls(connect(url, open_timeout=open_timeout, **options), timeout, check)

    def send(self, frame: dict[str, Any] | str | bytes) -> None:
        self.ws.send(frame if isinstance(frame, (str, bytes)) else json.dumps(frame))

    def recv(self, timeout: float | None = None) -> dict[str, Any]:
        return json.loads(self.ws.recv(timeout=self.timeout if timeout is None else timeout))

    def init(self, source_lang: str = "en", target_lang: str = "de", **fields: Any) -> dict[str, Any]:
        """Send an `init` frame and return the server's reply (`init_ok` or an error)."""
        self.send(init_frame(source_lang, target_lang, check=self.check, **fields))
        return self.recv()

    def open(self, source_lang: str = "en", target_lang: str = "de", **fields: Any) -> dict[str, Any]:
        """`init` that must be accepted: the `init_ok` frame, or an `AlignattError` saying why not."""
        ok = self.init(source_lang, target_lang, **fields)
        if ok.get("type") != "init_ok":
            raise refused(ok)
        return ok

    def update(self, words: Iterable[str], tail: Iterable[str] = (), final: bool = False,
               utterance_id: int | None = 0, seq: int | None = None, clock_ms: float | None = None,
               **extra: Any) -> int:
        """Send one update (the next seq unless `seq` is given) without waiting; its seq."""
        self.seq = self.seq + 1 if seq is None else seq
        self.send(update_frame(self.seq, words, tail, final, utterance_id, clock_ms, check=self.check, **extra))
        return self.seq

    def await_reply(self, seq: int, timeout: float | None = None) -> dict[str, Any]:
        """The server's answer to update `seq` (replies to older updates are read and passed over)."""
        timeout = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise NoReply(f"no reply to update seq {seq} within {timeout:.0f}s")
            reply = self.recv(remaining)
            if answers(reply, seq):
                return reply

    def ask(self, words: Iterable[str], tail: Iterable[str] = (), final: bool = False,
            utterance_id: int | None = 0, **options: Any) -> dict[str, Any]:
        """Send one update and return its answer."""
        return self.await_reply(self.update(words, tail, final, utterance_id, **options))

    def close(self) -> None:
        self.ws.close()

    def __enter__(self) -> "ProtocolClient":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
