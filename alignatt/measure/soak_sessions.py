"""The soak's sessions: a well-formed speaker and the catalogue of hostile ones, each checking
the server's answer, their outcomes counted in a `Tally` (`alignatt.measure.soak` runs them).

Well-formed sessions stream sentences word by word (tail arrival, commit, final) and check that
`committed_text` only grows. Hostile ones send what breaks a careless server (malformed JSON,
huge integers, lone surrogates, oversized frames, words with inner whitespace, token-bound
breakers, control characters, seq replays, idle sockets, abandoned sessions, 256 KiB frames of
nested arrays before and after init, 250 kB-prefix inits, a session pipelining finals) and check
that the server answers each with the error or the close it owes. Who may connect (other origins,
no or a wrong token, a flood of idle sockets beside honest clients) is `soak_access`'s.
"""

from __future__ import annotations

import json
import random
import socket
import time
from dataclasses import dataclass, field
from typing import Callable

from alignatt.core.policy import POLICY_PRESETS
from alignatt.measure.soak_access import ACCESS_CASES, run_access_case
from alignatt.replay.client import NoReply, ProtocolClient


@dataclass(frozen=True)
class Timeouts:
    reply_s: float  # a reply later than this is a silent session
    init_s: float  # the server's init timeout (idle sockets must be closed after it)
    idle_hold_s: float = 60.0  # how long the idle flood holds its sockets (`soak_access`)


@dataclass
class Tally:
    """What the clients saw; one per thread, summed at the end."""

    sessions: dict[str, int] = field(default_factory=dict)
    updates: int = 0
    finals_sent: int = 0
    finals_answered: int = 0
    retractions: int = 0
    silent_sessions: int = 0
    client_errors: dict[str, int] = field(default_factory=dict)  # error codes received
    unexpected: list[str] = field(default_factory=list)  # hostile cases answered otherwise

    def add(self, other: "Tally") -> None:
        for k, v in other.sessions.items():
            self.sessions[k] = self.sessions.get(k, 0) + v
        for k, v in other.client_errors.items():
            self.client_errors[k] = self.client_errors.get(k, 0) + v
        self.updates += other.updates
        self.finals_sent += other.finals_sent
        self.finals_answered += other.finals_answered
        self.retractions += other.retractions
        self.silent_sessions += other.silent_sessions
        self.unexpected += other.unexpected


class Silent(Exception):
    """A reply that did not come in time, on a connection that was not closed."""


class _Client(ProtocolClient):
    """The protocol client that counts what it sees into the tally, and calls a late reply `Silent`."""

    def __init__(self, url: str, tally: Tally, timeout: float, token: str | None = None) -> None:
        client = ProtocolClient.connect(url, timeout=timeout, token=token)
        super().__init__(client.ws, timeout)
        self.tally = tally
        self.shown: dict[int, str] = {}  # utterance id -> committed_text last seen

    def recv(self, timeout: float | None = None) -> dict:
        try:
            reply = super().recv(timeout)
        except TimeoutError:
            raise Silent from None
        if reply.get("type") == "error":
            code = reply.get("code", "?")
            self.tally.client_errors[code] = self.tally.client_errors.get(code, 0) + 1
        elif reply.get("type") == "translation":
            uid, text = reply["utterance_id"], reply["committed_text"]
            if not text.startswith(self.shown.get(uid, "")):
                self.tally.retractions += 1
            self.shown[uid] = text
        return reply

    def ask(self, words, tail=(), final=False, utterance_id: int | None = 0, **extra) -> dict:
        seq = self.update(words, tail, final, utterance_id, **extra)
        self.tally.updates += 1
        self.tally.finals_sent += final
        try:
            reply = self.await_reply(seq)
        except NoReply:
            raise Silent from None
        self.tally.finals_answered += final
        return reply


def sentences_of(words: list[str]) -> list[list[str]]:
    from alignatt.replay.stream import ends_sentence

    out, cur = [], []
    for w in words:
        cur.append(w)
        if ends_sentence(w):
            out.append(cur)
            cur = []
    return out + ([cur] if cur else [])


def well_formed(c: _Client, rng: random.Random, sentences: list[list[str]], deadline: float) -> None:
    """One to two utterances, streamed word by word (arrival as tail, then commit), then a final.

    Past the deadline the open utterance goes straight to its final, so the load ends promptly.
    """
    c.init(preset=rng.choice(list(POLICY_PRESETS)))
    named = rng.random() < 0.7  # else utterance_id is left out (the open utterance)
    for uid in range(rng.randint(1, 2)):
        words = rng.choice(sentences)
        for i in range(len(words)):
            if time.monotonic() > deadline:
                break
            c.ask(words[:i], words[i:i + 1], utterance_id=uid if named else None)
            c.ask(words[: i + 1], utterance_id=uid if named else None)
        reply = c.ask(words, final=True, utterance_id=uid if named else None)
        if reply.get("type") != "translation" or not reply.get("final"):
            c.tally.unexpected.append(f"well_formed final answered {reply.get('type')}: {reply.get('message', '')}"[:200])


