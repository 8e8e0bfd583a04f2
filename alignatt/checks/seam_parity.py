"""Seam parity: do two capture seams draft the same tokens and rebuild the same attention rows?

Each prompt is drafted by every seam on one loaded model; rows are compared token by token while
the drafts agree (a row depends only on the context before it, so the row of the first differing
token is still comparable). The default prompts are the published capture benchmark's (with and
without a target prefix); the default heads are every head of the model, so every layer kind
(sliding, full, KV-shared) is covered.
"""

from __future__ import annotations

import json
from contextlib import ExitStack, closing
from importlib import resources
from typing import Sequence

import numpy as np
from pydantic import BaseModel

from alignatt.capture.names import HF_SEAMS
from alignatt.core.draft import Draft, DraftRequest, Head
from alignatt.core.errors import AlignattError

PARITY_TOLERANCE = 1e-5  # fp32; the bound for hf_eager vs hf_qk_fast


class PromptParity(BaseModel):
    id: str
    drafts: dict[str, str]  # seam -> draft text
    identical: bool
    rows_compared: int
    max_abs_row_diff: float
    max_abs_mass_diff: float


class ParityReport(BaseModel):
    model: str
    seams: list[str]
    device: str
    dtype: str
    heads: list[tuple[int, int]]
    layer_kinds: list[str]  # kinds of the compared heads' layers (sliding / full, +shared)
    prompts: int
    rows_compared: int
    max_abs_row_diff: float
    max_abs_mass_diff: float  # other-prompt and generated mass per head
    drafts_identical: bool
    tolerance: float
    passed: bool
    per_prompt: list[PromptParity]


def default_requests(max_new_tokens: int = 12, limit: int | None = None) -> list[tuple[str, DraftRequest]]:
    """The capture benchmark's fixed prompts as draft requests."""
    data = json.loads((resources.files("alignatt") / "data" / "mt_capture_prompts.json").read_text())
    out = []
    for p in data["prompts"][:limit]:
        words = p["source_text"].split()
        out.append((p["id"], DraftRequest(
            source_words=words,
            committed_words=min(p["accessible_units"], len(words)),
            target_prefix=p["assistant_prefill"],
            max_new_tokens=max_new_tokens,
        )))
    return out


def compare_drafts(a: Draft, b: Draft) -> tuple[int, float, float, bool]:
    """(rows compared, max |row diff|, max |mass diff|, identical token ids)."""
    ids_a, ids_b = [t.token_id for t in a.tokens], [t.token_id for t in b.tokens]
    n = 0
    while n < min(len(ids_a), len(ids_b)) and ids_a[n] == ids_b[n]:
        n += 1
    n_cmp = min(n + 1, len(ids_a), len(ids_b))  # the first differing token's row is comparable too
    rows = mass = 0.0
    for ta, tb in zip(a.tokens[:n_cmp], b.tokens[:n_cmp]):
        rows = max(rows, float(np.abs(ta.rows - tb.rows).max(initial=0.0)))
        mass = max(
            mass,
            float(np.abs(ta.other_prompt_mass - tb.other_prompt_mass).max()),
            float(np.abs(ta.generated_mass - tb.generated_mass).max()),
        )
    compared = n_cmp * len(a.heads)
    return compared, rows, mass, ids_a == ids_b and a.stop_reason == b.stop_reason


def run_parity(
    model: str = "tiny-gemma4",
    seams: Sequence[str] = HF_SEAMS,
    heads: list[Head] | None = None,
    device: str = "cpu",
    dtype: str | None = "float32",
    max_new_tokens: int = 12,
    limit: int | None = None,
    requests: list[tuple[str, DraftRequest]] | None = None,
    tolerance: float = PARITY_TOLERANCE,
) -> ParityReport:
    from alignatt.models.presets import load_model
    from alignatt.capture.registry import make_seam

    seams = list(seams)
    if len(seams) < 2 or len(set(seams)) != len(seams):
        raise AlignattError(f"parity needs two or more different seams, got {','.join(seams) or 'none'}")
    loaded = load_model(model, device=device, dtype=dtype)
    heads = loaded.layout.validate_heads(heads if heads is not None else loaded.layout.all_heads())
    requests = requests if requests is not None else default_requests(max_new_tokens, limit)
    if not requests:
        raise AlignattError("no prompts to compare")
    with ExitStack() as stack:
        built = {name: stack.enter_context(closing(make_seam(name, model=model, heads=heads, device=device,
                                                               dtype=dtype))) for name in seams}
        drafted = [(pid, {name: seam.draft(request) for name, seam in built.items()}) for pid, request in requests]

    per_prompt = []
    for pid, drafts in drafted:
        ref = drafts[seams[0]]
        compared, rows, mass, same = 0, 0.0, 0.0, True
        for name in seams[1:]:
            c, r, m, s = compare_drafts(ref, drafts[name])
            compared, rows, mass, same = compared + c, max(rows, r), max(mass, m), same and s
        per_prompt.append(PromptParity(
            id=pid, drafts={n: d.text for n, d in drafts.items()}, identical=same,
            rows_compared=compared, max_abs_row_diff=rows, max_abs_mass_diff=mass,
        ))
    layer_kinds = sorted({
        loaded.layout[h.layer].kind + ("+shared" if loaded.layout[h.layer].kv_shared else "") for h in heads
    })
    max_rows = max(p.max_abs_row_diff for p in per_prompt)
    max_mass = max(p.max_abs_mass_diff for p in per_prompt)
    identical = all(p.identical for p in per_prompt)
    return ParityReport(
        model=loaded.name,
        seams=seams,
        device=device,
        dtype=loaded.dtype,
        heads=[(h.layer, h.head) for h in heads],
        layer_kinds=layer_kinds,
        prompts=len(per_prompt),
        rows_compared=sum(p.rows_compared for p in per_prompt),
        max_abs_row_diff=max_rows,
        max_abs_mass_diff=max_mass,
        drafts_identical=identical,
        tolerance=tolerance,
        passed=identical and max_rows <= tolerance and max_mass <= tolerance,
        per_prompt=per_prompt,
    )


def describe(report: ParityReport) -> str:
    verdict = "PASS" if report.passed else "FAIL"
    return "\n".join([
        f"{verdict}  {report.model} ({report.device}, {report.dtype})  {' vs '.join(report.seams)}",
        f"heads: {len(report.heads)} on layer kinds {', '.join(report.layer_kinds)}",
        f"prompts: {report.prompts}  rows compared: {report.rows_compared}",
        f"max |row diff|: {report.max_abs_row_diff:.3g}  max |mass diff|: {report.max_abs_mass_diff:.3g}"
        f"  (tolerance {report.tolerance:g})",
        f"drafts identical: {'yes' if report.drafts_identical else 'no'}",
    ])

