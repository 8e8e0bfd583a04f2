"""The page's "Real speech" section: smokes replayed on recognised streams (`--stream speech:<clip>`),
and the user's path end to end (`alignatt speech-e2e`: WhisperLiveKit's own server in front of ours).

Per speech stream, from its smoke artifact: what the recogniser did (committed WER where the clip
ships a transcript and the live tail's beside it, `alignatt/speech/recognise.py:tail_wer`; the
share of its steps whose shown tail was revised; its real-time factor),
what a viewer waited (caption delay p50/p95: a word's end in the audio to the first committed
translation covering it) and how much the shown translation flickered (normalized erasure of the
lockstep client). Beside them, the ASR error levels the eval seeds into its noisy tails, which
these measured figures are the real counterpart of. Quality is not scored: no package ships
reference translations of these clips.

The timeline figure plots, for each word of the stream, when it ended in the audio, when the
recogniser committed it, and when its translation was first shown and first committed
(`alignatt/speech/captions.py:word_times`). The word times come from the bundled recognised stream
the smoke replayed (package data, `alignatt/data/speech/`); a stream whose words no longer match
the artifact's count draws no figure.
"""

from __future__ import annotations

from typing import Any

from alignatt.core.errors import AlignattError
from alignatt.report.figures import Figure, new_figure, styled, svg_text
from alignatt.report.inputs import ReportInputs

NATIVE = "native"  # the lockstep client: the one whose replies the caption delay is timed on
# Okabe & Ito: black, orange, sky blue, bluish green
TIMELINE_COLORS = {"spoken": "#000000", "recognised": "#E69F00", "shown": "#56B4E9", "committed": "#009E73"}
NO_REFERENCES = ("Quality cannot be scored without references: no package ships translations of these clips, "
                 "so the rows say what a viewer waited and saw change, not how good the translation is.")


def speech_smokes(inputs: ReportInputs) -> list[tuple[str, Any]]:
    return [(rel, a) for rel, a in inputs.smokes if a.config.speech]


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{value * 100:.1f} %"


def _s(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f} s"


def _joined(parts: list[dict[str, Any]]) -> str:
    """A joined stream's clips, in order, with their packages (`alignatt/speech/clips.py:JOINED`)."""
    return " + ".join(f"{p.get('clip')} ({p.get('package')})" for p in parts) or "—"


def speech_rows(inputs: ReportInputs) -> list[dict[str, Any]]:
    """One row per smoke of a recognised stream."""
    from alignatt.replay.events import normalized_erasure
    from alignatt.report.rows import machine_of

    rows = []
    for rel, a in speech_smokes(inputs):
        speech = a.config.speech
        clip = speech.get("clip") or {}
        erasure = normalized_erasure([e for e in a.events if e.client == NATIVE])
        wer, wer_tail = speech.get("wer_committed"), speech.get("wer_tail")
        joined = clip.get("joined") or []
        rows.append(dict(
            date=a.provenance.date, machine=machine_of(a), source=rel, stream=a.config.stream,
            # random weights align nothing: a viewer would not wait what such a row says
            model=a.config.model + (" (synthetic weights: its alignment is random, so are its delays)"
                                    if a.provenance.synthetic_weights else ""),
            clip=clip.get("package") or clip.get("path") or _joined(joined),
            licence=clip.get("licence") or ", ".join(sorted({p.get("licence") for p in joined})) or "—",
            asr=f"faster-whisper {speech.get('asr_model')}", rtf=speech.get("real_time_factor"),
            audio_s=speech.get("audio_s"),
            wer="no transcript" if wer is None else _pct(wer),
            wer_tail="no transcript" if wer is None else _pct(wer_tail),
            tail_revised=_pct((speech.get("tail_revisions") or {}).get("revised_share")),
            delay_p50=_s(speech.get("caption_delay_s_p50")), delay_p95=_s(speech.get("caption_delay_s_p95")),
            caption_words=speech.get("caption_words"), never_covered=speech.get("words_never_covered"),
            erasure="—" if erasure is None else f"{erasure:.2f}", speed=a.config.speed,
        ))
    return sorted(rows, key=lambda r: (r["date"], r["source"]))


