"""Alignment head sets: which (layer, head) pairs tell where a target token looks in the source.

A head set is a ranked list of heads with a calibration score (the translation score TS: how often
the head's argmax over the source lands on the aligned source word, see `alignatt.heads.calibrate`).
The JSON format *is* the published one (`data/heads/gemma-4-E4B-it_en-de.json`: flat calibration
keys, `token_alignment_heads` of `{layer, head, ts, count}`), so the published file loads as is and
is never rewritten; the Python names are the descriptive ones (`heads`, `score`). Keys this
format does not model (the published file's stability checks, for instance) are ignored on load.

Bundled sets are package data, looked up by name (file stem); `default_heads` picks one per model.
"""

from __future__ import annotations

import json
import re
from importlib import resources
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from alignatt.core.draft import Head
from alignatt.core.errors import AlignattError

FORMAT_VERSION = 1
TS_SCORE_NAME = "paper_translation_score_argmax"  # the published name for the argmax-hit rate
SPREAD_SCORE_NAME = "uncalibrated_layer_kind_spread"



class RankedHead(BaseModel):
    """One head with its calibration score; `count` = pairs that contributed to the score."""

    model_config = ConfigDict(populate_by_name=True, serialize_by_alias=True)

    layer: int = Field(ge=0)
    head: int = Field(ge=0)
    score: float = Field(alias="ts", ge=0.0, le=1.0)
    count: int = Field(default=0, ge=0)

    def as_head(self) -> Head:
        return Head(self.layer, self.head)


class SplitHalfCheck(BaseModel):
    """Calibration stability: the used pairs split in two halves (even / odd), scored apart."""

    top_k: int
    overlap: int  # heads shared by the two halves' top-k
    max_abs_score_delta: float  # over the full run's top-k heads: |score(half A) - score(half B)|


class CalibrationRun(BaseModel):
    """How a set we calibrated ourselves was produced (absent from the published file)."""

    pairs_file: str
    pairs_offered: int  # pairs read (after --max-pairs)
    pairs_skipped: int  # pairs with no scorable target token (or that failed to map onto tokens)
    skip_reasons: dict[str, int] = {}
    device: str
    dtype: str
    synthetic_weights: bool
    seconds: float
    seconds_per_pair: float
    model_id: str = ""
    split_half: SplitHalfCheck | None = None
    query_convention: str = (
        "row of target token t = attention of the query that predicts t (the previous position), "
        "as a drafting seam captures it"
    )
    torch_version: str = ""
    transformers_version: str = ""
    created_utc: str = ""


class HeadSet(BaseModel):
    """A ranked head set for one model and translation direction (published JSON shape)."""

    model_config = ConfigDict(populate_by_name=True, serialize_by_alias=True, extra="ignore")

    format_version: int = FORMAT_VERSION
    model: str
    direction: str = Field(pattern=r"^[a-z]{2,3}-[a-z]{2,3}$")
    num_layers: int = Field(ge=1)
    num_heads: int = Field(ge=1)
    used_pairs: int = Field(ge=0)
    used_target_tokens: int = Field(ge=0)
    paper_threshold: float | None = None  # published: heads listed only if score >= threshold
    score_name: str
    heads: list[RankedHead] = Field(alias="token_alignment_heads", min_length=1)
    calibration_run: CalibrationRun | None = None

    @model_validator(mode="after")
    def _check(self) -> HeadSet:
        seen: set[tuple[int, int]] = set()
        for h in self.heads:
            if h.layer >= self.num_layers:
                raise ValueError(
                    f"head ({h.layer}, {h.head}): layer {h.layer} out of range 0..{self.num_layers - 1}"
                )
            if h.head >= self.num_heads:
                raise ValueError(
                    f"head ({h.layer}, {h.head}): head {h.head} out of range 0..{self.num_heads - 1}"
                )
            if (h.layer, h.head) in seen:
                raise ValueError(f"head ({h.layer}, {h.head}) listed twice")
            seen.add((h.layer, h.head))
        # Ranked means best first; a stable sort keeps the file's order among equal scores.
        self.heads = sorted(self.heads, key=lambda h: -h.score)
        return self

    def top_k(self, k: int) -> list[Head]:
        """The k best heads, best first."""
        if k < 1:
            raise AlignattError(f"top-k must be >= 1, got {k}")
        if k > len(self.heads):
            raise AlignattError(
                f"top-k {k} exceeds the {len(self.heads)} heads in the {self.model} "
                f"{self.direction} head set"
            )
        return [h.as_head() for h in self.heads[:k]]

    def to_json(self) -> str:
        return json.dumps(self.model_dump(mode="json", exclude_none=True), indent=2) + "\n"


