"""Test sets for `alignatt eval`: source/reference pairs from JSONL, word-alignment JSON or SimulEval files.

Formats (picked by what the path is):
- a named set: `en-de` is the packaged en→de test split (`alignatt/data/eval/en-de.test.jsonl`);
- `*.jsonl`: one JSON object per line with `source` and `reference` (or `source_text` and
  `target_text`), optional `id`;
- `*.json`: a JSON list of word-aligned pairs (`source_text`, `target_text`, `direction`), the
  format of `word_alignments_<direction>.json` (cs→en, en→it, en→zh, en→de);
- `SOURCE_FILE:TARGET_FILE`: SimulEval's plain text files, one sentence per line, same line count.

The en→de split: `alignatt/data/word_alignments_en-de.json` holds 903 pairs. The embedded model's
head set (`alignatt/data/heads/gemma-3-270m_en-de.json`, `used_pairs: 200`) was calibrated with
`alignatt heads calibrate --max-pairs 200`, i.e. on file positions 0-199; the test split is file
positions 200-902 (703 pairs), in file order. The published E4B heads were calibrated on all 903,
so E4B scores on this split are not held out.

The other directions with references in `../shared/data/` follow the same rule: the embedded
model's head set `gemma-3-270m_<dir>.json` records `used_pairs` N (its calibration run was offered
the first N pairs of `word_alignments_<dir>.json`, none skipped), so file positions 0..N-1
calibrate and N..end test: en-it 0-99 / 100-906 (807 pairs), en-zh 0-149 / 150-879 (730),
cs-en 0-99 / 100-511 (412). The splits ship as `alignatt/data/eval/<dir>.test.jsonl` (each line
keeps its file `position`, its talk and, where the CSV export's quoting was undone, the raw
source as `source_raw`: `alignatt/data/eval/README.md`, the sets' card). zh targets are scored in characters (BLEU tokenize zh, latency
units = characters: `alignatt.evaluate.units.CHAR_LANGS`).
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from alignatt.core.errors import AlignattError

# direction -> file positions [0, N) of word_alignments_<direction>.json that calibrated the
# embedded model's heads (its head set's `used_pairs`); the packaged split is [N, end)
CALIBRATION_PAIRS = {"en-de": 200, "en-it": 100, "en-zh": 150, "cs-en": 100}
SET_SIZES = {"en-de": 903, "en-it": 907, "en-zh": 880, "cs-en": 512}  # pairs in the alignment file
NAMED_SETS = {d: f"{d}.test.jsonl" for d in CALIBRATION_PAIRS}
EN_DE_CALIBRATION_PAIRS = CALIBRATION_PAIRS["en-de"]


class TestPair(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str
    source: str = Field(min_length=1)
    reference: str = Field(min_length=1)
    talk: str | None = None  # the whole talk the pair is a sentence of (`alignatt.evaluate.talks`)

    @property
    def source_words(self) -> list[str]:
        return self.source.split()


class TestSet(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str  # what the user passed
    source_lang: str
    target_lang: str
    pairs: list[TestPair]
    description: str = ""


def _pair(item: object, where: str, index: int, default_id: str) -> TestPair:
    if not isinstance(item, dict):
        raise AlignattError(f"{where}: entry {index + 1} is not a JSON object")
    source = item.get("source", item.get("source_text"))
    reference = item.get("reference", item.get("target_text"))
    if not isinstance(source, str) or not source.strip():
        raise AlignattError(f"{where}: entry {index + 1} has no source text (`source` or `source_text`)")
    if not isinstance(reference, str) or not reference.strip():
        raise AlignattError(f"{where}: entry {index + 1} has no reference (`reference` or `target_text`)")
    pid = item.get("id", item.get("pair_id", default_id))
    talk = item.get("talk")
    return TestPair(id=str(pid), source=" ".join(source.split()), reference=" ".join(reference.split()),
                    talk=str(talk) if talk is not None else None)


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise AlignattError(f"test set {path}: no such file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise AlignattError(f"test set {path}: unreadable ({e})") from None


def _jsonl(text: str, where: str) -> list[TestPair]:
    pairs = []
    for n, line in enumerate(text.splitlines()):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as e:
            raise AlignattError(f"{where}: line {n + 1} is not JSON ({e.msg})") from None
        pairs.append(_pair(item, where, n, f"{n}"))
    return pairs


def _alignment_json(text: str, where: str) -> tuple[list[TestPair], str | None]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise AlignattError(f"{where}: not valid JSON ({e.msg})") from None
    if not isinstance(data, list):
        raise AlignattError(f"{where}: expected a JSON list of pairs (or use .jsonl)")
    directions = {d.get("direction") for d in data if isinstance(d, dict) and d.get("direction")}
    if len(directions) > 1:
        raise AlignattError(f"{where}: pairs mix directions {sorted(directions)}")
    return [_pair(d, where, i, f"{i}") for i, d in enumerate(data)], next(iter(directions), None)


def _simuleval(source: Path, target: Path) -> list[TestPair]:
    src, tgt = _read(source).splitlines(), _read(target).splitlines()
    if len(src) != len(tgt):
        raise AlignattError(f"SimulEval files differ in length: {source} has {len(src)} lines, "
                            f"{target} has {len(tgt)}")
    return [_pair({"source": s, "reference": t}, f"{source}:{target}", i, str(i))
            for i, (s, t) in enumerate(zip(src, tgt))]


def load_test_set(spec: str, direction: str | None = None) -> TestSet:
    """Load a test set by name or path (see the module docstring); direction like `en-de`."""
    found_direction = None
    description = ""
    if spec in NAMED_SETS:
        text = (resources.files("alignatt") / "data" / "eval" / NAMED_SETS[spec]).read_text(encoding="utf-8")
        pairs, found_direction = _jsonl(text, spec), spec
        n = CALIBRATION_PAIRS[spec]
        description = (f"packaged {spec} test split: positions {n}-{SET_SIZES[spec] - 1} of "
                       f"word_alignments_{spec}.json (0-{n - 1} calibrated the embedded model's heads)")
    elif ":" in spec and not Path(spec).exists():
        source, target = spec.split(":", 1)
        pairs = _simuleval(Path(source), Path(target))
        description = "SimulEval source/target files"
    else:
        path = Path(spec)
        text = _read(path)
        if path.suffix == ".jsonl":
            pairs = _jsonl(text, spec)
        elif path.suffix == ".json":
            pairs, found_direction = _alignment_json(text, spec)
        else:
            raise AlignattError(f"test set {spec}: use a .jsonl or .json file, a named set "
                                f"({', '.join(NAMED_SETS)}) or SOURCE_FILE:TARGET_FILE")
        description = f"file {spec}"
    if not pairs:
        raise AlignattError(f"test set {spec}: no pairs")
    direction = (direction or found_direction or "en-de").strip().lower()
    if found_direction and direction != found_direction:
        raise AlignattError(f"test set {spec} is {found_direction}, not {direction}")
    parts = direction.split("-")
    if len(parts) != 2 or not all(parts):
        raise AlignattError(f"bad direction {direction!r}: write it as source-target, e.g. en-de")
    return TestSet(name=spec, source_lang=parts[0], target_lang=parts[1], pairs=pairs,
                   description=description)


def select(test_set: TestSet, limit: int | None, max_source_words: int | None = None) -> list[TestPair]:
    """The first `limit` pairs (file order) with at most `max_source_words` source words."""
    pairs = [p for p in test_set.pairs if max_source_words is None or len(p.source_words) <= max_source_words]
    pairs = pairs[:limit] if limit else pairs
    if not pairs:
        raise AlignattError(f"test set {test_set.name}: no pair has at most {max_source_words} source words")
    return pairs
