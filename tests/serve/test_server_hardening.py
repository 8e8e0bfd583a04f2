"""Bad input on the wire: every case gets a clear error frame (or a clean close) and loses nothing.

Loopback only; every loop is bounded and every test stops by itself.
"""

import json
import socket
import time

import pytest
from websockets.exceptions import ConnectionClosed

from tests.support.server_client import Client, fake_server

SRC = "the causal encoder processes each block once.".split()


def wait_for(predicate, timeout=5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return False


def still_translates(c: Client, words=("hello", "world")) -> None:
    r = c.ask(list(words), utterance_id=0)
    assert r["type"] == "translation", r


@pytest.mark.parametrize(
    "frame, fragment",
    [
        ("{not json", "invalid JSON"),
        ("[1, 2]", "JSON object"),
        ('"update"', "JSON object"),
        ('{"type": "subscribe"}', "unknown frame type"),
        ('{"seq": 1}', "unknown frame type"),
        ('{"type": "update", "seq": "7", "words": []}', "seq"),
        ('{"type": "update", "seq": 7, "words": [[1, 2, 3]]}', "word"),
        ('{"type": "update", "seq": 7, "words": [["a", "x", null]]}', "timestamps"),
        ('{"type": "update", "seq": 7, "is_final": "yes"}', "is_final"),
        ('{"type": "update", "seq": -1}', "seq"),
        ("[" * 5000 + "]" * 5000, "invalid JSON"),
    ],
)
def test_malformed_frames_get_bad_protocol_and_the_session_survives(tmp_path, frame, fragment):
    with fake_server(tmp_path) as srv, Client(srv.url) as c:
        c.init()
        c.send(frame)
        err = c.recv()
        assert err["type"] == "error" and err["code"] == "bad_protocol"
        assert fragment in err["message"]
        still_translates(c)


def test_update_before_init_and_double_init(tmp_path):
    with fake_server(tmp_path) as srv, Client(srv.url) as c:
        c.update(["hi"])
        err = c.recv()
        assert err["code"] == "bad_protocol" and "before init" in err["message"] and err["seq"] == 1
        assert c.init()["type"] == "init_ok"
        again = c.init(target_lang="de")
        assert again["code"] == "bad_protocol" and "already" in again["message"]
        still_translates(c)


def test_wrong_protocol_version(tmp_path):
    with fake_server(tmp_path) as srv, Client(srv.url) as c:
        for version in (2, 0, "1", None):
            err = c.init(protocol_version=version)
            assert err["code"] == "bad_protocol" and err["supported"] == [1]
        assert c.init()["type"] == "init_ok"


def test_unknown_fields_are_tolerated_and_reported(tmp_path):
    with fake_server(tmp_path) as srv, Client(srv.url) as c:
        assert c.init(speaker="A")["ignored_fields"] == ["speaker"]
        r = c.ask(SRC[:3], SRC[3:4], confidence=0.9, tail_extra=1)
        assert r["type"] == "translation" and r["ignored_fields"] == ["confidence", "tail_extra"]
        c.send({"type": "update", "seq": 99, "words": [["the", 0, 1]], "tail": {"words": [], "x": 1}})
        assert c.recv()["ignored_fields"] == ["tail.x"]


def test_oversized_frames(tmp_path):
    with fake_server(tmp_path, max_frame_bytes=4096, hard_frame_factor=4) as srv:
        with Client(srv.url) as c:
            c.init()
            big = ["w"] * 600  # ~ 12 kB: over the limit, under the hard cap
            c.update(big)
            err = c.recv()
            assert err["code"] == "bad_protocol" and "exceeds" in err["message"] and "4096" in err["message"]
            still_translates(c)
            # past the hard cap the socket is closed (1009) before the frame is even read
            c.send("x" * (4096 * 4 + 10))
            with pytest.raises(ConnectionClosed) as closed:
                c.recv()
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 1009
        assert wait_for(lambda: srv.call(lambda: srv.server.stats.sessions_active) == 0)
        with Client(srv.url) as c:  # the server keeps serving
            c.init()
            still_translates(c)


def test_non_utf8_and_binary_frames(tmp_path):
    with fake_server(tmp_path) as srv, Client(srv.url) as c:
        c.init()
        c.ws.send(b"\xff\xfe\x00garbage")  # binary frame, not UTF-8
        err = c.recv()
        assert err["code"] == "bad_protocol" and "UTF-8" in err["message"]
        c.ws.send(b"\xc3\x28", text=True)  # a *text* frame with invalid UTF-8
        err = c.recv()
        assert err["code"] == "bad_protocol" and "UTF-8" in err["message"]
        still_translates(c)
        # a binary frame holding a valid update is read as JSON text
        c.ws.send(json.dumps({"type": "update", "seq": 50, "words": [["ok", None, None]]}).encode())
        assert c.recv()["seq"] == 50


def test_seq_going_backwards_is_refused_and_later_seqs_work(tmp_path):
    with fake_server(tmp_path) as srv, Client(srv.url) as c:
        c.init()
        assert c.ask(SRC[:2])["seq"] == 1
        c.update(SRC[:3], seq=5)
        assert c.recv()["seq"] == 5
        c.update(SRC[:3], seq=5)  # repeated
        err = c.recv()
        assert err["code"] == "bad_protocol" and err["seq"] == 5 and "does not follow" in err["message"]
        c.update(SRC[:3], seq=3)  # backwards
        assert c.recv()["code"] == "bad_protocol"
        c.update(SRC[:4], seq=6)
        assert c.recv()["seq"] == 6


def test_utterance_id_going_backwards_is_refused(tmp_path):
    with fake_server(tmp_path) as srv, Client(srv.url) as c:
        c.init()
        c.ask(SRC[:2], utterance_id=3)
        err = c.ask(SRC[:2], utterance_id=2)
        assert err["code"] == "bad_protocol" and "utterance_id 2" in err["message"]
        assert c.ask(SRC[:3], utterance_id=3)["type"] == "translation"


def test_words_that_rewrite_history_never_retract_target(tmp_path):
    with fake_server(tmp_path) as srv, Client(srv.url) as c:
        c.init(preset="low_latency")
        a = c.ask(SRC[:4])
        assert a["committed_text"]
        b = c.ask(["a", "casual", "decoder"] + SRC[3:5])  # committed words changed under us
        assert b["committed_text"].startswith(a["committed_text"])
        c2 = c.ask(["x"])  # and shrank
        assert c2["committed_text"].startswith(b["committed_text"])


def test_engine_exception_is_processing_failed_and_the_session_continues(tmp_path):
    fail_on = lambda r: "boom" in r.source_words  # noqa: E731
    with fake_server(tmp_path, seam_options={"fail_when": fail_on}) as srv, Client(srv.url) as c:
        c.init()
        a = c.ask(SRC[:3])
        err = c.ask(SRC[:3] + ["boom"])
        assert err["type"] == "error" and err["code"] == "processing_failed" and err["seq"] == 2
        assert "fake engine failure" in err["message"]
        b = c.ask(SRC[:4])
        assert b["type"] == "translation" and b["committed_text"].startswith(a["committed_text"])


def test_client_vanishing_mid_update(tmp_path):
    with fake_server(tmp_path, seam_options={"delay_s": 0.3}) as srv:
        c = Client(srv.url)
        c.init()
        c.update(SRC[:3])
        assert wait_for(lambda: srv.factory.seams[0].calls == 1)  # the engine is drafting...
        c.close()  # ...when the client goes away
        raw = socket.create_connection(("127.0.0.1", srv.server.port))
        raw.close()  # and one that never spoke WebSocket at all
        assert wait_for(lambda: srv.call(lambda: srv.server.stats.sessions_active) == 0)
        time.sleep(0.4)  # the orphaned draft finishes on the engine thread; its reply goes nowhere
        with Client(srv.url) as c:
            c.init()
            assert c.ask(SRC[:3])["type"] == "translation"


def test_queued_partials_coalesce_but_finals_are_never_dropped(tmp_path):
    with fake_server(tmp_path, seam_options={"delay_s": 0.15}) as srv, Client(srv.url) as c:
        c.init(preset="low_latency")
        for k in range(1, 6):  # 5 partials while the first is still drafting
            c.update(SRC[:k])
        c.update(SRC[:6], final=True)  # seq 6
        c.update(["next"], utterance_id=1)  # seq 7
        c.update(["next", "one"], utterance_id=1)  # seq 8
        replies = []
        while not replies or replies[-1]["seq"] < 8:
            replies.append(c.recv())
        seqs = [r["seq"] for r in replies]
        assert seqs == sorted(seqs) and 6 in seqs and seqs[-1] == 8
        assert len(seqs) < 8  # some partials were coalesced
        final = next(r for r in replies if r["seq"] == 6)
        assert final["final"] and final["committed_text"].startswith("W0:the")
        assert srv.call(lambda: srv.server.stats.coalesced) == 8 - len(seqs)


def test_updates_past_the_word_limits_are_refused(tmp_path):
    with fake_server(tmp_path, max_update_words=50, max_word_chars=20) as srv, Client(srv.url) as c:
        c.init()
        c.update([f"w{i}" for i in range(51)])
        err = c.recv()
        assert err["code"] == "bad_protocol" and "limit is 50" in err["message"] and err["seq"] == 1
        c.update(["x" * 21])
        assert "21 characters" in c.recv()["message"]
        r = c.ask([f"w{i}" for i in range(50)])  # at the limit: translated
        assert r["type"] == "translation"