def _bundled_dir():
    return resources.files("alignatt") / "data" / "heads"


def bundled_head_set_names() -> list[str]:
    return sorted(p.name[: -len(".json")] for p in _bundled_dir().iterdir() if p.name.endswith(".json"))


def parse_head_set(text: str, where: str = "head set") -> HeadSet:
    """Parse head-set JSON text; every problem becomes one `AlignattError` line."""
    try:
        data: Any = json.loads(text)
    except json.JSONDecodeError as e:
        raise AlignattError(f"{where}: not valid JSON ({e})") from None
    try:
        return HeadSet.model_validate(data)
    except ValidationError as e:
        first = e.errors()[0]
        loc = ".".join(str(p) for p in first["loc"]) or "(top level)"
        more = f" (+{e.error_count() - 1} more)" if e.error_count() > 1 else ""
        raise AlignattError(f"{where}: invalid head set at {loc}: {first['msg']}{more}") from None


def load_head_set(path_or_name: str | Path) -> HeadSet:
    """A bundled set by name (e.g. `gemma-4-E4B-it_en-de`) or a head-set JSON file path."""
    key = str(path_or_name)
    stem = key[: -len(".json")] if key.endswith(".json") else key
    if "/" not in stem and stem in bundled_head_set_names():
        text = (_bundled_dir() / f"{stem}.json").read_text(encoding="utf-8")
        return parse_head_set(text, where=f"bundled head set {stem}")
    path = Path(key)
    if path.is_file():
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise AlignattError(f"cannot read head set {path}: {e}") from None
        return parse_head_set(text, where=str(path))
    raise AlignattError(
        f"no head set named or at {key!r}; bundled: {', '.join(bundled_head_set_names())}"
    )


def write_head_set(path: str | Path, head_set: HeadSet) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(head_set.to_json(), encoding="utf-8")
    return path


def parse_head_spec(spec: str) -> list[Head]:
    """`"11:3,6:5"` -> [Head(11, 3), Head(6, 5)] (for options that name heads explicitly)."""
    heads: list[Head] = []
    for part in (p.strip() for p in spec.split(",")):
        m = re.fullmatch(r"(\d+)\s*[:.]\s*(\d+)", part)
        if not m:
            raise AlignattError(f"bad head {part!r}: write heads as LAYER:HEAD, comma-separated")
        heads.append(Head(int(m.group(1)), int(m.group(2))))
    if len(set(heads)) != len(heads):
        raise AlignattError(f"heads {spec!r} name the same head twice")
    return heads


def layer_kind_spread(layer_kinds: list[str], num_heads: int) -> list[Head]:
    """Every (layer, head), ordered so that any prefix covers the layer kinds evenly.

    `layer_kinds[i]` names layer i's kind (e.g. "sliding", "full", "sliding/shared"). The order
    round-robins over kinds, within a kind over its layers, and walks the heads so that the
    first heads picked from different layers differ too: top-k for k >= number of kinds has a
    head on every kind. Deterministic: the same config always gives the same order.
    """
    kinds: dict[str, list[int]] = {}
    for layer, kind in enumerate(layer_kinds):
        kinds.setdefault(kind, []).append(layer)
    # Per kind: its (layer, head) list, layers cycling fastest, heads shifted per layer.
    queues: list[list[Head]] = []
    for layers in kinds.values():
        q = [
            Head(layer, (round_ + layer) % num_heads)
            for round_ in range(num_heads)
            for layer in layers
        ]
        queues.append(q)
    order: list[Head] = []
    i = 0
    while any(queues):
        q = queues[i % len(queues)]
        if q:
            order.append(q.pop(0))
        i += 1
    return order


def spread_head_set(
    model: str, layer_kinds: list[str], num_heads: int, direction: str = "en-de"
) -> HeadSet:
    """An uncalibrated set (all scores 0) for random-weight models, ranked by `layer_kind_spread`."""
    heads = layer_kind_spread(layer_kinds, num_heads)
    return HeadSet(
        model=model,
        direction=direction,
        num_layers=len(layer_kinds),
        num_heads=num_heads,
        used_pairs=0,
        used_target_tokens=0,
        score_name=SPREAD_SCORE_NAME,
        heads=[RankedHead(layer=h.layer, head=h.head, score=0.0, count=0) for h in heads],
    )


