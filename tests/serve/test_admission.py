"""A session is admitted once: one init per connection, an init refused after its engine admitted it
gives the place back (a retry on the same connection is admitted once), and an init cancelled while
its engine admits it leaves no session behind on the engine."""

import asyncio
import json
import threading

from alignatt.replay.client import init_frame
from alignatt.serve.admission import admit
from alignatt.serve.host import ServerStats, SessionSlots
from alignatt.serve.protocol import BAD_PROTOCOL, parse_frame
from tests.support.server_client import Client, fake_config, fake_server


def admissions(srv) -> tuple[int, int]:
    """(the server's sessions holding a slot, the sessions its engine admitted)."""
    def read():
        (engine,) = srv.server.registry.engines
        return srv.server.stats.sessions_active, engine.scheduler.sessions
    return srv.call(read)


def test_a_second_init_on_an_open_session_is_refused_and_admits_nothing(tmp_path):
    with fake_server(tmp_path) as srv:
        client = Client(srv.url)
        try:
            client.send(init_frame("en", "de", check=False))
            client.send(init_frame("en", "de", check=False))  # sent before the first is answered
            assert client.recv()["type"] == "init_ok"
            refused = client.recv()
            assert refused["type"] == "error" and refused["code"] == BAD_PROTOCOL, refused
            assert "one init per connection" in refused["message"]
            assert admissions(srv) == (1, 1)
            reply = client.ask(["one", "two"], final=True)  # the first session goes on
            assert reply["type"] == "translation" and reply["final"]
        finally:
            client.close()
        assert srv.call(lambda: srv.server.stats.sessions_opened) == 1


def test_an_init_refused_after_its_engine_admitted_it_gives_the_place_back(tmp_path):
    with fake_server(tmp_path) as srv:
        client = Client(srv.url)
        try:
            too_long = client.init(context_text="word " * 1000)  # refused past `place`, on the bounds
            assert too_long["type"] == "error" and too_long["code"] == BAD_PROTOCOL, too_long
            assert admissions(srv) == (0, 0)
            assert client.init()["type"] == "init_ok"  # the retry, on the same connection
            assert admissions(srv) == (1, 1)
        finally:
            client.close()


class _SlowPlacement:
    """A registry whose `place` admits only once the test lets it, on the engine it records on."""

    def __init__(self) -> None:
        self.go, self.placed = threading.Event(), threading.Event()
        self.open: set = set()

    def place(self, route, direction, keys):
        self.go.wait(10)
        self.open.update(keys)
        self.placed.set()
        return self

    def close_session(self, key) -> None:
        self.open.discard(key)


def test_an_init_cancelled_while_its_engine_admits_it_leaves_no_session_on_the_engine(tmp_path):
    """The connection closes mid-`place` (which runs on a thread that cannot be stopped): what
    `place` admits after the cancel is given back as soon as it returns."""
    registry = _SlowPlacement()

    class Host:
        slots = SessionSlots()
        config, stats = fake_config(tmp_path), ServerStats(slots=slots)

    Host.registry = registry
    frame = parse_frame(json.dumps(init_frame("en", "de", check=False)), 1 << 16)

    async def cancelled_mid_place():
        opening = asyncio.create_task(admit(Host, frame, 7))
        await asyncio.sleep(0.2)  # `place` is waiting on its thread
        opening.cancel()
        try:
            await opening
        except asyncio.CancelledError:
            pass
        registry.go.set()
        registry.placed.wait(10)
        for _ in range(100):  # the give-back runs on the loop once the thread returns
            await asyncio.sleep(0.01)
            if not registry.open:
                break

    asyncio.run(cancelled_mid_place())
    assert registry.placed.is_set() and registry.open == set()
    assert Host.stats.sessions_active == 0 and Host.slots.count == 0  # the slot is given back too
