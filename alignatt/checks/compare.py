"""Comparing what the vLLM check workers sent back: drafts of two modes row by row, each request
of a batched step against the same request drafted alone, and the timing summary of a run.
Plain functions over `DraftRecord`s (alignatt.checks.records), used by alignatt.checks.vllm_checks.
"""

import statistics
from typing import Optional

import numpy as np

from alignatt.checks.messages import ALIGN_AGREEMENT_MIN, DraftRecord


def compare_drafts(a: list[DraftRecord], b: list[DraftRecord]) -> dict:
    """Row-by-row: same prompt and repeat in both lists."""
    index = {(r["id"], r["repeat"]): r for r in b}
    same_tokens = same_decisions = bit_identical = 0
    max_abs = 0.0
    aligned_same = aligned_total = 0
    differing: list[str] = []
    for ra in a:
        rb = index.get((ra["id"], ra["repeat"]))
        if rb is None:
            differing.append(f"{ra['id']}#{ra['repeat']}: missing")
            continue
        tok = ra["token_ids"] == rb["token_ids"]
        dec = ra.get("decision") == rb.get("decision")
        same_tokens += tok
        same_decisions += dec
        if tok and ra["rows"].shape == rb["rows"].shape:
            ident = bool(np.array_equal(ra["rows"], rb["rows"])) and all(
                np.array_equal(ra[k], rb[k]) for k in ("other", "generated") if ra[k] is not None)
            bit_identical += ident
            if ra["rows"].size:
                max_abs = max(max_abs, float(np.abs(ra["rows"] - rb["rows"]).max()))
                aligned_same += int((ra["rows"].argmax(-1) == rb["rows"].argmax(-1)).sum())
                aligned_total += int(ra["rows"].shape[0] * ra["rows"].shape[1])
        if not (tok and dec):
            differing.append(f"{ra['id']}#{ra['repeat']}: " + ("decision" if tok else "draft"))
    return {"rows": len(a), "identical_drafts": same_tokens, "identical_decisions": same_decisions,
            "bit_identical_rows": bit_identical, "max_abs_row_diff": max_abs,
            "aligned_agreement": aligned_same / aligned_total if aligned_total else None,
            "differing": differing[:48]}


def _min_cos(a: np.ndarray, b: np.ndarray) -> Optional[float]:
    a = a.reshape(-1, a.shape[-1]).astype(np.float64)
    b = b.reshape(-1, b.shape[-1]).astype(np.float64)
    if a.shape != b.shape or not a.size:
        return None
    cos = (a * b).sum(-1) / np.maximum(np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1), 1e-30)
    return float(cos.min())


BATCH_IDENTITY_MIN_COS = 0.9  # own capture: ~1 (batch numerics at most); another request's: ~0


def compare_batch(batch: list[DraftRecord], singles: list[DraftRecord]) -> dict:
    """Each request of a batched step vs the same request drafted alone (repeat 0).

    Own rows are judged on identity, not equality: a random-weight Gemma-4 amplifies the tiny
    numeric differences of batched GEMMs with depth, so a batched draft may part from the alone
    one. What cannot differ is whose q and keys were read: on the shallowest captured layer the
    first drafted token's q and the prompt's keys must match the request's own (cosine ~1; another
    request's are unrelated, ~0). Rows and tokens vs the alone draft are reported beside it.
    """
    alone = {r["id"]: r for r in singles if r["repeat"] == 0}
    out = []
    for rb in batch:
        ra = alone[rb["id"]]
        n = 0
        while n < min(len(ra["token_ids"]), len(rb["token_ids"])) and ra["token_ids"][n] == rb["token_ids"][n]:
            n += 1
        entry = {"id": rb["id"], "prompt_tokens": rb["prompt_tokens"], "tokens": rb["n_tokens"],
                 "same_token_prefix": n, "source_positions": int(rb["rows"].shape[-1]) if rb["rows"].size else 0}
        if n:
            d = np.abs(ra["rows"][:n] - rb["rows"][:n])
            entry["row_max_abs"] = float(d.max())
            entry["bit_identical_on_prefix"] = bool(np.array_equal(ra["rows"][:n], rb["rows"][:n]))
            entry["aligned_agreement"] = float((ra["rows"][:n].argmax(-1) == rb["rows"][:n].argmax(-1)).mean())
        pa, pb = ra.get("probe"), rb.get("probe")
        if pa is not None and pb is not None:
            entry["probe_layer"] = pb["layer"]
            entry["q0_min_cos"] = _min_cos(pb["q0"], pa["q0"])
            entry["prompt_keys_min_cos"] = _min_cos(pb["keys"], pa["keys"]) if pa["key_lo"] == pb["key_lo"] else None
            entry["own_rows"] = bool(entry["q0_min_cos"] is not None and entry["q0_min_cos"] >= BATCH_IDENTITY_MIN_COS
                                     and entry["prompt_keys_min_cos"] is not None
                                     and entry["prompt_keys_min_cos"] >= BATCH_IDENTITY_MIN_COS)
        else:  # no raw capture kept: fall back to agreement with the alone draft
            entry["own_rows"] = bool(n and entry["aligned_agreement"] >= ALIGN_AGREEMENT_MIN)
        out.append(entry)
    return {"requests": out, "passed": bool(out) and all(e["own_rows"] for e in out),
            "identity_min_cos": BATCH_IDENTITY_MIN_COS}


def timing_summary(drafts: list[DraftRecord]) -> dict:
    def med(values: list[float]) -> Optional[float]:
        return round(statistics.median(values), 3) if values else None

    rows = [r for r in drafts if r["n_tokens"] > 1]
    per_tok = lambda r: sum(r["timings"].values()) / r["n_tokens"]  # noqa: E731
    return {
        "rows": len(rows),
        "per_token_ms": med([per_tok(r) for r in rows]),
        "decode_ms_per_token": med([r["timings"]["decode_ms"] / (r["n_tokens"] - 1) for r in rows]),
        "prefill_ms": med([r["timings"]["prefill_ms"] for r in rows]),
        "fetch_ms": med([r["timings"]["capture_ms"] for r in rows]),
        "reconstruct_ms": med([r["timings"]["reconstruct_ms"] for r in rows]),
    }