def _expect_error(c: _Client, frame, fragment: str, name: str) -> None:
    c.send(frame)
    r = c.recv()
    if r.get("type") != "error" or fragment not in r.get("message", ""):
        c.tally.unexpected.append(f"{name}: {r}"[:200])
        return
    r = c.ask(["still", "here"], utterance_id=None)
    if r.get("type") != "translation":
        c.tally.unexpected.append(f"{name}: session did not go on: {r}"[:200])


_INIT = '{"type": "init", "protocol_version": 1, "source_lang": "en", "target_lang": "de"'


def _update(c: _Client, **fields) -> str:
    c.seq += 1  # a valid seq: the frame is refused for what it holds, not for its order
    return json.dumps({"type": "update", "seq": c.seq, **fields})


def _malformed_json(c: _Client) -> None:
    c.init()
    _expect_error(c, "{not json", "invalid JSON", "malformed_json")


def _huge_integer(c: _Client) -> None:
    c.init()
    _expect_error(c, '{"type": "update", "seq": 1, "clock_ms": ' + "9" * 5000 + "}", "invalid JSON", "huge_integer")


def _refused_then_working(c: _Client, frame: str, fragment: str, name: str) -> None:
    """`frame` gets an error naming `fragment`; an init after it opens a session that works."""
    c.send(frame)
    r = c.recv()
    if r.get("type") != "error" or fragment not in r.get("message", ""):
        c.tally.unexpected.append(f"{name}: {r}"[:200])
    c.init()
    if c.ask(["hello"], utterance_id=None).get("type") != "translation":
        c.tally.unexpected.append(f"{name}: the session did not work after the refusal")


def _surrogate_override_key(c: _Client) -> None:
    _refused_then_working(c, _INIT + ', "overrides": {"\\ud800": 1}}', "surrogate", "surrogate_override_key")


def _inner_whitespace(c: _Client) -> None:
    c.init()
    _expect_error(c, _update(c, words=[["two words", None, None]]), "whitespace", "inner_whitespace")


def _oversized_frame(c: _Client) -> None:
    c.init()
    _expect_error(c, _update(c, pad="x" * 300_000), "exceeds", "oversized_frame")


def _token_bound(c: _Client) -> None:
    c.init()
    words = [[f"{i}" + "x" * 190, None, None] for i in range(300)]  # within every word limit
    _expect_error(c, _update(c, words=words, is_final=True), "max_prompt_tokens", "token_bound")


def _update_before_init(c: _Client) -> None:
    _refused_then_working(c, json.dumps({"type": "update", "seq": 1, "words": []}), "before init", "update_before_init")


def nested_arrays_frame(items: int = 216, depth: int = 600) -> str:
    """A 256 KiB update of deeply nested empty arrays: valid JSON, 130 000 values."""
    return '{"type": "update", "seq": 1, "x": [' + ",".join(["[" * depth + "]" * depth] * items) + "]}"


def _nested_arrays_in_session(c: _Client) -> None:
    c.init()
    c.seq += 1
    _expect_error(c, nested_arrays_frame().replace('"seq": 1', f'"seq": {c.seq}', 1), "JSON values",
                  "nested_arrays_in_session")


def _final_flood(c: _Client) -> None:
    """Finals of 40 words pipelined without reading (within every limit), then every reply read."""
    c.init()
    words = [f"word{i}" for i in range(39)] + ["end."]
    for uid in range(12):
        c.update(words, final=True, utterance_id=uid)
        c.tally.updates += 1
        c.tally.finals_sent += 1
    answered = 0
    while answered < 12:
        r = c.recv()
        if r.get("type") == "translation" and r.get("final"):
            answered += 1
            c.tally.finals_answered += 1
        elif r.get("type") == "error":
            c.tally.unexpected.append(f"final_flood: {r}"[:200])
            return


def _hostile_frames() -> dict[str, Callable[[_Client], None]]:
    return {
        "malformed_json": _malformed_json,
        "huge_integer": _huge_integer,
        "surrogate_override_key": _surrogate_override_key,
        "surrogate_prefix": _surrogate_prefix,
        "inner_whitespace": _inner_whitespace,
        "oversized_frame": _oversized_frame,
        "token_bound": _token_bound,
        "control_characters": _control_characters,
        "seq_replay": _seq_replay,
        "update_before_init": _update_before_init,
        "abandoned": _abandoned,
        "nested_arrays_in_session": _nested_arrays_in_session,
        "final_flood": _final_flood,
    }


