"""Head calibration: rank every (layer, head) by how often it points at the aligned source word.

For each word-aligned sentence pair the translation prompt is built with the source, the reference
target is teacher-forced as the assistant continuation, and ONE eager forward pass returns every
layer's attention (KV-shared layers included: eager attention returns their weights too). For
each target token inside an aligned target word, a head *hits* if its argmax over the source
token positions lands on a token of an aligned source word. The translation score (TS) of a head
is hits / scored target tokens over all pairs (a micro-average over tokens; the published E4B set
reports its pair and target-token counts the same way).

The row of target token t is the attention of the query that *predicts* t, i.e. of the position
before t: that is the row a drafting seam captures for a drafted token, so the calibrated heads
are the ones that work for the policy.

Memory stays bounded: one pair at a time, and only the [layers, heads, target, source] slice of
the attention is kept before the full matrices are dropped.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from importlib import resources
from pathlib import Path

import numpy as np
from pydantic import BaseModel, Field, ValidationError

from alignatt.core.errors import AlignattError
from alignatt.heads.sets import TS_SCORE_NAME, CalibrationRun, HeadSet, RankedHead, SplitHalfCheck

DEFAULT_PAIRS = "word_alignments_en-de.json"  # package data


class WordAlignment(BaseModel):
    source_span: tuple[int, int]  # [start, end) source word indices
    target_span: tuple[int, int]  # [start, end) target word indices
    confidence: float = 1.0


class AlignedPair(BaseModel):
    pair_id: int | str | None = None
    direction: str
    source_text: str = ""
    target_text: str
    source_words: list[str] = Field(min_length=1)
    target_words: list[str] = Field(min_length=1)
    alignments: list[WordAlignment]

    def aligned_source_words(self) -> list[set[int]]:
        """For each target word, the source words it is aligned to (empty set: unaligned)."""
        out: list[set[int]] = [set() for _ in self.target_words]
        for a in self.alignments:
            for t in range(max(a.target_span[0], 0), min(a.target_span[1], len(self.target_words))):
                out[t].update(range(max(a.source_span[0], 0), min(a.source_span[1], len(self.source_words))))
        return out


def reversed_pair(pair: AlignedPair) -> AlignedPair:
    """The same aligned pair read the other way (target -> source): word alignments are symmetric,
    so a cs-en set also calibrates en-cs (its Czech side is then the reference target)."""
    src, tgt = pair.direction.split("-")
    return AlignedPair(
        pair_id=pair.pair_id, direction=f"{tgt}-{src}", source_text=pair.target_text,
        target_text=pair.source_text or " ".join(pair.source_words), source_words=list(pair.target_words),
        target_words=list(pair.source_words),
        alignments=[WordAlignment(source_span=a.target_span, target_span=a.source_span, confidence=a.confidence)
                    for a in pair.alignments],
    )


def load_pairs(path: str | Path | None = None) -> list[AlignedPair]:
    """Word-aligned pairs from a JSON list (default: the bundled en-de pairs)."""
    if path is None:
        text = (resources.files("alignatt") / "data" / DEFAULT_PAIRS).read_text(encoding="utf-8")
        where = f"bundled {DEFAULT_PAIRS}"
    else:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise AlignattError(f"cannot read pairs file {path}: {e}") from None
        where = str(path)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise AlignattError(f"{where}: not valid JSON ({e})") from None
    if not isinstance(data, list) or not data:
        raise AlignattError(f"{where}: expected a non-empty JSON list of word-aligned pairs")
    pairs = []
    for i, item in enumerate(data):
        try:
            pairs.append(AlignedPair.model_validate(item))
        except ValidationError as e:
            err = e.errors()[0]
            loc = ".".join(str(p) for p in err["loc"])
            raise AlignattError(f"{where}: pair {i}: {loc}: {err['msg']}") from None
    return pairs


# ---- pure scoring (no model) ----


def argmax_hits(
    rows: np.ndarray, source_word_of_token: Sequence[int], aligned_words: Sequence[set[int]]
) -> np.ndarray:
    """Per (layer, head): how many target tokens' source argmax lands on an aligned source word.

    rows: [layers, heads, target_tokens, source_tokens] attention over the source positions.
    source_word_of_token: [source_tokens] source word index of each source token.
    aligned_words: [target_tokens] the aligned source words of each target token (non-empty).
    Returns int64 [layers, heads].
    """
    if rows.ndim != 4:
        raise ValueError(f"rows must be [layers, heads, targets, sources], got shape {rows.shape}")
    n_targets, n_sources = rows.shape[2], rows.shape[3]
    if len(aligned_words) != n_targets or len(source_word_of_token) != n_sources:
        raise ValueError("rows, source_word_of_token and aligned_words disagree in length")
    word = np.asarray(source_word_of_token)
    # hit_table[t, s]: source token s belongs to a source word aligned with target token t
    hit_table = np.array([np.isin(word, sorted(a)) for a in aligned_words], dtype=bool)
    top = rows.argmax(axis=-1)  # [L, H, T]
    hits = np.take_along_axis(hit_table[None, None], top[..., None], axis=-1)[..., 0]
    return hits.sum(axis=-1).astype(np.int64)


def rank_heads(hits: np.ndarray, scored_tokens: int, pairs_used: int) -> list[RankedHead]:
    """All heads, best TS first (ties: lower layer, then lower head first)."""
    n_layers, n_heads = hits.shape
    scores = hits / max(scored_tokens, 1)
    heads = [
        RankedHead(layer=l, head=h, score=round(float(scores[l, h]), 6), count=pairs_used)
        for l in range(n_layers)
        for h in range(n_heads)
    ]
    return sorted(heads, key=lambda r: (-r.score, r.layer, r.head))


def _top_heads(scores: np.ndarray, k: int) -> list[tuple[int, int]]:
    """The k best (layer, head) of a [layers, heads] score array; ties go to the lower index."""
    order = sorted(np.ndindex(scores.shape), key=lambda lh: (-scores[lh], lh))
    return [(int(l), int(h)) for l, h in order[:k]]


def split_half_check(pair_hits: np.ndarray, pair_tokens: np.ndarray, top_k: int = 8) -> SplitHalfCheck | None:
    """Score even- and odd-indexed pairs apart and compare their top-k (None with < 2 pairs).

    pair_hits: [pairs, layers, heads] hits per pair; pair_tokens: [pairs] scored tokens per pair.
    """
    if len(pair_hits) < 2:
        return None
    k = min(top_k, pair_hits.shape[1] * pair_hits.shape[2])

    def scores(sel: slice) -> np.ndarray:
        return pair_hits[sel].sum(axis=0) / max(int(pair_tokens[sel].sum()), 1)

    full, a, b = scores(slice(None)), scores(slice(0, None, 2)), scores(slice(1, None, 2))
    delta = max(abs(float(a[lh] - b[lh])) for lh in _top_heads(full, k))
    overlap = len(set(_top_heads(a, k)) & set(_top_heads(b, k)))
    return SplitHalfCheck(top_k=k, overlap=overlap, max_abs_score_delta=round(delta, 6))


def word_char_spans(text: str, words: Sequence[str]) -> list[tuple[int, int] | None]:
    """Character span of each word in `text`, found left to right; None if a word is not there.

    Some reference word lists do not match their text exactly (a stray quote, a different
    word): such words stay unmapped and the rest of the pair is still scored.
    """
    spans: list[tuple[int, int] | None] = []
    cursor = 0
    for w in words:
        w = w.strip()
        i = text.find(w, cursor) if w else -1
        if i < 0:
            spans.append(None)
            continue
        spans.append((i, i + len(w)))
        cursor = i + len(w)
    return spans


def token_words(
    token_spans: Sequence[tuple[int, int]], text: str, word_spans: Sequence[tuple[int, int] | None]
) -> list[int | None]:
    """Word of each token: the word containing the token's first non-space character."""
    out: list[int | None] = []
    for start, end in token_spans:
        first = next((c for c in range(start, end) if not text[c].isspace()), None)
        word = None
        if first is not None:
            for w, span in enumerate(word_spans):
                if span is not None and span[0] <= first < span[1]:
                    word = w
                    break
        out.append(word)
    return out


