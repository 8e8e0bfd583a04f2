"""One vLLM engine per subprocess: what a GPU check asks of it and what it sends back.

`run_worker(spec)` (parent side) writes the spec as JSON and runs `python -m alignatt.checks.worker
SPEC`; the worker builds one `VllmCaptureSeam` (or, for parity, one engine of
alignatt.checks.cross_engine), drafts, and pickles plain data back: per draft its tokens, rows, masses,
timings and AlignAtt decisions (`draft_record`), plus self-consistency and identity probes. A
crash or timeout loses only that worker's check.
"""

import json
import os
import pickle
import subprocess
import sys
import time
import traceback
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np


def say(message: str) -> None:
    print(f"[vllm_checks {time.strftime('%H:%M:%S')}] {message}", flush=True)


# Three lengths for the batch check: decode batch 3 -> graph 4.
BATCH_IDS = ["short_01", "medium_02_prefill", "long_01"]
# KV cache per engine: what the checks need (one 4096-token request fits with room; the batch
# check runs three short ones), not 4 GiB: the query cache has a row per KV slot, so its size
# follows (E4B: 4096 blocks).
E4B_KV_GIB = 1.0
SELF_CONSISTENCY_REL_TOL = 0.02  # ||own - rebuilt|| / ||rebuilt|| per row: bf16 output vs fp32 rebuild
SELF_CONSISTENCY_MIN_COS = 0.999


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


def draft_record(pid: str, repeat: int, draft: Any, decision_heads: int) -> dict:
    from alignatt.core.policy import decide

    n_heads = len(draft.heads)
    rows = np.stack([t.rows for t in draft.tokens]) if draft.tokens else np.zeros((0, n_heads, 0), np.float32)
    rec = {
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


def draft_variety(drafts: list[dict]) -> dict:
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


def worker_drafts(spec: dict) -> dict:
    from alignatt.core.draft import Head
    from alignatt.capture.vllm.seam import VllmCaptureSeam

    tokenizer, tok_name = choose_tokenizer(spec.get("tokenizer", "auto"))
    heads = [Head(l, h) for l, h in spec["heads"]]
    seam = VllmCaptureSeam(
        spec["model"], heads, vllm_mode=spec["mode"], dtype="bfloat16",
        fixed_length=spec.get("fixed_length", True), capture=spec.get("capture", True),
        capture_output=spec.get("capture_output", False), keep_raw=spec.get("capture_output", False),
        tokenizer=tokenizer, max_model_len=spec.get("max_model_len", 4096),
        kv_cache_memory_gib=spec.get("kv_cache_memory_gib", E4B_KV_GIB),
    )
    result: dict = {"describe": seam.describe(), "tokenizer": tok_name, "drafts": []}
    requests = bench_requests(spec["tokens"])
    k = spec.get("decision_heads", 8)
    ids: list[str] = []
    try:
        for _ in range(spec.get("warmup", 1)):
            for pid, req in requests:
                seam.draft(req)
        seam.raw.clear()
        for rep in range(spec.get("repeats", 3)):
            for pid, req in requests:
                d = seam.draft(req)
                rec = draft_record(pid, rep, d, k)
                if seam.keep_raw:
                    ids.append(seam.last_raw_id)
                    if rep == 0 and pid in BATCH_IDS:
                        rec["probe"] = identity_probe(seam.raw[seam.last_raw_id], d.prompt_token_count)
                result["drafts"].append(rec)
            say(f"{spec['mode']}: repeat {rep + 1} done")
        if seam.capture_output:
            result["self_consistency"] = self_consistency(seam, ids)
        if spec.get("batch_check"):
            chosen = [(pid, req) for pid, req in requests if pid in BATCH_IDS]
            seam.raw.clear()
            before = set(seam.raw)
            batch = seam.draft_many([req for _, req in chosen])
            result["batch"] = [draft_record(pid, -1, d, k) for (pid, _), d in zip(chosen, batch)]
            if seam.keep_raw:  # draft_many finishes requests in any order: match raw captures by prompt length
                raws = {int(seam.raw[r].query_positions[0]): seam.raw[r] for r in seam.raw if r not in before}
                for rec, d in zip(result["batch"], batch):
                    raw = raws.get(d.prompt_token_count - 1)
                    if raw is not None:
                        rec["probe"] = identity_probe(raw, d.prompt_token_count)
            if seam.capture_output:
                result["batch_self_consistency"] = self_consistency(seam, list(seam.raw))
    finally:
        seam.close()
    return result


def worker_main(spec_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text())
    try:
        from alignatt.checks.cross_engine import worker_parity_hf, worker_parity_vllm

        tasks = {"drafts": worker_drafts, "parity_vllm": worker_parity_vllm, "parity_hf": worker_parity_hf}
        result = tasks[spec["task"]](spec)
        result["ok"] = True
    except Exception as e:  # noqa: BLE001 - the parent records it
        traceback.print_exc()
        result = {"ok": False, "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-4000:]}
    with open(spec["result"], "wb") as f:
        pickle.dump(result, f)
    return 0 if result["ok"] else 1


def run_worker(spec: dict, workdir: Path, timeout_s: float) -> dict:
    name = spec["name"]
    spec = dict(spec, result=str(workdir / f"{name}.pkl"))
    Path(spec["result"]).unlink(missing_ok=True)  # a rerun in the same work dir must not read the last result
    spec_path = workdir / f"{name}.json"
    spec_path.write_text(json.dumps(spec))
    say(f"worker {name}: start (timeout {timeout_s:.0f} s)")
    started = time.perf_counter()
    try:
        env = dict(os.environ, **spec.get("env", {}))
        proc = subprocess.run([sys.executable, "-m", "alignatt.checks.worker", str(spec_path)],
                              timeout=timeout_s, env=env)
        rc = proc.returncode
    except subprocess.TimeoutExpired:
        return {"ok": False, "error": f"timed out after {timeout_s:.0f} s", "wall_s": timeout_s}
    wall = time.perf_counter() - started
    path = Path(spec["result"])
    if not path.exists():
        return {"ok": False, "error": f"worker exited with {rc} and wrote no result", "wall_s": wall}
    with open(path, "rb") as f:
        result = pickle.load(f)
    result["wall_s"] = round(wall, 1)
    say(f"worker {name}: {'ok' if result.get('ok') else 'FAILED: ' + result.get('error', '')} in {wall:.0f} s")
    return result


if __name__ == "__main__":
    sys.exit(worker_main(sys.argv[1]))
