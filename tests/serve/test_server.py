"""The MT server over a real WebSocket: init, partials, commit fast path, finals, presets, directions."""

import json
import threading

import pytest

from alignatt.core.errors import AlignattError
from alignatt.serve.config import SESSION_PRESETS, resolve_preset, server_config
from tests.support.server_client import Client, fake_server

SRC = "the causal encoder processes each block once.".split()


def test_init_ok_reports_session_setup_and_unknown_overrides(tmp_path):
    with fake_server(tmp_path) as srv, Client(srv.url) as c:
        ok = c.init(
            overrides={
                "translation_alignatt_hold_back_target_units": 1,
                "translation_alignatt_min_emit_target_units": 0,
                "translation_alignatt_beam": 4,
            },
            colour="blue",
        )
        assert ok["type"] == "init_ok" and ok["protocol_version"] == 1
        assert ok["direction"] == "en-de" and ok["preset"] == "balanced" and ok["model"] == "fake"
        assert ok["policy"]["hold_back_words"] == 1 and ok["policy"]["min_emit_words"] == 0
        assert ok["unknown_overrides"] == ["translation_alignatt_beam"]
        assert ok["ignored_fields"] == ["colour"]
        assert ok["heads"] == [[0, 0], [0, 1]]


def test_stream_partial_fast_path_and_final_over_the_wire(tmp_path):
    with fake_server(tmp_path) as srv, Client(srv.url) as c:
        c.init(preset="balanced")
        a = c.ask(SRC[:3], SRC[3:5])
        assert a["type"] == "translation" and a["seq"] == 1 and a["path"] == "draft"
        assert a["committed_text"] == "W0:the W1:causal" and a["engine_calls"] == 1
        assert a["buffer_text"] == " W2:encoder W3:processes W4:each"
        assert a["stop_reason"] == "alignatt:source_frontier" and a["final"] is False
        b = c.ask(SRC[:4], SRC[4:5])  # commit only: released from the cached draft
        assert b["path"] == "fast_path" and b["engine_calls"] == 0
        assert b["committed_delta"] == " W2:encoder"
        assert b["committed_text"].startswith(a["committed_text"])
        f = c.ask(SRC, final=True)
        assert f["final"] is True and f["forced_final"] is False and f["utterance_id"] == 0
        assert f["committed_text"].startswith(b["committed_text"])
        assert f["committed_text"].endswith("W6:once.")
        n = c.ask(["next"], utterance_id=1)
        assert n["utterance_id"] == 1 and n["committed_text"] == ""
        assert srv.factory.seams[0].calls == 3
        stats = srv.call(lambda: srv.server.stats)
        assert stats.paths["fast_path"] == 1 and stats.engine_calls == 3


def test_forced_final_past_the_utterance_limit(tmp_path):
    with fake_server(tmp_path, max_utterance_words=4) as srv, Client(srv.url) as c:
        c.init()
        r = c.ask(SRC[:5], SRC[5:])
        assert r["final"] and r["forced_final"] and r["utterance_id"] == 0
        assert r["committed_text"] == "W0:the W1:causal W2:encoder W3:processes W4:each"
        assert c.ask(["more"], utterance_id=1)["utterance_id"] == 1


def test_presets_and_client_aliases():
    assert resolve_preset("quality").name == "high_latency"
    assert resolve_preset("low").name == "low_latency"
    assert set(SESSION_PRESETS) == {"low_latency", "balanced", "high_latency"}


def test_unknown_preset_is_an_error_frame_and_the_connection_stays(tmp_path):
    with fake_server(tmp_path) as srv, Client(srv.url) as c:
        err = c.init(preset="turbo")
        assert err["type"] == "error" and err["code"] == "unknown_preset"
        assert "balanced" in err["supported"] and "quality" in err["supported"]
        assert c.init(preset="low")["preset"] == "low_latency"


def test_unsupported_direction_lists_the_supported_ones(tmp_path):
    with fake_server(tmp_path) as srv, Client(srv.url) as c:
        err = c.init(target_lang="ja")
        assert err["code"] == "unsupported_direction" and err["supported"] == ["en-de"]
        assert c.init()["type"] == "init_ok"


def test_two_directions_draft_with_their_own_heads(tmp_path):
    with fake_server(tmp_path, directions=("en-de", "en-fr")) as srv:
        with Client(srv.url) as de, Client(srv.url) as fr:
            ok_de, ok_fr = de.init(), fr.init(target_lang="fr")
            assert ok_de["heads"] == [[0, 0], [0, 1]] and ok_fr["heads"] == [[1, 0], [1, 1]]
            de.ask(SRC[:3]), fr.ask(SRC[:3])
        # One engine for the model's directions: it captures the union of their heads once.
        (seam,) = srv.factory.seams
        assert [(h.layer, h.head) for h in seam.heads] == [(0, 0), (0, 1), (1, 0), (1, 1)]
        assert [r.target_lang for r in seam.requests] == ["de", "fr"]


def test_reconnect_resumes_append_only_from_the_accepted_prefix(tmp_path):
    with fake_server(tmp_path) as srv:
        with Client(srv.url) as c:
            c.init(preset="low_latency")
            shown = c.ask(SRC[:3], utterance_id=5)["committed_text"]
        with Client(srv.url) as c:
            c.init(preset="low_latency", accepted_target_prefix=shown, history=[["a b", "A B"]])
            r = c.ask(SRC[:5], utterance_id=5)
            assert r["committed_text"].startswith(shown) and r["committed_text"] != shown
            assert srv.factory.seams[0].requests[-1].target_prefix == shown


