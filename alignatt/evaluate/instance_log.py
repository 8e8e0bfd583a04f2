"""SimulEval instance logs beside the eval artifact, so that the latency can be recomputed without our code.

`<artifact stem>_instances/` (e.g. `outputs/cpu/eval_instances/`) holds one folder per row,
named `<variant>.<driver>.<preset>.<tail>` (`:` of a vLLM mode written `-`), and `index.jsonl`
(one JSON per log: the row it came from, the figures the artifact gives and the commands that
recompute them). Sentence rows get three SimulEval output folders, each an `instances.log`
(SimulEval's format: one JSON per line with index, prediction, delays, elapsed,
prediction_length, reference, source, source_length) and a `config.yaml`:

- `words_read/`: delays = source words read when each target unit was written (committed +
  tail shown: SimulEval's text convention), source_length in words; elapsed all 0, as SimulEval
  writes it for text input. `simuleval --score-only --output DIR --latency-metrics AL LAAL`
  gives the row's `al_words_read` / `laal_words_read`.
- `words_committed/`: the same with committed words only (the secondary column).
- `ms/`: delays = stream time (CU), elapsed = computation-aware time on the real-time queue (the
  page's CA: what a user of a live server sees), source_length = the source's duration in ms
  (speech input); `--computation-aware` gives the CA figures (SimulEval then scores its plain AL
  and LAAL columns on `elapsed` too: run it once without, once with).
- `ms_simuleval/`: the same with elapsed = SimulEval's own computation-aware time (stream time +
  all compute since the instance began): `--computation-aware` gives `sim_ca_al_ms` /
  `sim_ca_laal_ms`.

Every folder also has `references.txt` (one per line), so OmniSTEval reads the same log:
`omnisteval shortform --hypothesis_file DIR/instances.log --ref_sentences_file DIR/references.txt`.
Long-form rows get `longform/`: one line per talk (delays/elapsed in ms from the talk's start),
`segmentation.yaml` (wav, offset and duration in s, per reference segment) and `references.txt`,
for `omnisteval longform --speech_segmentation ... --hypothesis_file ...` (its LongYAAL), and
`longform_simuleval/` the same with SimulEval's computation-aware times; `stream_laal/` holds
mwerSegmenter's resegmentation (`instances.resegmented.jsonl`): `omnisteval longform
--resegmented_hypothesis ...` gives StreamLAAL as its LAAL (`--emission_ca_key elapsed_simuleval`:
SimulEval's convention).
SimulEval rewrites `config.yaml` when it scores a folder; the logs are what matter.

Target units are words, or characters for zh/ja (then `--eval-latency-unit char`, OmniSTEval
`--char_level`).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from alignatt.evaluate.emissions import join_units
from alignatt.evaluate.units import CHAR_LANGS, bleu_tokenizer

INDEX = "index.jsonl"  # not .json: the audit reads every *.json under outputs/ as an artifact


def logs_dir(artifact_path: Path) -> Path:
    return artifact_path.with_name(artifact_path.stem + "_instances")


def row_key(row) -> str:
    """`<variant>.<driver>.<preset>.<tail>`: an asr tail with its committed WER (`asr-wer15`), an
    oracle-segmented long form with `.oracle`, a row under load with its level."""
    wer = getattr(row, "committed_wer", None)
    tail = row.tail + (f"-wer{round(wer * 100):g}" if wer is not None else "")
    key = ".".join((row.variant.replace(":", "-"), row.driver, row.preset, tail))
    key += ".oracle" if getattr(row, "segmentation", None) == "oracle" else ""
    return key + (f".under_load_{row.concurrency}" if row.role == "under_load" else "")


def _lines(records: list[dict]) -> str:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)


def _write(folder: Path, records: list[dict], references: list[str], config: dict | None = None) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "instances.log").write_text(_lines(records), encoding="utf-8")
    (folder / "references.txt").write_text("".join(r + "\n" for r in references), encoding="utf-8")
    if config is not None:
        import yaml

        (folder / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=True), encoding="utf-8")


def _simuleval_command(folder: str, unit: str, ms: bool, target_lang: str) -> str:
    cmd = (f"simuleval --score-only --output {folder} --latency-metrics AL LAAL --eval-latency-unit {unit} "
           f"--quality-metrics BLEU --sacrebleu-tokenizer {bleu_tokenizer(target_lang)}")
    return cmd + (" --computation-aware" if ms else "")


def _simuleval_ca(row, i: int) -> list[float]:
    """Stream i's SimulEval computation-aware times (the queue's where the artifact has none)."""
    return row.simuleval_ca[i] if row.simuleval_ca else [e[3] for e in row.emissions[i]]


def sentence_records(row, pairs, read: bool | None, schedule, simuleval_ca: bool = False) -> list[dict]:
    """SimulEval lines of one sentence row: read True (words read), False (committed), None (ms;
    elapsed on the real-time queue, or as SimulEval computes it with `simuleval_ca`)."""
    records = []
    for i, (pair, hyp, ems) in enumerate(zip(pairs, row.hypotheses, row.emissions)):
        n = len(pair.source_words)
        reads = row.read_words[i] if row.read_words else [e[1] for e in ems]
        if read is None:
            elapsed = _simuleval_ca(row, i) if simuleval_ca else [e[3] for e in ems]
            delays, length = [e[2] for e in ems], schedule.source_ms(n)
        else:
            delays = [float(r) for r in reads] if read else [float(e[0]) for e in ems]
            elapsed, length = [0.0] * len(ems), n
        records.append({"index": i, "prediction": hyp, "delays": delays, "elapsed": elapsed,
                        "prediction_length": len(delays), "reference": pair.reference, "source": pair.source,
                        "source_length": length})
    return records


def talk_inputs(row, talks, schedule, target_lang: str):
    """A long-form row's streams as the scorer's `TalkInput`s, rebuilt from what the artifact records."""
    from alignatt.evaluate.emissions import Emission, units
    from alignatt.evaluate.scoring import TalkInput

    out = []
    for k, (talk, text, ems) in enumerate(zip(talks, row.streams, row.emissions)):
        spans, start = [], 0
        for p in talk:
            spans.append((schedule.source_ms(start), schedule.source_ms(len(p.source_words))))
            start += len(p.source_words)
        sim = _simuleval_ca(row, k)
        emissions = [Emission(u, c, a, cu, ca, -1, s) for u, (c, a, cu, ca), s in zip(units(text, target_lang), ems, sim)]
        out.append(TalkInput([p.reference for p in talk], spans, emissions))
    return out


def _stream_laal(folder: Path, row, talks, schedule, target_lang: str) -> None:
    """StreamLAAL's mwerSegmenter resegmentation as OmniSTEval's resegmented JSONL: `omnisteval
    longform --resegmented_hypothesis` scores it (its LAAL is the row's StreamLAAL; with
    `--emission_ca_key elapsed_simuleval`, SimulEval's computation-aware convention)."""
    from alignatt.evaluate.scoring import stream_laal_segments

    folder.mkdir(parents=True, exist_ok=True)
    records = stream_laal_segments(talk_inputs(row, talks, schedule, target_lang), target_lang)
    (folder / "instances.resegmented.jsonl").write_text(_lines(records), encoding="utf-8")


def _longform(folder: Path, row, talks, schedule, target_lang: str, simuleval_ca: bool = False) -> None:
    records, segmentation, references = [], [], []
    for k, (talk, text, ems) in enumerate(zip(talks, row.streams, row.emissions)):
        wav = f"talk{k}.wav"
        start = 0
        for p in talk:
            n = len(p.source_words)
            segmentation.append({"wav": wav, "offset": schedule.source_ms(start) / 1000.0,
                                 "duration": schedule.source_ms(n) / 1000.0})
            references.append(p.reference)
            start += n
        records.append({"index": k, "source": wav, "prediction": text, "delays": [e[2] for e in ems],
                        "elapsed": _simuleval_ca(row, k) if simuleval_ca else [e[3] for e in ems],
                        "prediction_length": len(ems),
                        "source_length": schedule.source_ms(start)})
    _write(folder, records, references)
    import yaml

    (folder / "segmentation.yaml").write_text(yaml.safe_dump(segmentation, sort_keys=False), encoding="utf-8")


def write_instance_logs(artifact, artifact_path: Path, pairs, talks, schedule, target_lang: str) -> Path:
    """Every row's logs into `<stem>_instances/`, replaced as a whole (written aside, then moved)."""
    final = logs_dir(Path(artifact_path))
    tmp = final.with_name(final.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    char = target_lang in CHAR_LANGS
    unit = "char" if char else "word"
    index: list[dict[str, Any]] = []
    for row in artifact.rows:
        key = row_key(row)
        what = {"variant": row.variant, "driver": row.driver, "preset": row.preset, "tail": row.tail,
                "form": row.form, "n": row.instances, "committed_wer": row.committed_wer,
                "segmentation": row.segmentation,
                **({"under_load": row.concurrency} if row.role == "under_load" else {})}
        if row.form == "sentence":
            refs = [p.reference for p in pairs[:len(row.hypotheses)]]  # under load: the first N sentences
            subs = [("words_read", True, False), ("words_committed", False, False), ("ms", None, True)]
            if "sim_ca_laal_ms" in row.latency:
                subs.append(("ms_simuleval", None, True))
            for sub, read, ms in subs:
                folder = f"{key}/{sub}"
                sim = sub == "ms_simuleval"
                config = {"source_type": "speech" if ms else "text", "target_type": "text"}
                _write(tmp / folder, sentence_records(row, pairs, read, schedule, sim), refs, config)
                suffix = "ms" if ms else f"words_{sub.split('_')[1]}"
                figures = {"AL": row.latency.get(f"al_{suffix}"), "LAAL": row.latency.get(f"laal_{suffix}")}
                if ms:  # CA: the real-time queue (ms/), or SimulEval's own convention (ms_simuleval/)
                    ca = "sim_ca_" if sim else "ca_"
                    figures.update({"AL_CA": row.latency.get(f"{ca}al_ms"), "LAAL_CA": row.latency.get(f"{ca}laal_ms")})
                figures["BLEU"] = row.bleu
                commands = {"simuleval": _simuleval_command(f"{final.name}/{folder}", unit, False, target_lang)}
                if ms:  # with --computation-aware SimulEval scores AL and LAAL on `elapsed` too
                    commands["simuleval_ca"] = _simuleval_command(f"{final.name}/{folder}", unit, True, target_lang)
                index.append({"path": folder, "row": what, "delays": sub, "figures": figures, **commands,
                              "omnisteval": f"omnisteval shortform --hypothesis_file {final.name}/{folder}/instances.log "
                                            f"--ref_sentences_file {final.name}/{folder}/references.txt"
                                            f"{' --char_level' if char else ' --word_level'} --bleu_tokenizer {bleu_tokenizer(target_lang)}"})
        elif row.streams:
            lang = " --char_level" if char else f" --word_level --lang {target_lang}"
            conventions = [("longform", False)] + ([("longform_simuleval", True)] if row.simuleval_ca else [])
            for sub, sim in conventions:
                folder = f"{key}/{sub}"
                _longform(tmp / folder, row, talks, schedule, target_lang, sim)
                ca = "sim_ca_long_yaal" if sim else "ca_long_yaal"
                index.append({"path": folder, "row": what, "delays": "ms",
                              "figures": {"LongYAAL": row.latency.get("long_yaal"), "LongYAAL_CA": row.latency.get(ca)},
                              "omnisteval": f"omnisteval longform --speech_segmentation {final.name}/{folder}/segmentation.yaml "
                                            f"--ref_sentences_file {final.name}/{folder}/references.txt "
                                            f"--hypothesis_file {final.name}/{folder}/instances.log{lang} "
                                            f"--bleu_tokenizer {bleu_tokenizer(target_lang)}"})
            if row.simuleval_ca and row.latency.get("stream_laal") is not None:
                folder = f"{key}/stream_laal"
                _stream_laal(tmp / folder, row, talks, schedule, target_lang)
                level = " --char_level" if char else " --word_level"
                base = (f"omnisteval longform --resegmented_hypothesis {final.name}/{folder}/instances.resegmented.jsonl"
                        f"{level} --no_quality")
                index.append({"path": folder, "row": what, "delays": "ms",
                              "figures": {"StreamLAAL": row.latency.get("stream_laal"),
                                          "StreamLAAL_CA": row.latency.get("ca_stream_laal"),
                                          "StreamLAAL_CA_simuleval": row.latency.get("sim_ca_stream_laal")},
                              "omnisteval": base, "omnisteval_simuleval_ca": base + " --emission_ca_key elapsed_simuleval"})
    (tmp / INDEX).write_text(_lines([{"unit": unit, **entry} for entry in index]), encoding="utf-8")
    shutil.rmtree(final, ignore_errors=True)
    tmp.replace(final)
    return final


def stream_text(emitted_units: list[str], target_lang: str) -> str:
    """A long-form stream's output as emitted (before resegmentation), for the long-form log."""
    return join_units(emitted_units, target_lang)
