"""Fuzzing a served session (hypothesis): frames from the protocol-model strategies, sent in lockstep
to a `Connection` over an in-memory socket (fake engine), and a few over real loopback WebSockets.

Invariants: every input ends in exactly one reply frame or a close with a code and a reason; the
session's worker never dies; `committed_text` only grows within an utterance.
"""

import asyncio
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from websockets.exceptions import ConnectionClosed

from alignatt.serve.connection import Connection
from alignatt.serve.protocol import InitFrame, UpdateFrame
from alignatt.serve.server import MTServer
from tests.support.fuzz_frames import any_frame, expensive_frame, frame_dict
from tests.support.server_client import Client, FakeFactory, fake_config, fake_server
from tests.serve.test_fuzz_protocol import FUZZ, SCALE

_CLOSED = object()
GOOD_INIT = json.dumps({"type": "init", "protocol_version": 1, "source_lang": "en", "target_lang": "de"}).encode()
REPLY_TIMEOUT_S = 5.0


class MemorySocket:
    """What `Connection` uses of a websockets connection, in memory."""

    def __init__(self) -> None:
        self.incoming: asyncio.Queue = asyncio.Queue()
        self.sent: list[str] = []
        self.closed: tuple[int, str] | None = None
        self.changed = asyncio.Event()

    async def recv(self, decode=False):
        item = await self.incoming.get()
        if item is _CLOSED:
            raise ConnectionClosed(None, None)
        return item

    async def send(self, text: str) -> None:
        self.sent.append(text)
        self.changed.set()

    async def close(self, code: int = 1000, reason: str = "") -> None:
        if self.closed is None:
            self.closed = (code, reason)
        self.incoming.put_nowait(_CLOSED)
        self.changed.set()


class Invariants:
    """Append-only per utterance, across every translation reply of one session."""

    def __init__(self) -> None:
        self.shown: dict[int, str] = {}

    def check(self, reply: dict) -> None:
        if reply["type"] == "translation":
            uid, text = reply["utterance_id"], reply["committed_text"]
            assert text.startswith(self.shown.get(uid, "")), (self.shown.get(uid), text)
            self.shown[uid] = text


def _with_seq(frame_bytes: bytes, seq: int) -> bytes:
    """Most updates get the next seq, so that they reach the session instead of the seq check."""
    try:
        data = json.loads(frame_bytes)
    except (ValueError, RecursionError):
        return frame_bytes
    if isinstance(data, dict) and data.get("type") == "update":
        data["seq"] = seq
        return json.dumps(data).encode()
    return frame_bytes


first_init = st.one_of(st.just(GOOD_INIT), frame_dict(InitFrame).map(lambda f: json.dumps(f).encode()),
                       expensive_frame)  # before init: one bad_protocol, then the close
session_frames = st.lists(
    st.tuples(st.one_of(any_frame, frame_dict(UpdateFrame).map(lambda f: json.dumps(f).encode())), st.booleans()),
    min_size=1, max_size=12,
)


async def _reply_or_close(ws: MemorySocket, before: int) -> None:
    while len(ws.sent) == before and ws.closed is None:
        await ws.changed.wait()
        ws.changed.clear()


async def _drive(server: MTServer, frames: list[tuple[bytes, bool]], init: bytes = GOOD_INIT) -> None:
    ws = MemorySocket()
    conn = Connection(server, ws, 1)
    runner = asyncio.create_task(conn.run())
    inv = Invariants()
    seq = 0
    for raw, keep_seq in [(init, True)] + frames:
        if ws.closed is not None:
            break
        if not keep_seq:
            seq += 1
            raw = _with_seq(raw, seq)
        before = len(ws.sent)
        ws.changed.clear()
        ws.incoming.put_nowait(raw)
        # a missing reply fails here (TimeoutError): a silent session
        await asyncio.wait_for(_reply_or_close(ws, before), REPLY_TIMEOUT_S)
        if ws.closed is not None:
            code, reason = ws.closed
            assert code in (1008, 1011, 1013) and reason, ws.closed
            break
        assert len(ws.sent) == before + 1, ws.sent[before:]
        reply = json.loads(ws.sent[-1].encode("utf-8"))
        assert reply["type"] in ("init_ok", "translation", "error"), reply
        inv.check(reply)
        if conn.session is not None:
            assert conn.worker is not None and not conn.worker.done(), "the session's worker died"
    await ws.close()
    await asyncio.wait_for(runner, REPLY_TIMEOUT_S)
    assert server.stats.sessions_active == 0


@pytest.fixture(scope="module")
def memory_server(tmp_path_factory):
    server = MTServer(fake_config(tmp_path_factory.mktemp("fuzz")), FakeFactory())
    yield server
    server.registry.close()


@settings(FUZZ, max_examples=int(250 * SCALE))
@given(init=first_init, frames=session_frames)
def test_every_frame_to_a_session_gets_one_reply_or_a_clean_close(memory_server, init, frames):
    asyncio.run(_drive(memory_server, frames, init))


@settings(FUZZ, max_examples=int(150 * SCALE))
@given(steps=st.lists(st.tuples(st.integers(0, 7), st.integers(0, 3), st.booleans(), st.integers(0, 2)),
                      min_size=1, max_size=25))
def test_well_formed_streams_only_ever_grow_the_committed_text(memory_server, steps):
    """Valid updates only (words arriving, committing, rewritten, finals; ids named or not)."""
    words = "the causal encoder processes each audio block once.".split()
    frames, uid = [], 0
    for n, tail, final, naming in steps:
        frame = {"type": "update", "words": [[w, None, None] for w in words[:n]],
                 "tail": {"words": [[w, None, None] for w in words[n:n + tail]]}, "is_final": final}
        if naming == 1:
            frame["utterance_id"] = uid
        elif naming == 2:
            frame["utterance_id"] = uid + 1  # the client moves on without a final
            uid += 1
        uid += final
        frames.append((json.dumps(frame).encode(), False))
    asyncio.run(_drive(memory_server, frames))


@pytest.fixture(scope="module")
def loopback_server(tmp_path_factory):
    with fake_server(tmp_path_factory.mktemp("fuzz-loopback")) as srv:
        yield srv


@settings(FUZZ, max_examples=int(12 * SCALE))
@given(frames=st.lists(any_frame, min_size=1, max_size=6))
def test_hostile_frames_over_real_websockets(loopback_server, frames):
    inv = Invariants()
    with Client(loopback_server.url, timeout=REPLY_TIMEOUT_S) as c:
        assert c.init(preset="low_latency")["type"] == "init_ok"
        for raw in frames:
            c.ws.send(raw)  # bytes: a binary frame, which the server reads as text
            try:
                reply = c.recv()
            except ConnectionClosed as e:
                assert e.rcvd is not None and e.rcvd.code in (1008, 1009, 1011) and e.rcvd.reason, e
                return
            assert reply["type"] in ("translation", "error", "init_ok")
            inv.check(reply)
