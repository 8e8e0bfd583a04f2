"""Draft records and probes that the vLLM check workers compute: plain data the parent compares.

Shared by the draft worker (`checks.worker`) and the cross-engine parity worker
(`checks.cross_engine`), so neither imports the other.
"""


import json
import time
from importlib import resources
from typing import Any

import numpy as np

from alignatt.checks.messages import SELF_CONSISTENCY_MIN_COS, SELF_CONSISTENCY_REL_TOL, DraftRecord


def say(message: str) -> None:
    print(f"[vllm_checks {time.strftime('%H:%M:%S')}] {message}", flush=True)


# Three lengths for the batch check: decode batch 3 -> graph 4.
BATCH_IDS = ["short_01", "medium_02_prefill", "long_01"]
# KV cache per engine: what the checks need (one 4096-token request fits with room; the batch
# check runs three short ones), not 4 GiB: the query cache has a row per KV slot, so its size
# follows (E4B: 4096 blocks).
E4B_KV_GIB = 1.0


def bench_requests(tokens: int) -> list[tuple[str, Any]]:
    from alignatt.core.draft import DraftRequest

    data = json.loads((resources.files("alignatt") / "data" / "mt_capture_prompts.json").read_text())
    return [
        (p["id"], DraftRequest(source_words=p["source_text"].split(), committed_words=int(p["accessible_units"]),
                               target_prefix=p.get("assistant_prefill", "") or "", max_new_tokens=tokens))
        for p in data["prompts"]
    ]


def subset(draft: Any, k: int) -> Any:
    """The same draft seen through its first k heads (decisions use the top-k heads)."""
    from dataclasses import replace

    from alignatt.core.draft import TokenCapture

    tokens = [TokenCapture(t.token_id, t.piece, t.rows[:k], t.other_prompt_mass[:k], t.generated_mass[:k])
              for t in draft.tokens]
    return replace(draft, heads=draft.heads[:k], tokens=tokens)


def draft_record(pid: str, repeat: int, draft: Any, decision_heads: int) -> DraftRecord:
    from alignatt.core.policy import decide

    n_heads = len(draft.heads)
    rows = np.stack([t.rows for t in draft.tokens]) if draft.tokens else np.zeros((0, n_heads, 0), np.float32)
    rec: DraftRecord = {
        "id": pid, "repeat": repeat, "token_ids": [t.token_id for t in draft.tokens], "text": draft.text,
        "stop_reason": draft.stop_reason, "rows": rows.astype(np.float32),
        "other": np.stack([t.other_prompt_mass for t in draft.tokens]) if draft.tokens else None,
        "generated": np.stack([t.generated_mass for t in draft.tokens]) if draft.tokens else None,
        "timings": {"prefill_ms": draft.timings.prefill_ms, "decode_ms": draft.timings.decode_ms,
                    "capture_ms": draft.timings.capture_ms, "reconstruct_ms": draft.timings.reconstruct_ms},
        "n_tokens": len(draft.tokens), "prompt_tokens": draft.prompt_token_count,
    }
    if n_heads and draft.tokens:
        sub = subset(draft, min(decision_heads, n_heads))
        result = decide(sub, draft.request.committed_words)
        rec["decision"] = {
            "emit_count": result.emit_count, "stop_reason": result.stop_reason,
            "emitted_text": result.emitted_text,
            "emit": [bool(d.emit) for d in result.decisions],
            "aligned_word": [int(d.aligned_word) for d in result.decisions],
        }
    return rec


def choose_tokenizer(choice: str) -> tuple[Any, str]:
    """'auto': the Gemma tokenizer alignatt uses for synthetic E4B if this host has one, else the
    byte-level test tokenizer (prompt ids are then not Gemma's; timing and correctness are not
    affected, and the artifact says which one ran)."""
    from alignatt.models.presets import tiny_tokenizer

    if choice == "tiny":
        return tiny_tokenizer(), "tiny byte-level"
    try:
        from alignatt.models.presets import synthetic_tokenizer

        return synthetic_tokenizer(), "gemma (alignatt.models.presets.synthetic_tokenizer)"
    except Exception as e:  # noqa: BLE001 - any failure: fall back, and say so
        return tiny_tokenizer(), f"tiny byte-level (no Gemma tokenizer on this host: {str(e).splitlines()[0][:200]})"


