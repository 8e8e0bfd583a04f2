"""The user's path, end to end: the unmodified `whisperlivekit-server` (faster-whisper, LocalAgreement,
the packaged tiny.en) hears a packaged clip through its own WebSocket and asks `alignatt serve`
(the embedded model) for translations. Translations arrive, the committed transcript only grows,
and every word WhisperLiveKit committed is covered by the final translation of its utterance.

On 2 CPU cores the recogniser and the MT model share the machine, so the audio is fed at half real
time (SPEED); nothing is downloaded (the clip and tiny.en come from packages, the warm-up file is
local, the hub is offline)."""

import os
import subprocess
import sys

import pytest

from alignatt.measure.server_process import free_port, http_json
from alignatt.speech.wlk_server import Relay, feed_pcm, wlk_server_command

pytestmark = pytest.mark.slow

SPEED = 0.5  # x real time: two cores run both the recogniser and the MT model
CLIP = "beckett"  # 10 s, six short sentences


def _wait(process, log, port, path, what, seconds=240):
    import time

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"{what} exited ({process.returncode}):\n{log.read_text()[-4000:]}")
        try:
            if http_json(port, path, timeout=2)[0] == 200:
                return
        except OSError:
            pass
        time.sleep(0.5)
    pytest.fail(f"{what} did not answer {path} within {seconds} s")


@pytest.fixture
def servers(tmp_path):
    pytest.importorskip("fastapi", reason="the wlk-server extra is not installed")
    from alignatt.speech.clips import fetch
    from alignatt.speech.recognise import model_dir

    clip = fetch(CLIP)
    offline = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    env = {**offline, "XDG_CACHE_HOME": str(tmp_path / "cache")}  # WhisperLiveKit: an empty model cache
    mt_port, wlk_port = free_port(), free_port()
    logs = {name: tmp_path / f"{name}.log" for name in ("mt", "wlk")}  # files: a full pipe would block a server
    with logs["mt"].open("w") as out:
        mt = subprocess.Popen([sys.executable, "-m", "alignatt.cli", "serve", "--port", str(mt_port)],
                              stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                              env=offline)  # the embedded model: alignatt's own cache, no hub
    procs = [mt]
    try:
        _wait(mt, logs["mt"], mt_port, "/health", "alignatt serve")
        with Relay(f"ws://127.0.0.1:{mt_port}") as relay:
            with logs["wlk"].open("w") as out:
                wlk = subprocess.Popen(wlk_server_command(wlk_port, relay.url, model_dir("tiny.en"), clip),
                                       stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=env,
                                       cwd=tmp_path)
            procs.append(wlk)
            _wait(wlk, logs["wlk"], wlk_port, "/health", "whisperlivekit-server")
            yield f"ws://127.0.0.1:{wlk_port}/asr", clip, relay
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()


def test_a_clip_through_whisperlivekit_is_translated_word_by_word(servers):
    from alignatt.speech.recognise import load_audio

    url, clip, relay = servers
    shown = feed_pcm(url, load_audio(clip), chunk_s=0.5, speed=SPEED, timeout_s=180)

    # What a viewer saw: the committed transcript only grows, and translations arrive.
    committed = ["".join(line.get("text") or "" for line in m.get("lines", [])) for m in shown]
    assert committed[-1].strip(), "WhisperLiveKit committed nothing"
    for before, after in zip(committed, committed[1:]):
        assert after.startswith(before), f"committed text shrank: {before!r} -> {after!r}"
    translated = [line.get("translation") for line in shown[-1]["lines"] if line.get("translation")]
    assert translated, "no translation reached WhisperLiveKit's output"

    # What the two servers said: every utterance WhisperLiveKit closed was answered, and its final
    # translation covers every word it committed.
    updates = {}
    for f in relay.frames:
        if f.direction == "up" and f.data.get("type") == "update":
            updates[f.data["seq"]] = f.data
    finals = [f.data for f in relay.frames if f.direction == "down" and f.data.get("type") == "translation"
              and f.data.get("final")]
    closed = [u for u in updates.values() if u["is_final"]]
    assert closed and len(finals) == len(closed)
    sent_words = sum(len(u["words"]) for u in closed)
    assert sent_words >= 10  # "Ever tried. Ever failed. ..." heard as committed words
    for reply in finals:
        words = updates[reply["seq"]]["words"]
        assert reply["covered_source_units"] == len(words), (words, reply)
        assert reply["committed_text"].strip()