# ---- per pair: prompt, target tokens, attention slice ----


@dataclass
class PairInputs:
    input_ids: list[int]
    source_positions: list[int]  # absolute prompt positions of the source tokens
    source_word_of_token: list[int]
    query_positions: list[int]  # for each scored target token: the position that predicts it
    aligned_words: list[set[int]]  # for each scored target token: its aligned source words


class PairSkipped(Exception):
    """A pair that cannot be scored; the message is the reason (counted in the calibration run)."""


def pair_inputs(tokenizer, pair: AlignedPair) -> PairInputs:
    """Prompt ids with the reference target forced as the assistant turn, and what to score.

    The target's tokens and their character spans come from the same one-go tokenization of
    the whole prompt text that `build_prompt` uses, so they are the tokens the model sees.
    Raises `PairSkipped` when there is nothing to score.
    """
    from alignatt.core.draft import DraftRequest
    from alignatt.core.prompt import build_prompt

    target = pair.target_text.strip()
    request = DraftRequest(
        source_words=list(pair.source_words),
        committed_words=len(pair.source_words),
        target_prefix=target,
        source_lang=pair.direction.split("-")[0],
        target_lang=pair.direction.split("-")[1],
    )
    try:
        layout = build_prompt(tokenizer, request)
    except AlignattError as e:
        raise PairSkipped(f"prompt: {e}") from None
    text = layout.text
    if not text.endswith(target):
        raise PairSkipped("prompt does not end with the forced target")
    offset = len(text) - len(target)
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    if list(enc["input_ids"]) != list(layout.input_ids):
        raise PairSkipped("re-tokenizing the prompt gave different ids")
    # Target tokens: those ending past the target's start (a token may straddle the boundary).
    first = next((i for i, (a, b) in enumerate(enc["offset_mapping"]) if b > offset), None)
    if first is None or first == 0:
        raise PairSkipped("no target tokens in the prompt")
    spans = [(max(a, offset), b) for a, b in enc["offset_mapping"][first:]]
    word_spans = [
        None if s is None else (s[0] + offset, s[1] + offset)
        for s in word_char_spans(target, pair.target_words)
    ]
    aligned = pair.aligned_source_words()
    query_positions, aligned_words = [], []
    for k, w in enumerate(token_words(spans, text, word_spans)):
        if w is not None and aligned[w]:
            query_positions.append(first + k - 1)  # the position whose output predicts this token
            aligned_words.append(aligned[w])
    if not query_positions:
        raise PairSkipped("no target token inside an aligned target word")
    return PairInputs(
        input_ids=list(layout.input_ids),
        source_positions=list(layout.source_token_positions),
        source_word_of_token=list(layout.source_word_of_token),
        query_positions=query_positions,
        aligned_words=aligned_words,
    )


