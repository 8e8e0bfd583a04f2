"""Scores from the field's libraries: sacrebleu, OmniSTEval (AL, LAAL, YAAL, LongYAAL), mweralign, COMET.

No metric formula is written here: sentence-level AL/LAAL/YAAL come from OmniSTEval's scorers
(adapted from SimulEval's latency scorer), long-form streams are resegmented against the
references with OmniSTEval's `resegment` (SoftSegmenter) and scored with its `evaluate_instances`
(LongYAAL, computation-aware and -unaware); StreamLAAL resegments with mwerSegmenter (the
`mweralign` package) and scores each segment with OmniSTEval's LAAL; quality from sacrebleu.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from alignatt.evaluate.emissions import Emission
from alignatt.evaluate.units import CHAR_LANGS, NEGATIVE_WHY, NEGATIVE_WHY_BY_UNIT, bleu_tokenizer, negative_unit

log = logging.getLogger(__name__)


def quality(hypotheses: list[str], references: list[str], target_lang: str) -> dict[str, float]:
    from sacrebleu.metrics import BLEU, CHRF

    bleu = BLEU(tokenize=bleu_tokenizer(target_lang)).corpus_score(hypotheses, [references])
    chrf = CHRF().corpus_score(hypotheses, [references])
    return {"bleu": round(bleu.score, 4), "chrf": round(chrf.score, 4)}


@dataclass
class SentenceLatencyInput:
    reference: str
    source_words: int
    source_ms: float
    emissions: list[Emission]


WORD_UNITS = {"read": "read_words", "committed": "committed_words"}


def _instances(items: list[SentenceLatencyInput], target_lang: str, unit: str):
    """OmniSTEval instances of the scorable sentences: `unit` is read | committed (source words
    when each target unit was written) or ms (stream time, CU and CA)."""
    from omnisteval import Instance

    latency_unit = "char" if target_lang in CHAR_LANGS else "word"
    out = []
    for i, it in enumerate(items):
        if not it.emissions:
            continue  # nothing emitted: the scorers skip it; the row counts it
        if unit in WORD_UNITS:
            cu = [float(getattr(e, WORD_UNITS[unit])) for e in it.emissions]
            out.append(Instance(reference=it.reference, latency_unit=latency_unit, index=i,
                                source_length=float(it.source_words), emission_cu=cu))
        else:  # ms: CA on the real-time queue; ms_simuleval: CA as SimulEval computes it
            out.append(Instance(reference=it.reference, latency_unit=latency_unit, index=i,
                                source_length=it.source_ms,
                                emission_cu=[e.cu_ms for e in it.emissions],
                                emission_ca=[e.sim_ca_ms if unit == "ms_simuleval" else e.ca_ms
                                             for e in it.emissions]))
    return out


def _r(x: float) -> float | None:
    return None if x != x else round(float(x), 4)  # NaN (no scorable instance) -> None


def negative_why(metric: str) -> str:
    return f"{NEGATIVE_WHY}: {NEGATIVE_WHY_BY_UNIT[negative_unit(metric)]}"


def negatives(name: str, scorer, instances) -> dict | None:
    """Per-instance scores from the same OmniSTEval scorer: how many are below 0, and why. The
    figure is still the mean over all instances; this says that negative lags are inside it."""
    scores = [x for x in (scorer.compute(ins) for ins in instances
                          if getattr(ins, "emission_ca" if scorer.computation_aware else "emission_cu", None))
              if x is not None]
    below = [x for x in scores if x < 0]
    if not below:
        return None
    return {"metric": name, "instances": len(below), "scored": len(scores), "min": round(min(below), 4),
            "mean": round(sum(scores) / len(scores), 4),
            "why": negative_why(name)}


def sentence_latency(items: list[SentenceLatencyInput], target_lang: str) -> tuple[dict[str, float | None], list]:
    """AL / LAAL per sentence, averaged, in source words *read* (committed + tail shown when a
    target unit was written: SimulEval's delays) and committed; AL / LAAL / YAAL in ms, CU and CA.
    Also the negative-lag notes (`negatives`), one per figure that has any."""
    from omnisteval.scoring import ALScorer, LAALScorer, YAALScorer

    out: dict[str, float | None] = {}
    notes = []
    for unit in WORD_UNITS:
        ins = _instances(items, target_lang, unit)
        for name, scorer in (("al", ALScorer()), ("laal", LAALScorer())):
            key = f"{name}_words_{unit}"
            out[key] = _r(scorer(ins)) if ins else None
            notes.append(negatives(key, scorer, ins) if ins else None)
    times = _instances(items, target_lang, "ms")
    for aware, prefix in ((False, ""), (True, "ca_")):
        for name, cls in (("al", ALScorer), ("laal", LAALScorer), ("yaal", YAALScorer)):
            scorer = cls(computation_aware=aware)
            out[f"{prefix}{name}_ms"] = _r(scorer(times)) if times else None
            notes.append(negatives(f"{prefix}{name}_ms", scorer, times) if times else None)
    sim = _instances(items, target_lang, "ms_simuleval")
    for name, cls in (("al", ALScorer), ("laal", LAALScorer), ("yaal", YAALScorer)):
        scorer = cls(computation_aware=True)
        out[f"sim_ca_{name}_ms"] = _r(scorer(sim)) if sim else None
    out["scored_instances"] = len(times)
    return out, [n for n in notes if n]


@dataclass
class TalkInput:
    """One long-form stream: its reference segments (with source spans) and emissions."""

    references: list[str]
    segment_ms: list[tuple[float, float]]  # (offset, duration) of each reference's source, ms
    emissions: list[Emission]


def longform(talks: list[TalkInput], target_lang: str) -> tuple[dict[str, float | None], list[str], list]:
    """Resegment each talk's output against its references (OmniSTEval) and score it; also the
    resegmented hypotheses, one per reference segment, and the negative-lag notes of LongYAAL."""
    from omnisteval import Word, evaluate_instances, resegment

    char = target_lang in CHAR_LANGS
    ref_words, hyp_words, segmentation, ref_sentences = [], [], [], []
    seq = 0
    for doc, talk in enumerate(talks):
        end = max(o + d for o, d in talk.segment_ms)
        recording = []
        for seg_id, (ref, (offset, duration)) in enumerate(zip(talk.references, talk.segment_ms)):
            ref_text = ref.replace(" ", "") if char else ref
            ref_sentences.append(ref_text)
            segmentation.append({"doc_id": doc, "seg_id": seg_id, "offset": offset, "duration": duration,
                                 "time_to_recording_end": end - offset})
            unit_list = list(ref_text.strip().lower()) if char else ref_text.strip().lower().split()
            # As OmniSTEval's loader does: a reference word's time is its segment's offset, so
            # hypothesis words emitted before a segment starts are not aligned to it.
            recording += [Word(u, emission_cu=offset, seq_id=seq) for u in unit_list]
            seq += 1
        ref_words.append(recording)
        hyp_words.append([Word(e.text, emission_cu=e.cu_ms, emission_ca=e.ca_ms) for e in talk.emissions])
    lang = None if char else target_lang
    instances, _ = resegment(ref_words, hyp_words, segmentation, ref_sentences, char_level=char, lang=lang)
    scores, _, _ = evaluate_instances(instances, is_longform=True, bleu_tokenizer=bleu_tokenizer(target_lang))
    keep = ("bleu", "chrf", "long_yaal", "ca_long_yaal", "long_laal", "ca_long_laal", "long_al", "ca_long_al")
    out = {k: _r(scores[k]) if k in scores else None for k in keep}
    # the same resegmentation (it aligns words, not times) scored on SimulEval's computation-aware times
    sim_words = [[Word(e.text, emission_cu=e.cu_ms, emission_ca=e.sim_ca_ms) for e in talk.emissions]
                 for talk in talks]
    sim_instances, _ = resegment(ref_words, sim_words, segmentation, ref_sentences, char_level=char, lang=lang)
    sim_scores, _, _ = evaluate_instances(sim_instances, is_longform=True, compute_quality=False)
    out.update({f"sim_{k}": _r(sim_scores[k]) if k in sim_scores else None
                for k in ("ca_long_yaal", "ca_long_laal", "ca_long_al")})
    out.update(stream_laal(talks, target_lang))
    from omnisteval.scoring import YAALScorer

    notes = [negatives(f"{prefix}long_yaal", YAALScorer(computation_aware=aware, is_longform=True), instances)
             for aware, prefix in ((False, ""), (True, "ca_"))]
    return out, [i.prediction for i in instances], [n for n in notes if n]


def mwer_segments(references: list[str], hypothesis_units: list[str]) -> list[int]:
    """How many hypothesis units mwerSegmenter (mweralign) gives each reference segment."""
    from mweralign import align_texts

    # Pre-tokenised on the units themselves, so every unit comes back unchanged and in order and
    # keeps its emission time.
    aligned = align_texts("\n".join(references), " ".join(hypothesis_units), is_tokenized=True)
    lines = aligned.split("\n")[: len(references)]
    counts = [len(line.split()) for line in lines] + [0] * (len(references) - len(lines))
    if [u for line in lines for u in line.split()] != hypothesis_units:
        raise ValueError("mweralign changed the hypothesis units")
    return counts


def stream_laal_segments(talks: list[TalkInput], target_lang: str) -> list[dict]:
    """The output resegmented by mwerSegmenter (mweralign), one record per reference segment with
    output, in OmniSTEval's resegmented format: delays (CU), elapsed (CA, real-time queue) and
    elapsed_simuleval (CA as SimulEval computes it), ms from the segment's start."""
    char = target_lang in CHAR_LANGS
    records = []
    for talk in talks:
        refs = [" ".join(r.replace(" ", "")) if char else r for r in talk.references]
        counts = mwer_segments(refs, [e.text for e in talk.emissions])
        start = 0
        for ref, (offset, duration), n in zip(talk.references, talk.segment_ms, counts):
            seg = talk.emissions[start:start + n]
            start += n
            if seg:
                records.append({"prediction": ("" if char else " ").join(e.text for e in seg),
                                "reference": ref.replace(" ", "") if char else ref, "source_length": duration,
                                "delays": [round(e.cu_ms - offset, 3) for e in seg],
                                "elapsed": [round(e.ca_ms - offset, 3) for e in seg],
                                "elapsed_simuleval": [round(e.sim_ca_ms - offset, 3) for e in seg]})
    return records


def stream_laal(talks: list[TalkInput], target_lang: str) -> dict[str, float | None]:
    """StreamLAAL: the output resegmented by mwerSegmenter (mweralign), then LAAL per segment
    with delays relative to the segment's start (OmniSTEval's LAAL scorer), under both
    computation-aware conventions."""
    none = {"stream_laal": None, "ca_stream_laal": None, "sim_ca_stream_laal": None}
    try:
        import mweralign  # noqa: F401
    except ImportError:
        return none
    from omnisteval import Instance
    from omnisteval.scoring import LAALScorer

    unit = "char" if target_lang in CHAR_LANGS else "word"
    records = stream_laal_segments(talks, target_lang)
    if not records:
        return none

    def score(ca_key: str, aware: bool) -> float | None:
        return _r(LAALScorer(computation_aware=aware)([
            Instance(reference=r["reference"], latency_unit=unit, source_length=r["source_length"],
                     emission_cu=r["delays"], emission_ca=r[ca_key]) for r in records]))

    return {"stream_laal": score("elapsed", False), "ca_stream_laal": score("elapsed", True),
            "sim_ca_stream_laal": score("elapsed_simuleval", True)}


def comet(model_path: str | None, sources: list[str], hypotheses: list[str],
          references: list[str]) -> dict[str, object]:
    """COMET from a local checkpoint (`unbabel-comet`); without one, skipped with the reason."""
    if not model_path:
        return {"status": "skipped", "reason": "no --comet-model checkpoint given (models cannot be downloaded here)"}
    try:
        from comet import load_from_checkpoint
    except ImportError:
        return {"status": "skipped", "reason": "unbabel-comet is not installed (pip install 'alignatt[comet]')"}
    try:
        model = load_from_checkpoint(model_path)
    except Exception as e:  # a wrong path or a broken checkpoint: recorded, not fatal
        return {"status": "skipped", "reason": f"cannot load {model_path}: {type(e).__name__}: {e}"[:300]}
    import torch

    data = [{"src": s, "mt": h, "ref": r} for s, h, r in zip(sources, hypotheses, references)]
    out = model.predict(data, batch_size=8, gpus=1 if torch.cuda.is_available() else 0, progress_bar=False)
    return {"status": "ok", "model": model_path, "system_score": round(float(out.system_score), 4)}