def test_concurrent_sessions_share_one_engine_thread(tmp_path):
    n = 6
    with fake_server(tmp_path, seam_options={"delay_s": 0.01}, max_sessions=n) as srv:
        results, errors = {}, []

        def run(i):
            try:
                with Client(srv.url) as c:
                    c.init()
                    words = [f"s{i}w{j}" for j in range(6)]
                    shown = ""
                    for k in range(1, 7):
                        r = c.ask(words[:k], words[k:])
                        assert r["committed_text"].startswith(shown)
                        shown = r["committed_text"]
                    results[i] = c.ask(words, final=True)["committed_text"]
            except Exception as e:  # reported below
                errors.append(repr(e))

        threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not errors
        for i in range(n):  # no cross-talk between sessions
            assert results[i] == " ".join(f"W{j}:s{i}w{j}" for j in range(6))
        seam = srv.factory.seams[0]
        assert len(srv.factory.seams) == 1 and len(seam.threads) == 1
        assert next(iter(seam.threads)).startswith("engine-")


def test_session_limit_answers_busy(tmp_path):
    with fake_server(tmp_path, max_sessions=2) as srv:
        a, b, c = Client(srv.url), Client(srv.url), Client(srv.url)
        try:
            assert a.init()["type"] == "init_ok" and b.init()["type"] == "init_ok"
            err = c.init()
            assert err["code"] == "busy"
            a.close()
            for _ in range(100):  # the slot frees once the server saw the close
                if srv.call(lambda: srv.server.stats.sessions_active) < 2:
                    break
                threading.Event().wait(0.02)
            with Client(srv.url) as d:
                assert d.init()["type"] == "init_ok"
        finally:
            for x in (b, c):
                x.close()


def test_server_config_from_options_and_file(tmp_path):
    cfg = server_config(model="gemma4-e4b-synthetic", seam="vllm_capture", device="cuda", port=0)
    assert cfg.directions["en-de"].seam == "vllm_capture" and cfg.directions["en-de"].seam_options == {}
    eager = server_config(seam="vllm_capture", vllm_mode="eager").directions["en-de"]
    assert eager.seam_options == {"vllm_mode": "eager"}
    path = tmp_path / "server.json"
    path.write_text(json.dumps({"directions": {"en-de": {"model": "m"}, "en-fr": {"model": "n"}}}))
    assert sorted(server_config(config_path=str(path)).directions) == ["en-de", "en-fr"]
    with pytest.raises(AlignattError, match="unknown preset"):
        server_config(preset="turbo")
    with pytest.raises(AlignattError, match="bad direction"):
        server_config(direction="german")
    path.write_text(json.dumps({"directions": {"en-de": {"modle": "m"}}}))
    with pytest.raises(AlignattError, match="bad server config"):
        server_config(config_path=str(path))


@pytest.mark.parametrize("stop_signal", ["SIGINT", "SIGTERM"])
def test_foreground_serve_answers_and_stops_on_interrupt(tmp_path, stop_signal):
    """`serve()` (what `alignatt serve` runs) in a subprocess: listens, answers, and on Ctrl-C or
    SIGTERM stops, closing its seams."""
    import os
    import signal
    import subprocess
    import sys
    from pathlib import Path

    from tests.support.server_client import fake_config

    cfg = fake_config(tmp_path)
    script = (
        "import sys\n"
        "from alignatt.serve.server import ServerConfig, serve\n"
        "from tests.support.server_client import FakeFactory\n"
        "cfg = ServerConfig.model_validate_json(sys.argv[1])\n"
        "factory = FakeFactory()\n"
        "serve(cfg, factory, on_ready=lambda s: print('port', s.port, flush=True))\n"
        "print('stopped', all(s.closed_on for s in factory.seams), len(factory.seams), flush=True)\n"
    )
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "PYTHONFAULTHANDLER": "1"}  # a server that does not stop dumps its threads on SIGABRT
    # Ctrl-C as in a terminal: a suite started in the background (`pytest &`) runs with SIGINT
    # ignored, the child would inherit that, and Python then installs no KeyboardInterrupt handler.
    proc = subprocess.Popen([sys.executable, "-c", script, cfg.model_dump_json()], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=root,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        line = proc.stdout.readline()
        assert line.startswith("port "), (line, proc.stderr.read() if proc.poll() is not None else "")
        with Client(f"ws://127.0.0.1:{int(line.split()[1])}") as c:
            assert c.init()["type"] == "init_ok"
            assert c.ask(SRC[:3])["committed_text"] == "W0:the W1:causal"
        proc.send_signal(getattr(signal, stop_signal))
        try:
            out, _ = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGABRT)
            _, err = proc.communicate(timeout=20)
            pytest.fail(f"serve() did not stop within 60 s of {stop_signal}; its threads:\n{err[-8000:]}")
        assert proc.returncode == 0 and "stopped True 1" in out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_serve_command_reports_bad_options():
    from typer.testing import CliRunner

    from alignatt.cli import app

    r = CliRunner().invoke(app, ["serve", "--preset", "turbo"])
    assert r.exit_code == 2 and "error: unknown preset 'turbo'" in r.output


def test_served_seams_are_closed_on_their_engine_thread_at_shutdown(tmp_path):
    with fake_server(tmp_path, directions=("en-de", "en-fr")) as srv:
        for target in ("de", "fr"):
            with Client(srv.url) as c:
                assert c.init(target_lang=target)["type"] == "init_ok"
                c.update(["hello"], final=True)
                assert c.recv()["type"] == "translation"
        seams = srv.factory.seams
        assert len(seams) == 1 and all(s.closed_on is None for s in seams)  # one engine for both directions
    for seam in seams:
        assert seam.closed_on is not None and seam.closed_on in seam.threads  # built, drafted, closed there
