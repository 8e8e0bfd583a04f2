"""The criterion a served vLLM mode is scored on, where it cannot be bit-identical with eager.

`fullgraph` (the mode `alignatt serve` runs) pads a prefill to a captured size, so its GEMMs run
other shapes than eager's and a few bf16 drafts part from eager's. Such a mode is scored when the
latest `exact_<mode>` check (`alignatt check-vllm`) shows three things:
- **its rows are the attention the model computed in that run.** The self-consistency of every
  captured layer passes: the layer's own attention output equals softmax(q K) V rebuilt from the
  captured q and the cached K/V. This holds for single drafts and for drafts in a batch.
- **each request in a batch reads its own q and keys** (the batch identity check).
- **it departs from eager no more than eager departs from itself when the batch changes.** That
  is the bf16 noise band every served draft lives in, since the server batches whatever sessions
  are live. The share of the mode's drafts that equal eager's, token for token, must be at least
  eager's own share of draft tokens kept from alone to batched (the mean same-token prefix). Where
  the tokens agree, the rows may differ from eager's by at most what eager's own rows moved in the batch.

The bit-for-bit comparison stays a separate check (`cudagraph` passes it); this criterion is
what a mode that is served, and not bit-identical, is held to.
"""

from __future__ import annotations

from typing import Any


def _eager_band(raw: dict) -> tuple[float | None, float | None]:
    """Eager's own change from alone to batched: the mean share of a draft's tokens kept (same-token
    prefix / tokens) and the largest row difference on those kept tokens (None: not measured)."""
    requests = ((raw.get("batch") or {}).get("eager") or {}).get("requests") or []
    shares = [r["same_token_prefix"] / r["tokens"] for r in requests if r.get("tokens")]
    diffs = [r["row_max_abs"] for r in requests if r.get("row_max_abs") is not None]
    return (sum(shares) / len(shares) if shares else None), (max(diffs) if diffs else None)


def served_criterion(exactness: dict[str, dict[str, Any]], mode: str) -> dict[str, Any] | None:
    """The mode's verdict on the criterion above, with its figures, from its latest check as
    `page.graph_exactness` found it (None: no check of it yet)."""
    latest = exactness.get(mode)
    if latest is None:
        return None
    raw = latest["check"]
    cmp = raw[f"{mode}_vs_eager"]
    consistency = raw.get("self_consistency") or {}
    own = [v for k, v in consistency.items() if k.startswith(mode)]
    consistent = bool(own) and all((c or {}).get("passed") for c in own)
    batch = (raw.get("batch") or {}).get(mode) or {}
    agreement = cmp["identical_drafts"] / cmp["rows"] if cmp.get("rows") else None
    band, row_band = _eager_band(raw)
    row_diff = cmp.get("max_abs_row_diff")
    within = (agreement is not None and band is not None and agreement >= band
              and row_diff is not None and row_diff <= (row_band or 0.0))
    return dict(mode=mode, path=latest["path"], date=latest["date"], rows=cmp.get("rows"),
                identical=cmp.get("identical_drafts"), agreement=agreement, band=band,
                row_diff=row_diff, row_band=row_band, consistent=consistent,
                own_rows=bool(batch.get("passed")), passed=bool(consistent and batch.get("passed") and within))