def recognised_levels(inputs: ReportInputs) -> list[dict[str, Any]]:
    """What a real recogniser did, per recognised stream with a transcript: the first smoke of it (a
    stream's WER is the bundled recognition's, the same whichever machine replayed it)."""
    out: dict[str, dict[str, Any]] = {}
    for rel, a in sorted(speech_smokes(inputs), key=lambda t: t[0]):
        speech = a.config.speech
        if speech.get("wer_committed") is None or a.config.stream in out:
            continue
        out[a.config.stream] = dict(
            source=rel, tail=f"recognised live (faster-whisper {speech.get('asr_model')}, `{a.config.stream}`)",
            committed=f"{_pct(speech.get('wer_committed'))} (measured)",
            errors=f"tail WER {_pct(speech.get('wer_tail'))} (prefix WER over the steps); tail revised at "
                   f"{_pct((speech.get('tail_revisions') or {}).get('revised_share'))} of the steps")
    return list(out.values())


def seeded_levels(inputs: ReportInputs) -> list[dict[str, Any]]:
    """The ASR errors each eval seeded into its replay, per tail kind that seeds any: `noisy` (gold
    committed words, a tail redrawn with errors at every event) and `asr@<wer>` (committed words with
    errors at a set WER, a tail that revises through early forms: `alignatt/evaluate/asr_errors.py`),
    after the measured levels they stand for (`recognised_levels`)."""
    out = recognised_levels(inputs)
    for rel, a in sorted(inputs.of_kind("eval"), key=lambda t: t[0]):
        for kind, tail in sorted((a.config.tail_descriptions or {}).items()):
            tail = tail.model_dump()
            if tail.get("tail_noise"):
                n = tail["tail_noise"]
                out.append(dict(source=rel, tail=kind, committed="0.0 % (gold)",
                                errors=f"each tail word replaced {_pct(n.get('p_wrong'))}, dropped "
                                       f"{_pct(n.get('p_drop'))}, split {_pct(n.get('p_split'))}; redrawn every event"))
            elif tail.get("asr_errors"):
                e = tail["asr_errors"]
                out.append(dict(source=rel, tail=kind, committed=f"{_pct(e.get('committed_wer'))} (set)",
                                errors=f"each early tail form another word {_pct(e.get('p_tail_revise'))}, over "
                                       f"{e.get('tail_stages')} stages, then the committed form"))
    return out


def _ms(value: float | None) -> str:
    return "—" if value is None else f"{value:.0f} ms"


def _clock(speed: float) -> str:
    """What the caption delay of a run at `speed` is: below 1x, the audio's clock, not a viewer's wait."""
    if speed < 1:
        return (f"fed at {speed:g}x: the delay is on the audio's clock (wall x {speed:g}), not what a live viewer "
                "on that machine would wait")
    return f"fed at {speed:g}x: the delay is what a live viewer waits"


def e2e_rows(inputs: ReportInputs) -> list[dict[str, Any]]:
    """One row per `speech_e2e` artifact: WhisperLiveKit's own server in front of `alignatt serve`."""
    from alignatt.report.rows import machine_of

    rows = []
    for rel, a in inputs.of_kind("speech_e2e"):
        c = a.clip
        retractions = a.source_retractions + a.transcript_retractions + a.translation_retractions
        rows.append(dict(
            date=a.provenance.date, machine=machine_of(a), source=rel, clip=c.name, seconds=c.seconds,
            origin=c.package or "a user's file", licence=c.licence or "—", speed=a.config.speed,
            clock=_clock(a.config.speed), wlk=a.whisperlivekit or "—", asr=a.config.asr_model,
            served=f"{a.served.model} / {a.served.seam} on {a.served.device}",
            translations=a.replies_with_committed_text, retractions=retractions,
            covered=f"{a.committed_words - a.words_never_covered} / {a.committed_words}",
            delay_p50=_s(a.caption_delay_s_p50), delay_p95=_s(a.caption_delay_s_p95),
            rtt_p50=_ms(a.rtt_ms_p50), rtt_p95=_ms(a.rtt_ms_p95), errors=a.error_frames,
            wer=_pct(a.wer_committed) if a.wer_committed is not None else (a.wer_reason or "—"),
        ))
    return sorted(rows, key=lambda r: (r["date"], r["source"]))