def _surrogate_prefix(c: _Client) -> None:
    c.send('{"type": "init", "protocol_version": 1, "source_lang": "en", "target_lang": "de", '
           '"accepted_target_prefix": "Das \\udfff"}')
    r = c.recv()
    if r.get("type") != "error" or "surrogate" not in r.get("message", ""):
        c.tally.unexpected.append(f"surrogate_prefix: {r}"[:200])
    if c.init().get("type") != "init_ok" or c.ask(["hello"], final=True).get("type") != "translation":
        c.tally.unexpected.append("surrogate_prefix: the session did not work after the refusal")


def _control_characters(c: _Client) -> None:
    import re

    c.init(accepted_target_prefix="Das \u202eHaus")
    r = c.ask(["bell\x07", "rtl\u202ex", "end."], final=True)
    bad = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
    if r.get("type") != "translation" or bad.search(r["committed_text"] + r["buffer_text"]):
        c.tally.unexpected.append(f"control_characters: {r}"[:200])


def _seq_replay(c: _Client) -> None:
    c.init()
    c.ask(["one"])
    c.seq -= 1  # the same seq again
    r = c.ask(["one", "two"])
    if r.get("type") != "error" or "does not follow" not in r.get("message", ""):
        c.tally.unexpected.append(f"seq_replay: {r}"[:200])


def _abandoned(c: _Client) -> None:
    c.init()
    c.send(json.dumps({"type": "update", "seq": 1, "words": [["left", None, None], ["behind", None, None]]}))
    c.close()  # gone before the reply


def _connection_cases(url: str, tally: Tally, init_timeout_s: float, name: str, token: str | None) -> None:
    """Cases that need no protocol client: idle sockets, raw TCP, frames past the hard cap."""
    from websockets.exceptions import ConnectionClosed
    from websockets.sync.client import connect

    host, port = url.removeprefix("ws://").rsplit(":", 1)
    if name == "raw_tcp":
        socket.create_connection((host, int(port)), timeout=5).close()
        return
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    with connect(url, open_timeout=10.0, max_size=None, additional_headers=headers) as ws:
        try:
            if name == "frame_past_hard_cap":
                ws.send("x" * (5 * 256 * 1024))
            elif name in _BEFORE_INIT:  # one bad_protocol, then the close
                ws.send(_BEFORE_INIT[name]())
                reply = json.loads(ws.recv(timeout=10.0))
                if reply.get("code") != "bad_protocol" or len(reply.get("message", "")) > 500:
                    tally.unexpected.append(f"{name}: {reply}"[:200])
            ws.recv(timeout=max(init_timeout_s * 3, 10.0))
            tally.unexpected.append(f"{name}: the server did not close the connection")
        except ConnectionClosed as e:
            want = 1009 if name == "frame_past_hard_cap" else 1008
            if e.rcvd is None or e.rcvd.code != want:
                tally.unexpected.append(f"{name}: closed with {e.rcvd}")
        except TimeoutError:
            tally.unexpected.append(f"{name}: no close in time")


# Frames that a connection sends before any init (the server answers one bad_protocol, then closes).
_BEFORE_INIT: dict[str, Callable[[], str]] = {
    "nested_arrays_before_init": nested_arrays_frame,
    "huge_prefix_init": lambda: _INIT + ', "accepted_target_prefix": "' + "Wort " * 50_000 + '"}',
}
_CONNECTION_CASES = ("raw_tcp", "idle_no_init", "frame_past_hard_cap", *_BEFORE_INIT)
HOSTILE_CASES = sorted([*_hostile_frames(), *_CONNECTION_CASES, *ACCESS_CASES])


def run_session(url: str, kind: str, tally: Tally, rng: random.Random, sentences, timeouts: "Timeouts",
                deadline: float = float("inf"), token: str | None = None) -> None:
    """One session of `kind` ("well_formed" or a hostile case), its outcome counted in `tally`;
    `token`: the one the server requires (every case presents it, but those about the token)."""
    tally.sessions[kind] = tally.sessions.get(kind, 0) + 1
    if kind in _CONNECTION_CASES:
        _connection_cases(url, tally, timeouts.init_s, kind, token)
        return
    if kind in ACCESS_CASES:
        run_access_case(url, kind, token, timeouts.idle_hold_s, tally.unexpected)
        return
    from websockets.exceptions import ConnectionClosed

    c = _Client(url, tally, timeouts.reply_s, token)
    try:
        if kind == "well_formed":
            well_formed(c, rng, sentences, deadline)
        else:
            _hostile_frames()[kind](c)
    except Silent:
        tally.silent_sessions += 1
    except ConnectionClosed as e:
        if kind != "abandoned":
            tally.unexpected.append(f"{kind}: connection closed ({e.rcvd})"[:200])
    finally:
        c.close()
