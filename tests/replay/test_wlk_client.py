"""The unmodified WhisperLiveKit 0.2.26 client (`translation_alignatt.py`) against our server.

Needs `pip install --no-deps whisperlivekit==0.2.26` (its client imports only `websockets` and the
package's dataclasses); skipped with that hint otherwise. The module file is checked byte for byte
against the published wheel's hash, so these tests run the client exactly as released.
"""

import base64
import hashlib
import importlib
import logging
import time

import pytest

from alignatt.replay.wlk_client import WLK_INSTALL_HINT, load_wlk_client
from tests.support.server_client import fake_server

try:
    WLK = load_wlk_client()
    TIMED = importlib.import_module("whisperlivekit.timed_objects")
except Exception as e:  # not installed here
    pytest.skip(f"WhisperLiveKit client not importable ({e}); {WLK_INSTALL_HINT}", allow_module_level=True)

# sha256 of whisperlivekit/translation_alignatt.py in whisperlivekit-0.2.26-py3-none-any.whl (RECORD)
PUBLISHED_SHA256 = "zsdNPj7GyzzZpZlmFEDcWD6nPziUov6a-NDxG_6nzzs"

# websockets 17 warns about the client's direct `connect()` call (its code, not ours).
pytestmark = pytest.mark.filterwarnings("ignore:connect\\(\\) must be used:DeprecationWarning")

SENTENCE = "The causal encoder processes each audio block exactly once.".split()


def test_the_client_is_the_published_file():
    data = open(WLK.__file__, "rb").read()
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    assert digest == PUBLISHED_SHA256
    assert WLK.PROTOCOL_VERSION == 1


def token(i: int, word: str):
    return TIMED.ASRToken(start=i * 0.4, end=i * 0.4 + 0.4, text=" " + word)


def tail(words):
    return TIMED.HypothesisTail(start=None, end=None, text=" ".join(words))


def new_client(url, latency="balanced", preset=None, target="de"):
    engine = WLK.AlignAttRemoteEngine(url=url, source_language="en", preset=preset, latency=latency)
    return engine.new_session(target)


def wait_partial_pacing():
    time.sleep(WLK._MIN_PARTIAL_INTERVAL_SECONDS + 0.05)  # the client paces tail-only updates


def test_stream_through_the_real_client_with_commit_fast_path(tmp_path):
    with fake_server(tmp_path) as srv:
        c = new_client(srv.url)
        assert c.wants_hypothesis_tail
        c.insert_tokens([tail(SENTENCE[:3])])
        seg, buf = c.process()
        assert seg is None and buf.text == ""  # nothing committed yet: nothing shown
        shown = ""
        for k in range(1, len(SENTENCE)):
            c.insert_tokens([token(k - 1, SENTENCE[k - 1]), tail(SENTENCE[k : k + 3])])
            seg, buf = c.process()
            assert seg is None and buf.text.startswith(shown)
            shown = buf.text
            # a tail-only update (new word arrives), then a commit-only one next round
            wait_partial_pacing()
            c.insert_tokens([tail(SENTENCE[k : k + 4])])
            c.process()
        assert shown.startswith("W0:The W1:causal")
        c.insert_tokens([token(len(SENTENCE) - 1, SENTENCE[-1])])  # "once." closes the sentence
        seg, buf = c.process()
        assert seg is not None and seg.text.startswith(shown) and seg.text.endswith("W8:once.")
        assert buf.text == ""
        assert c._history == [[" ".join(SENTENCE), seg.text]]
        stats = srv.call(lambda: srv.server.stats)
        assert stats.paths["fast_path"] >= 5 and stats.errors == {}
        fast = srv.call(lambda: [s for s in srv.server.step_log if s["path"] == "fast_path"])
        assert all(s["engine_calls"] == 0 for s in fast)
        assert any(s["committed_delta"] for s in fast)


@pytest.mark.parametrize(
    "latency, hold_back, min_emit",
    [("quality", 1, None), ("balanced", None, None), ("low", 0, 0)],
)
def test_latency_presets_and_their_overrides_are_accepted(tmp_path, latency, hold_back, min_emit):
    with fake_server(tmp_path) as srv:
        c = new_client(srv.url, latency=latency, preset="balanced")
        c.insert_tokens([token(0, "hello"), token(1, "world")])
        c.process()
        assert c._ws is not None and not c._down_warned
        init = srv.call(lambda: list(srv.server.session_log))[-1]
        assert init["unknown_overrides"] == [] and init["preset"] == "balanced"
        if hold_back is not None:
            assert init["policy"]["hold_back_words"] == hold_back
        if min_emit is not None:
            assert init["policy"]["min_emit_words"] == min_emit


