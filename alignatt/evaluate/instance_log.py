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
- `ms/`: delays = stream time (CU), elapsed = computation-aware time (CA), source_length = the
  source's duration in ms (speech input); `--computation-aware` gives the CA figures (SimulEval
  then scores its plain AL and LAAL columns on `elapsed` too: run it once without, once with).

Every folder also has `references.txt` (one per line), so OmniSTEval reads the same log:
`omnisteval shortform --hypothesis_file DIR/instances.log --ref_sentences_file DIR/references.txt`.
Long-form rows get `longform/`: one line per talk (delays/elapsed in ms from the talk's start),
`segmentation.yaml` (wav, offset and duration in s, per reference segment) and `references.txt`,
for `omnisteval longform --speech_segmentation ... --hypothesis_file ...` (its LongYAAL).
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


def sentence_records(row, pairs, read: bool | None, schedule) -> list[dict]:
    """SimulEval lines of one sentence row: read True (words read), False (committed), None (ms)."""
    records = []
    for i, (pair, hyp, ems) in enumerate(zip(pairs, row.hypotheses, row.emissions)):
        n = len(pair.source_words)
        reads = row.read_words[i] if row.read_words else [e[1] for e in ems]
        if read is None:
            delays, elapsed, length = [e[2] for e in ems], [e[3] for e in ems], schedule.source_ms(n)
        else:
            delays = [float(r) for r in reads] if read else [float(e[0]) for e in ems]
            elapsed, length = [0.0] * len(ems), n
        records.append({"index": i, "prediction": hyp, "delays": delays, "elapsed": elapsed,
                        "prediction_length": len(delays), "reference": pair.reference, "source": pair.source,
                        "source_length": length})
    return records


def _longform(folder: Path, row, talks, schedule, target_lang: str) -> None:
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
                        "elapsed": [e[3] for e in ems], "prediction_length": len(ems),
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
            refs = [p.reference for p in pairs]
            for sub, read, ms in (("words_read", True, False), ("words_committed", False, False), ("ms", None, True)):
                folder = f"{key}/{sub}"
                config = {"source_type": "speech" if ms else "text", "target_type": "text"}
                _write(tmp / folder, sentence_records(row, pairs, read, schedule), refs, config)
                suffix = "ms" if ms else f"words_{sub.split('_')[1]}"
                figures = {"AL": row.latency.get(f"al_{suffix}"), "LAAL": row.latency.get(f"laal_{suffix}")}
                if ms:
                    figures.update({"AL_CA": row.latency.get("ca_al_ms"), "LAAL_CA": row.latency.get("ca_laal_ms")})
                figures["BLEU"] = row.bleu
                commands = {"simuleval": _simuleval_command(f"{final.name}/{folder}", unit, False, target_lang)}
                if ms:  # with --computation-aware SimulEval scores AL and LAAL on `elapsed` too
                    commands["simuleval_ca"] = _simuleval_command(f"{final.name}/{folder}", unit, True, target_lang)
                index.append({"path": folder, "row": what, "delays": sub, "figures": figures, **commands,
                              "omnisteval": f"omnisteval shortform --hypothesis_file {final.name}/{folder}/instances.log "
                                            f"--ref_sentences_file {final.name}/{folder}/references.txt"
                                            f"{' --char_level' if char else ' --word_level'} --bleu_tokenizer {bleu_tokenizer(target_lang)}"})
        elif row.streams:
            folder = f"{key}/longform"
            _longform(tmp / folder, row, talks, schedule, target_lang)
            lang = " --char_level" if char else f" --word_level --lang {target_lang}"
            index.append({"path": folder, "row": what, "delays": "ms",
                          "figures": {"LongYAAL": row.latency.get("long_yaal"),
                                      "LongYAAL_CA": row.latency.get("ca_long_yaal")},
                          "omnisteval": f"omnisteval longform --speech_segmentation {final.name}/{folder}/segmentation.yaml "
                                        f"--ref_sentences_file {final.name}/{folder}/references.txt "
                                        f"--hypothesis_file {final.name}/{folder}/instances.log{lang} "
                                        f"--bleu_tokenizer {bleu_tokenizer(target_lang)}"})
    (tmp / INDEX).write_text(_lines([{"unit": unit, **entry} for entry in index]), encoding="utf-8")
    shutil.rmtree(final, ignore_errors=True)
    tmp.replace(final)
    return final


def stream_text(emitted_units: list[str], target_lang: str) -> str:
    """A long-form stream's output as emitted (before resegmentation), for the long-form log."""
    return join_units(emitted_units, target_lang)
