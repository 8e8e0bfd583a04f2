"""The server's bounds (issue 10): failures inside a session, slow readers, token budgets, timeouts, logs.

Loopback only, fake engines; every loop is bounded and every test stops by itself.
"""

import json
import re
import time
from pathlib import Path

import pytest
from websockets.exceptions import ConnectionClosed

from alignatt.serve import connection as connection_module
from alignatt.serve.config import ServerLimits
from alignatt.serve.connection import Connection
from alignatt.serve.protocol import ErrorFrame, TranslationFrame
from alignatt.serve.records import ByteBoundedLog
from alignatt.serve.session import Session
from tests.support.server_client import Client, StalledClient, fake_server
from tests.serve.test_server_hardening import still_translates, wait_for

SRC = "the causal encoder processes each block once.".split()


def _raise(*args, **kwargs):
    raise RuntimeError("injected failure")


async def _araise(*args, **kwargs):
    raise RuntimeError("injected failure")


def answered_or_closed(c: Client, seq: int) -> str:
    """'reply' when a frame answering `seq` arrives, 'closed' on a close with a code and a reason."""
    try:
        while True:
            r = c.recv(timeout=5)
            if r["type"] == "error" or (r.get("seq") is not None and r["seq"] >= seq):
                return "reply"
    except ConnectionClosed as e:
        assert e.rcvd is not None and e.rcvd.code in (1008, 1011) and e.rcvd.reason, e
        return "closed"


# Every stage of answering an update, and of the replies that carry it.
STAGES = {
    "session_plan": lambda mp: mp.setattr(Session, "plan", _raise),
    "session_apply": lambda mp: mp.setattr(Session, "apply", _raise),
    "translation_frame": lambda mp: mp.setattr(connection_module, "translation_frame", _raise),
    "frame_to_json": lambda mp: mp.setattr(TranslationFrame, "to_json", _raise),
    "error_to_json_too": lambda mp: (mp.setattr(Session, "apply", _raise), mp.setattr(ErrorFrame, "to_json", _raise)),
    "step_log": lambda mp: mp.setattr(ByteBoundedLog, "append", _raise),
    "process": lambda mp: mp.setattr(Connection, "_process", _araise),
    "send": lambda mp: mp.setattr(Connection, "_send", _raise),
}


@pytest.mark.parametrize("stage", sorted(STAGES))
def test_a_failure_at_any_stage_is_a_reply_or_a_clean_close(tmp_path, monkeypatch, stage):
    with fake_server(tmp_path) as srv:
        with monkeypatch.context() as mp:
            STAGES[stage](mp)
            with Client(srv.url) as c:
                outcomes = []
                try:
                    c.init()
                    for k in (2, 3):  # a second update: the worker is still there
                        seq = c.update(SRC[:k])
                        outcomes.append(answered_or_closed(c, seq))
                        if outcomes[-1] == "closed":
                            break
                except ConnectionClosed as e:  # the init itself could not be answered
                    assert e.rcvd is not None and e.rcvd.code == 1011 and e.rcvd.reason
                    outcomes.append("closed")
                assert outcomes and set(outcomes) <= {"reply", "closed"}
        assert wait_for(lambda: srv.call(lambda: srv.server.stats.sessions_active) == 0)
        with Client(srv.url) as c:  # the server itself is unharmed
            c.init()
            still_translates(c)


def test_the_old_silent_death_a_surrogate_prefix_is_refused_at_init(tmp_path):
    with fake_server(tmp_path) as srv, Client(srv.url) as c:
        c.send('{"type": "init", "protocol_version": 1, "source_lang": "en", "target_lang": "de", '
               '"accepted_target_prefix": "Das \\ud800"}')
        err = c.recv()
        assert err["code"] == "bad_protocol" and "surrogate" in err["message"]
        assert c.init(accepted_target_prefix="Das")["type"] == "init_ok"
        for final in (False, True):
            assert c.ask(SRC[:3], final=final)["type"] == "translation"


def test_a_client_that_stops_reading_is_closed_and_others_are_not_held(tmp_path):
    limits = dict(max_outgoing_bytes=1 << 20, max_pending_finals=1000, max_prompt_tokens=10**6,
                  max_target_prefix_tokens=10**6, send_stall_s=60)
    with fake_server(tmp_path, seam_options={"max_positions": 10**7}, **limits) as srv:
        stalled = StalledClient(srv.url)
        stalled.send({"type": "init", "protocol_version": 1, "source_lang": "en", "target_lang": "de"})
        long_words = [[f"{i:03d}" + "x" * 190, None, None] for i in range(400)]  # ~100 kB per reply
        with Client(srv.url) as other:
            other.init()
            sent, worst_ms = 0, 0.0
            for u in range(120):
                if not stalled.send({"type": "update", "seq": u + 1, "utterance_id": u, "words": long_words,
                                     "is_final": True}):
                    break
                sent += 1
                started = time.perf_counter()
                still_translates(other, (f"w{u}", "x"))  # the other session answers meanwhile
                worst_ms = max(worst_ms, (time.perf_counter() - started) * 1000)
                if srv.call(lambda: srv.server.stats.closes["slow_reader"]):
                    break
            assert wait_for(lambda: srv.call(lambda: srv.server.stats.closes["slow_reader"]) == 1, 10)
            assert worst_ms < 2000, worst_ms
            still_translates(other)
        stalled.close()
        assert wait_for(lambda: srv.call(lambda: srv.server.stats.sessions_active) == 0, 15)


