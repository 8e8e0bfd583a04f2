"""SIGTERM drains (`MTServer.drain`): no new session, an open utterance finishes before its session
is handed over (told to reconnect, close 1012), an idle one is handed over at once, /health says
`draining` (503), and a foreground `serve` exits once drained."""

import threading
import time

import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus

from tests.support.server_client import Client, fake_server, health


def _drain_in_background(srv) -> threading.Thread:
    t = threading.Thread(target=srv.drain, daemon=True)
    t.start()
    deadline = time.monotonic() + 5
    while not srv.server.draining and time.monotonic() < deadline:
        time.sleep(0.01)
    return t


def _replies_until_closed(c: Client) -> tuple[list[dict], int | None]:
    replies = []
    while True:
        try:
            replies.append(c.recv())
        except ConnectionClosed as e:
            return replies, e.rcvd.code if e.rcvd else None


def test_an_open_utterance_finishes_then_its_session_is_handed_over(tmp_path):
    with fake_server(tmp_path) as srv:
        srv.server.config.drain_s = 30.0
        open_, idle = Client(srv.url), Client(srv.url)
        for c in (open_, idle):
            assert c.init()["type"] == "init_ok"
        assert open_.ask(["hello", "world"])["type"] == "translation"  # a partial: its utterance is open
        assert idle.ask(["good", "morning."], final=True)["final"]  # answered final: nothing open
        drainer = _drain_in_background(srv)
        replies, code = _replies_until_closed(idle)  # handed over at once
        assert code == 1012 and replies[-1]["code"] == "processing_failed"
        assert "reconnect" in replies[-1]["message"] and "accepted_target_prefix" in replies[-1]["message"]
        status, body = health(srv)
        assert status == 503 and body["status"] == "draining" and body["sessions_free"] == 0
        with pytest.raises(InvalidStatus) as refused:
            Client(srv.url)
        assert refused.value.response.status_code == 503
        assert drainer.is_alive()  # the open utterance holds the drain
        seq = open_.update(["hello", "world", "again."], final=True)
        replies, code = _replies_until_closed(open_)
        finals = [r for r in replies if r.get("type") == "translation" and r["seq"] == seq]
        assert finals and finals[0]["final"] and finals[0]["committed_text"]  # answered before the hand-over
        assert code == 1012 and replies[-1]["code"] == "processing_failed"
        drainer.join(10)
        assert not drainer.is_alive() and not srv.server.connections
        assert srv.server.stats.closes["drained"] == 2


def test_a_drain_hands_over_an_utterance_that_does_not_finish_in_time(tmp_path):
    with fake_server(tmp_path) as srv:
        srv.server.config.drain_s = 0.5
        c = Client(srv.url)
        c.init()
        shown = c.ask(["hello", "world"])["committed_text"]
        started = time.monotonic()
        srv.drain()
        replies, code = _replies_until_closed(c)
        assert code == 1012 and 0.4 < time.monotonic() - started < 5
        # resumed elsewhere (here: a second server) from the text shown, append-only
        with fake_server(tmp_path) as other:
            d = Client(other.url)
            assert d.init(accepted_target_prefix=shown)["type"] == "init_ok"
            assert d.ask(["hello", "world", "again."], final=True)["committed_text"].startswith(shown)
