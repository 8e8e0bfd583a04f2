"""The user's path, end to end: the unmodified `whisperlivekit-server` (faster-whisper, LocalAgreement,
the packaged tiny.en) hears a packaged clip through its own WebSocket and asks `alignatt serve`
(the embedded model) for translations, run as `alignatt speech-e2e` runs it
(`measure/speech_e2e.py:run_speech_e2e`). Translations arrive, committed text only grows, every
word WhisperLiveKit committed is covered by a committed translation by the end, and each has its
caption delay.

On 2 CPU cores the recogniser and the MT model share the machine, so the audio is fed at half real
time (SPEED, as params.yaml's cpu `speech_e2e:`): the caption delay is then on the audio's clock.
Nothing is downloaded (the clip and tiny.en come from packages, the warm-up file is the clip, the
hub is offline)."""

import pytest

pytestmark = pytest.mark.slow

SPEED = 0.5  # x real time: two cores run both the recogniser and the MT model
CLIP = "beckett"  # 10 s, six short sentences


def test_a_clip_through_whisperlivekit_is_translated_word_by_word(tmp_path):
    pytest.importorskip("fastapi", reason="the wlk-server extra is not installed")
    from alignatt.measure.speech_e2e import run_speech_e2e
    from alignatt.record.artifacts import SpeechE2EOptions, load_artifact
    from alignatt.speech.clips import CLIPS, transcript

    out = tmp_path / "e2e.json"
    written = run_speech_e2e(SpeechE2EOptions(clip=CLIP, speed=SPEED, chunk_s=0.5, timeout_s=180), out)
    a = load_artifact(out)
    assert a == written and a.kind == "speech_e2e"
    assert a.clip.sha256 == CLIPS[CLIP].sha256 and a.clip.licence and abs(a.clip.seconds - CLIPS[CLIP].seconds) < 0.1
    assert a.config.speed == SPEED and a.whisperlivekit and a.wlk_command[0].endswith("whisperlivekit-server")

    # translations arrived, at the two servers and in what WhisperLiveKit showed
    assert a.replies_with_committed_text > 0 and a.shown_translations > 0
    assert a.error_frames == 0 and a.finals > 0
    # committed text only grew: the source WhisperLiveKit sent, its shown transcript, our translation
    assert (a.source_retractions, a.transcript_retractions, a.translation_retractions) == (0, 0, 0)
    # every committed word covered by the end, each with a caption delay
    assert a.committed_words >= 10  # "Ever tried. Ever failed. ..." heard as committed words
    assert a.words_never_covered == 0
    assert all(w.covered_s is not None and w.covered_s >= w.end_s for w in a.words)
    assert a.caption_delay_s_p50 is not None and 0 < a.caption_delay_s_p50 <= a.caption_delay_s_p95
    assert a.rtt_ms_p50 is not None and a.rtt_ms_p50 > 0
    # WER against the transcript where the clip's package ships one
    if transcript(CLIP):
        assert a.wer_committed is not None
    else:
        assert a.wer_committed is None and "no transcript" in a.wer_reason