@pytest.mark.parametrize("preset, target", [("turbo", "de"), (None, "ja")])
def test_refused_session_keeps_transcription_going(tmp_path, caplog, preset, target):
    with fake_server(tmp_path) as srv:
        c = new_client(srv.url, preset=preset, target=target)
        c.insert_tokens([token(0, "hello")])
        with caplog.at_level(logging.WARNING):
            seg, buf = c.process()
        assert seg is None and buf.text == "" and c._ws is None and c._down_warned
        code = "unknown_preset" if preset else "unsupported_direction"
        assert code in caplog.text


def test_reconnect_resumes_append_only(tmp_path):
    with fake_server(tmp_path) as srv:
        c = new_client(srv.url, latency="low")
        c.insert_tokens([token(i, w) for i, w in enumerate(SENTENCE[:4])])
        _, buf = c.process()
        shown = buf.text
        assert shown
        c._ws.close()  # the network drops under the client
        c.insert_tokens([token(4, SENTENCE[4])])
        c.process()  # fails, marks the sidecar down, schedules a retry
        deadline = time.monotonic() + 10
        while c._ws is None and time.monotonic() < deadline:
            time.sleep(0.1)
            c.insert_tokens([])
            _, buf = c.process()
        assert c._ws is not None, "the client did not reconnect"
        c.insert_tokens([token(5, SENTENCE[5])])
        _, buf = c.process()
        assert buf.text.startswith(shown) and buf.text != shown
        inits = srv.call(lambda: list(srv.server.session_log))
        assert len(inits) == 2 and inits[1]["accepted_target_prefix"] == shown


def test_engine_failure_drops_one_update_only(tmp_path):
    fail_on = lambda r: "boom" in r.source_words  # noqa: E731
    with fake_server(tmp_path, seam_options={"fail_when": fail_on}) as srv:
        c = new_client(srv.url, latency="low")
        c.insert_tokens([token(0, "hello"), token(1, "boom")])
        seg, buf = c.process()  # processing_failed: a warning, no output, still connected
        assert seg is None and c._ws is not None
        assert srv.call(lambda: srv.server.stats.errors["processing_failed"]) == 1
        c._utterance.tokens.clear()  # (test setup) the ASR re-segments without the bad word
        c.insert_tokens([token(2, "again"), token(3, "world.")])
        seg, buf = c.process()
        assert seg is not None and seg.text == "W0:again W1:world."


@pytest.mark.slow
def test_context_from_the_client_changes_what_is_drafted(gemma3_270m, monkeypatch):
    """`--alignatt-context` on the unmodified client: the embedded model's translation of the same
    speech names the person from the context, and does not without it."""
    # The client allows 15 s per call; a shared 2-core test machine can be slower than that.
    monkeypatch.setattr(WLK, "_CALL_TIMEOUT_SECONDS", 300.0)
    from alignatt.serve.config import DirectionRoute, ServerConfig
    from alignatt.serve.server import ServerThread

    cfg = ServerConfig(port=0, default_preset="low_latency",
                       directions={"en-de": DirectionRoute(model="gemma3-270m", seam="hf_qk_fast")})
    words = "Thank you, doctor.".split()
    finals = {}
    with ServerThread(cfg) as srv:
        for context in ("", "Names: Dr. Kowalczyk."):
            engine = WLK.AlignAttRemoteEngine(url=srv.url, source_language="en", preset=None,
                                              latency="low", context_text=context)
            c = engine.new_session("de")
            c.insert_tokens([token(i, w) for i, w in enumerate(words)])
            seg, _ = c.process()
            if seg is None:
                seg, _ = c.validate_buffer_and_reset()
            finals[context] = seg.text
        inits = srv.call(lambda: list(srv.server.session_log))
        drafted = srv.call(lambda: [s for s in srv.server.step_log if s["engine_calls"]])
    assert [i["context_chars"] for i in inits] == [0, len("Names: Dr. Kowalczyk.")]
    assert finals[""].startswith("Danke") and "Kowalczyk" not in finals[""], finals
    assert "Kowalczyk" in finals["Names: Dr. Kowalczyk."], finals
    assert {d["connection"] for d in drafted} == {1, 2}