def test_a_send_blocked_past_the_stall_limit_closes_the_session(tmp_path):
    limits = dict(max_outgoing_bytes=1 << 30, max_outgoing_frames=10**6, max_pending_finals=1000,
                  max_prompt_tokens=10**6, max_target_prefix_tokens=10**6, send_stall_s=1.0)
    with fake_server(tmp_path, seam_options={"max_positions": 10**7}, **limits) as srv:
        stalled = StalledClient(srv.url)
        stalled.send({"type": "init", "protocol_version": 1, "source_lang": "en", "target_lang": "de"})
        long_words = [[f"{i:03d}" + "x" * 190, None, None] for i in range(400)]
        for u in range(150):
            if srv.call(lambda: srv.server.stats.closes["send_stall"]) or not stalled.send(
                {"type": "update", "seq": u + 1, "utterance_id": u, "words": long_words, "is_final": True}
            ):
                break
        assert wait_for(lambda: srv.call(lambda: srv.server.stats.closes["send_stall"]) == 1, 15)
        stalled.close()
        assert wait_for(lambda: srv.call(lambda: srv.server.stats.sessions_active) == 0, 15)


def test_pending_finals_are_bounded(tmp_path):
    with fake_server(tmp_path, seam_options={"delay_s": 0.3}, max_pending_finals=3) as srv, Client(srv.url) as c:
        c.init()
        # the server may close while the finals are still being sent: either way it closes with 1008
        with pytest.raises(ConnectionClosed) as closed:
            for u in range(8):
                c.update(SRC[:3], final=True, utterance_id=u)
            while True:
                c.recv(timeout=5)
        assert closed.value.rcvd.code == 1008 and "finals queued" in closed.value.rcvd.reason
        assert srv.call(lambda: srv.server.stats.closes["pending_finals"]) == 1


def test_a_connection_that_never_sends_init_is_closed(tmp_path):
    with fake_server(tmp_path, init_timeout_s=0.5) as srv:
        with Client(srv.url) as c:
            with pytest.raises(ConnectionClosed) as closed:
                c.recv(timeout=5)
            assert closed.value.rcvd.code == 1008 and "no init" in closed.value.rcvd.reason
        with Client(srv.url) as c:  # init in time: the timeout no longer applies
            c.init()
            time.sleep(0.8)
            still_translates(c)


def test_token_bounds_refuse_updates_with_bad_protocol_naming_the_bound(tmp_path):
    with fake_server(tmp_path, max_prompt_tokens=100, max_target_prefix_tokens=20) as srv:
        with Client(srv.url) as c:
            c.init()
            long_words = ["y" * 200] * 3  # 5 + 3 x 50 fake tokens: under every word limit
            for final in (False, True):
                err = c.ask(long_words, final=final)
                assert err["type"] == "error" and err["code"] == "bad_protocol", err
                assert "max_prompt_tokens=100" in err["message"] and err["seq"] == c.seq
            still_translates(c)
        with Client(srv.url) as c:
            err = c.init(accepted_target_prefix=" ".join(["Wort"] * 30))
            assert err["code"] == "bad_protocol" and "max_target_prefix_tokens=20" in err["message"]
            assert c.init(accepted_target_prefix="Das Wort")["type"] == "init_ok"
        with Client(srv.url) as c:
            err = c.init(history=[["a " * 5000, "b"]])
            assert err["code"] == "bad_protocol" and "max_context_tokens" in err["message"]


def test_token_bounds_are_derived_from_the_models_positions(tmp_path):
    with fake_server(tmp_path, seam_options={"max_positions": 300}) as srv, Client(srv.url) as c:
        c.init()
        budget = srv.call(lambda: next(iter(srv.server._budgets.values())))
        assert budget.positions == 300 and budget.max_prompt_tokens == 300 - 256
        err = c.ask(["z" * 8] * 30)  # 5 + 60 tokens > 44
        assert err["code"] == "bad_protocol" and "max_prompt_tokens=44" in err["message"]
        assert "300 positions" in err["message"]