def _layer_kinds(config, model_name: str) -> tuple[list[str], int]:
    """Layer kinds ("sliding"/"full", "+shared" for KV-shared layers) and the per-layer head count."""
    from alignatt.core.layout import AttentionLayout

    layers = AttentionLayout.from_config(config).layers
    kinds = [la.kind + ("+shared" if la.kv_shared else "") for la in layers]
    n_heads = {la.n_heads for la in layers}
    if len(n_heads) != 1:
        raise AlignattError(f"{model_name}: layers differ in head count {sorted(n_heads)}")
    return kinds, n_heads.pop()


def default_head_set(model_name: str, direction: str = "en-de") -> HeadSet:
    """The head set a model uses unless told otherwise, from the model table.

    A preset (or a local checkpoint of a preset's architecture) gets its bundled calibrated set
    for the direction; random-weight presets get an uncalibrated layer-kind spread.
    """
    from alignatt.models.presets import MODEL_PRESETS, local_config, preset_for

    preset = preset_for(model_name)
    if preset is not None and direction in preset.head_sets:
        return load_head_set(preset.head_sets[direction])
    if preset is not None and preset.spread_heads:
        kinds, n_heads = _layer_kinds(local_config(preset.name), model_name)
        return spread_head_set(model_name, kinds, n_heads, direction)
    known = sorted(p.name for p in MODEL_PRESETS.values() if direction in p.head_sets or p.spread_heads)
    raise AlignattError(
        f"no default head set for model {model_name!r} ({direction}); models with one: "
        f"{', '.join(known) or 'none'}; pass a head set file instead (alignatt heads calibrate writes one)"
    )


def default_head_set_name(model_name: str, direction: str = "en-de") -> str:
    """The bundled set a model uses by default, or a description of the set it gets."""
    from alignatt.models.presets import preset_for

    preset = preset_for(model_name)
    if preset is not None and direction in preset.head_sets:
        return preset.head_sets[direction]
    if preset is not None and preset.spread_heads:
        return f"{SPREAD_SCORE_NAME} ({preset.name})"
    return f"default of {model_name} ({direction})"


def default_heads(model_name: str, k: int, direction: str = "en-de") -> list[Head]:
    return default_head_set(model_name, direction).top_k(k)


def describe_head_set(head_set: HeadSet, top: int | None = 10) -> str:
    """Human-readable summary: what the set is, then the best `top` heads (all if None)."""
    s = head_set
    lines = [
        f"{s.model}  {s.direction}  ({s.num_layers} layers x {s.num_heads} heads)",
        f"score: {s.score_name} on {s.used_pairs} pairs, {s.used_target_tokens} target tokens; "
        f"{len(s.heads)} heads listed",
    ]
    run = s.calibration_run
    if run is not None:
        lines.append(
            f"calibrated {run.created_utc or '(date unknown)'} on {run.device}/{run.dtype}: "
            f"{run.pairs_offered} pairs offered ({run.pairs_skipped} skipped) from {run.pairs_file}, "
            f"{run.seconds:.1f} s ({run.seconds_per_pair:.3f} s/pair)"
            + ("; synthetic weights" if run.synthetic_weights else "")
        )
        if run.split_half is not None:
            sh = run.split_half
            lines.append(
                f"split-half check: top-{sh.top_k} overlap {sh.overlap}/{sh.top_k}, "
                f"max |score delta| {sh.max_abs_score_delta:.3f}"
            )
    shown = s.heads if top is None else s.heads[: max(top, 0)]
    lines.append(f"{'rank':>4}  {'layer':>5}  {'head':>4}  {'score':>8}  {'count':>5}")
    for rank, h in enumerate(shown, 1):
        lines.append(f"{rank:>4}  {h.layer:>5}  {h.head:>4}  {h.score:>8.4f}  {h.count:>5}")
    return "\n".join(lines)


def describe_bundled() -> str:
    """One line per bundled head set."""
    lines = []
    for name in bundled_head_set_names():
        s = load_head_set(name)
        lines.append(f"{name}: {s.model} {s.direction}, {len(s.heads)} heads, best {s.heads[0].score:.3f}")
    return "\n".join(lines)