def source_rows(model, inputs: PairInputs) -> np.ndarray:
    """One eager forward with all attentions; keep only [layers, heads, scored targets, sources]."""
    import torch

    device = next(model.parameters()).device
    ids = torch.tensor([inputs.input_ids], device=device)
    q = torch.tensor(inputs.query_positions, device=device)
    s = torch.tensor(inputs.source_positions, device=device)
    with torch.inference_mode():
        out = model(input_ids=ids, output_attentions=True, use_cache=False)
        attentions = out.attentions
        if not attentions or any(a is None for a in attentions):
            raise AlignattError("the model returned no attention weights (eager attention required)")
        sliced = [a[0].index_select(1, q).index_select(2, s).float().cpu() for a in attentions]
        del out, attentions
    return torch.stack(sliced).numpy()


class _EagerAttention:
    """Switch a model to eager attention for the calibration, then restore what it had."""

    def __init__(self, model):
        self.model = model
        self.previous = getattr(model.config, "_attn_implementation", None)

    def __enter__(self):
        if self.previous != "eager":
            self.model.set_attn_implementation("eager")
        return self.model

    def __exit__(self, *exc):
        if self.previous not in (None, "eager"):
            self.model.set_attn_implementation(self.previous)


def calibrate(
    model,
    pairs: Sequence[AlignedPair] | str | Path | None = None,
    max_pairs: int | None = None,
    device: str = "cpu",
    dtype: str | None = None,
    progress: bool = True,
    reverse: bool = False,
) -> HeadSet:
    """Score every head of `model` (a preset name, path or `LoadedModel`) on word-aligned pairs."""
    import torch
    import transformers
    from alignatt.core.progress import track

    if max_pairs is not None and max_pairs < 1:
        raise AlignattError(f"--max-pairs must be >= 1, got {max_pairs}")
    pairs_file = "(given)" if not isinstance(pairs, (str, Path, type(None))) else str(pairs or f"alignatt/data/{DEFAULT_PAIRS}")
    if pairs is None or isinstance(pairs, (str, Path)):
        pairs = load_pairs(pairs)
    pairs = list(pairs)[:max_pairs] if max_pairs else list(pairs)
    if reverse:
        pairs, pairs_file = [reversed_pair(p) for p in pairs], f"{pairs_file} (reversed)"
    if not pairs:
        raise AlignattError("no pairs to calibrate on")
    directions = {p.direction for p in pairs}
    if len(directions) != 1:
        raise AlignattError(f"pairs mix directions {sorted(directions)}: calibrate one direction at a time")

    if isinstance(model, str):
        from alignatt.models.presets import load_model

        model = load_model(model, device=device, dtype=dtype)
    layout = model.layout
    n_heads = {la.n_heads for la in layout.layers}
    if len(n_heads) != 1:
        raise AlignattError(f"{model.name}: layers differ in head count {sorted(n_heads)}")
    num_layers, num_heads = layout.n_layers, n_heads.pop()

    pair_hits: list[np.ndarray] = []  # [layers, heads] per used pair (small: kept for the split check)
    pair_tokens: list[int] = []
    skip_reasons: dict[str, int] = {}
    t0 = time.perf_counter()
    with _EagerAttention(model.model) as hf_model:
        for pair in track(pairs, "calibrating heads", "pair", progress):
            try:
                inputs = pair_inputs(model.tokenizer, pair)
            except PairSkipped as e:
                reason = re.sub(r"\[[^\]]*\]|\d+|'[^']*'", "_", str(e))  # group alike reasons
                skip_reasons[reason] = skip_reasons.get(reason, 0) + 1
                continue
            rows = source_rows(hf_model, inputs)
            if rows.shape[:2] != (num_layers, num_heads):
                raise AlignattError(
                    f"attention shape {rows.shape[:2]} does not match the layout ({num_layers}, {num_heads})"
                )
            pair_hits.append(argmax_hits(rows, inputs.source_word_of_token, inputs.aligned_words))
            pair_tokens.append(len(inputs.query_positions))
    seconds = time.perf_counter() - t0
    used, scored_tokens = len(pair_hits), int(sum(pair_tokens))
    if used == 0:
        raise AlignattError(f"none of the {len(pairs)} pairs had a target token to score")

    param = next(model.model.parameters())
    return HeadSet(
        model=model.name,
        direction=directions.pop(),
        num_layers=num_layers,
        num_heads=num_heads,
        used_pairs=used,
        used_target_tokens=scored_tokens,
        score_name=TS_SCORE_NAME,
        heads=rank_heads(np.sum(pair_hits, axis=0), scored_tokens, used),
        calibration_run=CalibrationRun(
            pairs_file=pairs_file,
            pairs_offered=len(pairs),
            pairs_skipped=sum(skip_reasons.values()),
            skip_reasons=skip_reasons,
            device=str(param.device),
            dtype=str(param.dtype).removeprefix("torch."),
            synthetic_weights=bool(getattr(model, "synthetic_weights", False)),
            seconds=round(seconds, 2),
            seconds_per_pair=round(seconds / len(pairs), 4),
            model_id=str(getattr(model, "model_id", "") or model.name),
            split_half=split_half_check(np.stack(pair_hits), np.array(pair_tokens)),
            torch_version=torch.__version__,
            transformers_version=transformers.__version__,
            created_utc=datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        ),
    )