def test_missing_utterance_id_is_the_open_utterance(tmp_path):
    with fake_server(tmp_path) as srv, Client(srv.url) as c:
        c.init(preset="low_latency")
        frames = []
        for words, final in ((SRC[:2], False), (SRC[:3], True), (["next"], False), (["next", "one"], True)):
            c.send({"type": "update", "seq": len(frames) + 1, "words": words, "is_final": final})
            frames.append(c.recv())
        assert [f["type"] for f in frames] == ["translation"] * 4, frames
        assert [f["utterance_id"] for f in frames] == [0, 0, 1, 1]
        assert frames[3]["committed_text"].startswith("W0:next")


def test_words_with_inner_whitespace_are_bad_protocol_on_the_wire(tmp_path):
    with fake_server(tmp_path) as srv, Client(srv.url) as c:
        c.init()
        err = c.ask(["two words"])
        assert err["code"] == "bad_protocol" and "whitespace" in err["message"]
        assert srv.call(lambda: srv.server.stats.errors["processing_failed"]) == 0
        still_translates(c)


@pytest.mark.parametrize(
    "frame",
    [
        '{"type": "update", "seq": 1, "clock_ms": ' + "7" * 5000 + "}",
        '{"type": "update", "seq": ' + "1" * 4400 + "}",
        '{"type": "init", "protocol_version": 1, "source_lang": "en", "target_lang": "de", '
        '"overrides": {"\\udc80": 1}}',
    ],
)
def test_parse_errors_that_used_to_drop_the_socket(tmp_path, frame):
    with fake_server(tmp_path) as srv, Client(srv.url) as c:
        c.send(frame)
        err = c.recv()
        assert err["type"] == "error" and err["code"] == "bad_protocol"
        c.init()
        still_translates(c)


def test_control_characters_from_the_engine_are_not_emitted(tmp_path):
    with fake_server(tmp_path, seam_options={"leak": "a\x1b[2Jb \u202eevil\u2069"}) as srv, Client(srv.url) as c:
        c.init(preset="low_latency")
        r = c.ask(["bell\x07", "rtl\u202bx"], final=True)
        assert r["type"] == "translation"
        for key in ("committed_text", "committed_delta", "buffer_text"):
            assert not re.search("[\x00-\x09\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]", r[key]), r[key]
        assert "W0:bell" in r["committed_text"] and "W1:rtlx" in r["committed_text"]


def test_logs_are_bounded_in_bytes(tmp_path):
    with fake_server(tmp_path, step_log_bytes=20_000, session_log_bytes=10_000,
                     max_target_prefix_tokens=10**6, max_prompt_tokens=10**6, max_init_frame_bytes=256 * 1024,
                     seam_options={"max_positions": 10**7}) as srv:
        for _ in range(6):  # big prefixes: each init record would be ~100 kB uncut
            with Client(srv.url) as c:
                c.init(accepted_target_prefix="p" * 100_000)
                for k in range(1, 30):
                    c.ask([f"{k}" + "q" * 150] * k)
        steps = srv.call(lambda: (srv.server.step_log.bytes, len(srv.server.step_log), srv.server.step_log.dropped))
        inits = srv.call(lambda: (srv.server.session_log.bytes, list(srv.server.session_log)))
    assert steps[0] <= 20_000 and steps[2] > 0 and steps[1] < 6 * 29
    assert inits[0] <= 10_000 and inits[1][-1]["accepted_target_prefix_chars"] == 100_000
    assert len(inits[1][-1]["accepted_target_prefix"]) < 100_000


def test_byte_bounded_log_drops_the_oldest():
    log = ByteBoundedLog(1000)
    for i in range(100):
        log.append({"i": i, "text": "x" * 50})
    assert log.bytes <= 1000 and [e["i"] for e in log][-1] == 99 and log.dropped == 100 - len(log)
    assert len(json.dumps(list(log))) <= 1000 + 2 * len(log)


def test_the_docs_list_every_limit_with_its_default():
    doc = (Path(__file__).resolve().parents[2] / "docs" / "server.md").read_text(encoding="utf-8")
    rows = dict(re.findall(r"^\| `(\w+)` \| `([^`]+)` \|", doc, flags=re.M))
    for name, field in ServerLimits.model_fields.items():
        assert name in rows, f"docs/server.md does not list the limit {name}"
        assert rows[name] == repr(field.default), (name, rows[name], field.default)
    assert "1009" in doc and "bad_protocol" in doc


def test_a_failure_while_opening_a_session_frees_its_slot(tmp_path, monkeypatch):
    with fake_server(tmp_path, max_sessions=1) as srv:
        with monkeypatch.context() as mp:
            mp.setattr(Session, "__init__", _raise)
            with Client(srv.url) as c:
                err = c.init()
                assert err["code"] == "processing_failed" and "cannot open a session" in err["message"]
                assert srv.call(lambda: srv.server.stats.sessions_active) == 0
        with Client(srv.url) as c:  # the one slot is free again
            assert c.init()["type"] == "init_ok"
            still_translates(c)
