"""A connection's life is bounded before init (how many wait, how large a frame they send) and after
it (idle time): each bound ends with an error frame and/or a close whose code and reason say why."""

import json
import time

import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus

from tests.support.server_client import Client, fake_server


def closed_with(c: Client, timeout: float = 5.0):
    """The close frame the server sent (every reply before it is read and returned too)."""
    replies = []
    try:
        while True:
            replies.append(c.recv(timeout))
    except ConnectionClosed as e:
        return e.rcvd, replies


def test_connections_waiting_for_init_are_bounded_in_number(tmp_path):
    with fake_server(tmp_path, max_connections_before_init=2, init_timeout_s=30.0) as srv:
        a, b = Client(srv.url), Client(srv.url)
        time.sleep(0.2)  # within the grace: neither makes room, so a third is refused at the handshake
        with pytest.raises(InvalidStatus) as refused:
            Client(srv.url)
        assert refused.value.response.status_code == 503
        assert b"waiting for init" in refused.value.response.body
        assert a.init()["type"] == "init_ok"  # a session leaves the count: room for one more
        with Client(srv.url) as late:
            assert late.init()["type"] == "init_ok"
        assert srv.call(lambda: srv.server.stats.closes["busy_before_init"]) == 1
        a.close(), b.close()
        time.sleep(0.3)
        assert srv.call(lambda: srv.server.stats.connections_before_init) == 0


def test_a_large_frame_before_init_gets_one_bad_protocol_then_the_close(tmp_path):
    with fake_server(tmp_path, max_init_frame_bytes=2048) as srv:
        with Client(srv.url) as c:
            c.send(json.dumps({"type": "init", "protocol_version": 1, "source_lang": "en", "target_lang": "de",
                               "context_text": "x" * 3000}))
            close, replies = closed_with(c)
            assert [r["code"] for r in replies] == ["bad_protocol"]
            assert "exceeds the 2048-byte limit" in replies[0]["message"]
            assert close.code == 1008 and "before init" in close.reason
        with Client(srv.url) as c:  # after init the frame bound is max_frame_bytes
            assert c.init()["type"] == "init_ok"
            assert c.ask(["w" + "x" * 150] * 20, extra="y" * 1000)["type"] == "translation"
        with Client(srv.url) as c:  # a small refused frame before init does not close
            c.send("{not json")
            assert c.recv()["code"] == "bad_protocol"
            assert c.init()["type"] == "init_ok"


def test_a_session_that_sends_nothing_after_init_is_closed_with_its_reason(tmp_path):
    with fake_server(tmp_path, idle_timeout_s=0.5) as srv:
        with Client(srv.url) as c:
            assert c.init()["type"] == "init_ok"
            started = time.monotonic()
            close, replies = closed_with(c)
            assert replies == [] and close.code == 1008 and close.reason == "idle: no update for 0.5 s"
            assert 0.4 < time.monotonic() - started < 5.0
        assert srv.call(lambda: (srv.server.stats.sessions_active, srv.server.stats.closes["idle_timeout"])) == (0, 1)


def test_a_session_waiting_for_its_own_reply_is_not_idle(tmp_path):
    with fake_server(tmp_path, idle_timeout_s=0.3, seam_options={"delay_s": 1.2}) as srv, Client(srv.url) as c:
        assert c.init()["type"] == "init_ok"
        reply = c.ask("the causal encoder.".split(), final=True)  # one slow draft, nothing sent meanwhile
        assert reply["type"] == "translation" and reply["final"]


@pytest.mark.parametrize("field", ["idle_timeout_s", "max_connections_before_init", "max_init_frame_bytes"])
def test_the_bounds_are_server_config(field):
    from alignatt.serve.config import ServerLimits

    assert field in ServerLimits.model_fields and ServerLimits.model_fields[field].description
