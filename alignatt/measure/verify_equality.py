"""Verified re-drafts against drafting from scratch, on the bench prompts: what a client would see differ.

Each prompt is drafted from scratch, then drafted again on the same engine with that draft as its
proposal, as a session proposes its previous draft. Verification keeps a proposed token only where
it is the model's own argmax at its position (docs/batching.md), so in exact arithmetic the two
drafts are the same. In bf16 the verifying forward scores a kept token in a multi-token step, with
other kernels and accumulation order than a one-token decode step, and a near-tie can flip. This
counts, over the prompts: drafts whose tokens differ, emitted texts and decisions (AlignAtt's emit
count and stop reason on the draft's top heads) that differ, the proposed tokens kept, and the
largest attention-row difference on the tokens both drafts share before their first difference.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Sequence

import numpy as np

from alignatt.core.draft import Draft, DraftProposal, DraftRequest, agreeing_prefix


def _decision(draft: Draft, decision_heads: int) -> tuple[str, int, str]:
    from alignatt.checks.records import subset
    from alignatt.core.policy import decide

    if not draft.tokens or not draft.heads:
        return "", 0, "empty"
    result = decide(subset(draft, min(decision_heads, len(draft.heads))), draft.request.committed_words)
    return result.emitted_text, result.emit_count, result.stop_reason


def verified_against_scratch(seam: Any, requests: Sequence[DraftRequest], decision_heads: int = 4) -> dict:
    """The `VerifyEquality` fields (a dict) of `requests` on `seam` (one whose `verify` is on)."""
    draft_all = getattr(seam, "draft_many", None) or (lambda rs: [seam.draft(r) for r in rs])  # HF seams: one by one
    scratch = draft_all([replace(r, proposal=None) for r in requests])
    proposed = [replace(r, proposal=DraftProposal(tuple(t.token_id for t in d.tokens), r.target_prefix))
                for r, d in zip(requests, scratch) if d.tokens]
    verified = draft_all(proposed) if proposed else []
    pairs = list(zip([d for d in scratch if d.tokens], verified))  # a draft with no tokens has nothing to propose
    tokens = texts = decisions = 0
    row_max = 0.0
    for d, v in pairs:
        ids_d, ids_v = [t.token_id for t in d.tokens], [t.token_id for t in v.tokens]
        tokens += ids_d != ids_v
        (text_d, *rest_d), (text_v, *rest_v) = _decision(d, decision_heads), _decision(v, decision_heads)
        texts += text_d != text_v
        decisions += rest_d != rest_v
        for a, b in zip(d.tokens[:agreeing_prefix(ids_d, ids_v)], v.tokens):
            if a.rows.size and b.rows.shape == a.rows.shape:
                row_max = max(row_max, float(np.abs(a.rows - b.rows).max()))
    acceptance = [v.acceptance for v in verified if v.acceptance is not None]
    return {"prompts": len(pairs), "tokens_differ": tokens, "texts_differ": texts, "decisions_differ": decisions,
            "proposed": sum(a.proposed for a in acceptance), "accepted": sum(a.accepted for a in acceptance),
            "row_max_abs_diff": row_max if pairs else None}