def speech_section(inputs: ReportInputs) -> dict[str, Any]:
    """The section's rows, the end-to-end runs, the eval's seeded levels beside them, and what cannot
    be scored."""
    from alignatt.record.artifacts import CAPTION_DELAY

    return dict(rows=speech_rows(inputs), e2e=e2e_rows(inputs), e2e_delay=CAPTION_DELAY,
                seeded=seeded_levels(inputs), no_references=NO_REFERENCES)


def _timeline(a) -> dict[str, list[tuple[int, float]]] | None:
    """Per series, (word index, stream seconds): spoken (audio end), recognised (committed by the
    recogniser), shown and committed (the translation's). None when the stream cannot be matched."""
    from alignatt.replay.stream import load_stream
    from alignatt.speech.captions import word_times

    try:
        stream = load_stream(a.config.stream)
    except AlignattError:
        return None
    ends = (stream.recognised or {}).get("word_ends_s") or []
    if not stream.timeline or len(ends) != len(stream.words) or len(ends) != a.config.stream_words:
        return None
    recognised: dict[int, float] = {}
    for step in stream.timeline:
        for j in range(len(recognised), step.committed):
            recognised[j] = step.t
    shown, committed = word_times([e for e in a.events if e.client == NATIVE], a.config.speed or 1.0)
    return {"spoken": list(enumerate(ends)), "recognised": sorted(recognised.items()),
            "shown": sorted(shown.items()), "committed": sorted(committed.items())}


LABELS = {"spoken": "word ends in the audio", "recognised": "recogniser commits it",
          "shown": "translation first shown", "committed": "translation committed"}


def speech_timeline(inputs: ReportInputs) -> list[Figure]:
    """One timeline per speech smoke: each source word, against when it was spoken, recognised and
    translated (stream seconds: the audio's clock)."""
    figures = []
    for rel, a in speech_smokes(inputs):
        series = _timeline(a)
        if series is None:
            continue
        where = [part for part in rel.removesuffix(".json").split("/")[1:] if part != "speech"]  # past outputs/
        clip = str(a.config.stream).removeprefix("speech:")

        def draw(series=series, clip=clip, a=a, name="speech_timeline_" + "_".join(where)) -> Figure:
            fig, ax = new_figure(7.0, 4.2)
            for key, points in series.items():
                if points:
                    words, times = zip(*points)
                    ax.plot(times, words, marker="o", markersize=2.5, linestyle="-", linewidth=0.8,
                            drawstyle="steps-post", color=TIMELINE_COLORS[key], label=LABELS[key])
            ax.set_xlabel("time on the audio's clock (s)")
            ax.set_ylabel("source word (in the order spoken)")
            ax.set_xlim(left=0)
            ax.set_ylim(bottom=0)
            ax.grid(True, linewidth=0.3)
            ax.set_title(f"{clip}: {a.config.model} on {a.provenance.date}", fontsize=9)
            ax.legend(fontsize=8, loc="lower right", frameon=False)  # the words rise from the lower left
            caption = (f"Clip `{clip}`, recognised live by LocalAgreement over faster-whisper, replayed through "
                       f"the MT server at {a.config.speed}x (`{rel}`). For each source word: its end in the "
                       "audio, when the recogniser committed it, when new translation was first shown once it "
                       "was heard (the held draft has no per-word alignment), and when a committed translation "
                       "first covered it (the AlignAtt alignment). The gap between the black and green lines is "
                       "the caption delay.")
            return Figure(name, "speech", f"Real speech timeline ({clip})", caption, svg_text(fig))

        figures.append(styled(draw))
    return figures