def identity_probe(raw: Any, prompt_tokens: int) -> dict:
    """What identifies a request's capture on its shallowest captured layer: the first drafted
    token's q (all captured heads) and the prompt's keys, as read back through its block table."""
    layer = min(raw.layers)
    d = raw.layers[layer]
    return {"layer": int(layer), "q0": np.asarray(d["q"][0], dtype=np.float32),
            "keys": np.asarray(d["keys"][: max(0, prompt_tokens - int(d["key_lo"]))], dtype=np.float32),
            "key_lo": int(d["key_lo"])}


def self_consistency(seam: Any, internal_ids: list[str]) -> dict:
    """Captured q + cached K/V rebuild the layer's own attention output (captured in the op)."""
    import torch

    from alignatt.capture.vllm.qcache import rebuild_output

    own: dict[int, list] = {}
    rebuilt: dict[int, list] = {}
    for rid in internal_ids:
        raw = seam.raw.get(rid)
        if raw is None:
            continue
        for layer, d in raw.layers.items():
            probs = torch.from_numpy(d["probs"])
            rebuilt.setdefault(layer, []).append(rebuild_output(seam.plans[layer], probs, torch.from_numpy(d["values"])))
            own.setdefault(layer, []).append(torch.from_numpy(d["out"]).float())
    return summarize_consistency(own, rebuilt)


def summarize_consistency(own: dict, rebuilt: dict) -> dict:
    """Per layer: norm-relative error and cosine (live rows only) of the layer's own output vs the
    rebuild; overall status 'passed', 'failed' or 'degenerate activations'."""
    import torch

    from alignatt.capture.vllm.qcache import TINY_OUTPUT_RMS, consistency_stats, judge_consistency

    layers = {}
    for layer in sorted(own):
        stats = consistency_stats(torch.cat(own[layer]), torch.cat(rebuilt[layer]))
        stats["status"] = judge_consistency(stats, SELF_CONSISTENCY_REL_TOL, SELF_CONSISTENCY_MIN_COS)
        stats["passed"] = stats["status"] == "passed"
        layers[str(layer)] = stats
    degenerate = [int(k) for k, v in layers.items() if v["status"] == "degenerate activations"]
    if not layers:
        status = "no rows captured"
    elif degenerate:
        status = "degenerate activations"
        say(f"SELF-CONSISTENCY: DEGENERATE ACTIVATIONS on layers {degenerate}: the attention outputs are ~0, "
            "so this check cannot say anything (are the weights the dummy loader's?)")
    else:
        status = "passed" if all(v["passed"] for v in layers.values()) else "failed"
    return {"layers": layers, "status": status, "passed": status == "passed", "degenerate_layers": degenerate,
            "tolerance": {"max_rel_err": SELF_CONSISTENCY_REL_TOL, "min_cos": SELF_CONSISTENCY_MIN_COS,
                          "tiny_output_rms": TINY_OUTPUT_RMS, "min_live_fraction": 0.5}}


def draft_variety(drafts: list[DraftRecord]) -> dict:
    """Are the drafts real text, or one token everywhere (the signature of vanished activations:
    every logit ties and greedy picks token 0)? A random model's loops are not flagged."""
    tokens = [t for r in drafts for t in r["token_ids"]]
    if not tokens:
        return {"tokens": 0, "distinct_tokens": 0, "most_common_fraction": None, "degenerate": True}
    counts: dict[int, int] = {}
    for t in tokens:
        counts[t] = counts.get(t, 0) + 1
    top = max(counts.values()) / len(tokens)
    return {"tokens": len(tokens), "distinct_tokens": len(counts), "most_common_fraction": round(top, 4),
            "degenerate": len(counts) <= 1}
