"""GPU correctness checks for `vllm_capture` (issue 3), each writing into one JSON artifact.

    python -m alignatt.vllm_checks all --out OUT/vllm_checks.json [--only demo,exact,...]

Checks, in order (each vLLM engine runs in its own subprocess: a crash or a timeout loses only
that check, and the artifact is rewritten after every check):
- demo:      naive vs fixed capture under real CUDA-graph replay (plain torch) and on CPU.
- exact:     E4B synthetic weights, 16 benchmark prompts x (1 warm-up + 3 repeats), 20 tokens:
             full decode graphs without torch.compile vs eager: identical drafts, identical
             emit/hold decisions, bit-identical rows on all 48 rows; plus the batch check (three
             different requests in one step, decode padded 3 -> 4) in both modes, and eager
             self-consistency (q and cached K/V reproduce the layer's own attention output).
- parity:    a reduced-depth Gemma-4 (sliding, full and KV-shared layers), random weights saved
             once as safetensors, loaded by vLLM (eager) and by transformers: rows, aligned source
             positions, and per-layer q/k agreement (teacher-forced on vLLM's tokens), plus the
             real `hf_qk_fast` seam's drafts on the same weights.
- compiled:  torch.compile + graphs: self-consistency and its differences from eager.
- speed:     captured vs uncaptured decode, full decode graphs (top-8 heads, 20 tokens).
- speed_compiled: the same for the compiled mode (slow engine start; not in `all` by default).
"""

import argparse
import json
import math
import os
import pickle
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from importlib import resources
from pathlib import Path
from typing import Any, Optional

import numpy as np

SCHEMA_VERSION = 1
DEFAULT_CHECKS = ("demo", "exact", "parity", "compiled", "speed")
ALL_CHECKS = DEFAULT_CHECKS + ("speed_compiled",)
# Published top-8 E4B en->de heads, plus two heads on KV-shared layers (29: full, reads layer 23;
# 26: sliding, reads layer 22) so graphs vs eager is also proven there. Decisions use the top 8.
E4B_TOP8 = [(11, 3), (6, 5), (17, 3), (20, 0), (5, 0), (11, 2), (10, 0), (10, 4)]
E4B_SHARED = [(29, 2), (26, 5)]
# Reduced Gemma-4 for parity: 12 layers, s s s s s F s s | s s s F (last 4 KV-shared: sliding
# ones read layer 7, the full one reads layer 5). Heads on every layer kind.
PARITY_HEADS = [(0, 1), (2, 5), (5, 2), (5, 6), (7, 3), (8, 0), (9, 4), (11, 3), (11, 7)]
BATCH_IDS = ["short_01", "medium_02_prefill", "long_01"]  # three lengths: decode batch 3 -> graph 4
SELF_CONSISTENCY_REL_TOL = 0.02  # bf16 output vs fp32 rebuild, relative to the output's max |x|
SELF_CONSISTENCY_MIN_COS = 0.999
ROW_TOL_MAX, ROW_TOL_MEAN = 0.05, 0.005  # "within bf16 tolerance" for rows across engines
ALIGN_AGREEMENT_MIN = 0.95


def say(message: str) -> None:
    print(f"[vllm_checks {time.strftime('%H:%M:%S')}] {message}", flush=True)


# ---- prompts, heads, drafts as plain data ----


def bench_requests(tokens: int) -> list[tuple[str, Any]]:
    from alignatt.capture import DraftRequest

    data = json.loads((resources.files("alignatt") / "data" / "mt_capture_prompts.json").read_text())
    return [
        (p["id"], DraftRequest(source_words=p["source_text"].split(), committed_words=int(p["accessible_units"]),
                               target_prefix=p.get("assistant_prefill", "") or "", max_new_tokens=tokens))
        for p in data["prompts"]
    ]


def subset(draft: Any, k: int) -> Any:
    """The same draft seen through its first k heads (decisions use the top-k heads)."""
    from dataclasses import replace

    from alignatt.capture import TokenCapture

    tokens = [TokenCapture(t.token_id, t.piece, t.rows[:k], t.other_prompt_mass[:k], t.generated_mass[:k])
              for t in draft.tokens]
    return replace(draft, heads=draft.heads[:k], tokens=tokens)


def draft_record(pid: str, repeat: int, draft: Any, decision_heads: int) -> dict:
    from alignatt.policy import decide

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
    from alignatt.models import tiny_tokenizer

    if choice == "tiny":
        return tiny_tokenizer(), "tiny byte-level"
    try:
        from alignatt.models import synthetic_tokenizer

        return synthetic_tokenizer(), "gemma (alignatt.models.synthetic_tokenizer)"
    except Exception as e:  # noqa: BLE001 - any failure: fall back, and say so
        return tiny_tokenizer(), f"tiny byte-level (no Gemma tokenizer on this host: {str(e).splitlines()[0][:200]})"


# ---- worker side (runs inside a subprocess, owns one vLLM engine) ----


def self_consistency(seam: Any, internal_ids: list[str]) -> dict:
    """Captured q + cached K/V rebuild the layer's own attention output (captured in the op)."""
    import torch

    from alignatt.qcache import rebuild_output

    per_layer: dict[int, dict] = {}
    for rid in internal_ids:
        raw = seam.raw.get(rid)
        if raw is None:
            continue
        for layer, d in raw.layers.items():
            plan = seam.plans[layer]
            probs = torch.from_numpy(d["probs"])
            rebuilt = rebuild_output(plan, probs, torch.from_numpy(d["values"]))
            out = torch.from_numpy(d["out"])
            err = (rebuilt - out).abs().max().item()
            scale = max(out.abs().max().item(), 1e-6)
            cos = torch.nn.functional.cosine_similarity(rebuilt.flatten(0, 1), out.flatten(0, 1), dim=-1)
            s = per_layer.setdefault(layer, {"max_abs_err": 0.0, "max_rel_err": 0.0, "min_cos": 1.0, "rows": 0})
            s["max_abs_err"] = max(s["max_abs_err"], err)
            s["max_rel_err"] = max(s["max_rel_err"], err / scale)
            s["min_cos"] = min(s["min_cos"], float(cos.min()))
            s["rows"] += int(out.shape[0] * out.shape[1])
    for s in per_layer.values():
        s["passed"] = s["max_rel_err"] <= SELF_CONSISTENCY_REL_TOL and s["min_cos"] >= SELF_CONSISTENCY_MIN_COS
    return {"layers": {str(k): v for k, v in sorted(per_layer.items())},
            "passed": bool(per_layer) and all(s["passed"] for s in per_layer.values()),
            "tolerance": {"max_rel_err": SELF_CONSISTENCY_REL_TOL, "min_cos": SELF_CONSISTENCY_MIN_COS}}


def worker_drafts(spec: dict) -> dict:
    from alignatt.capture import Head
    from alignatt.vllm_capture import VllmCaptureSeam

    tokenizer, tok_name = choose_tokenizer(spec.get("tokenizer", "auto"))
    heads = [Head(l, h) for l, h in spec["heads"]]
    seam = VllmCaptureSeam(
        spec["model"], heads, vllm_mode=spec["mode"], dtype="bfloat16",
        fixed_length=spec.get("fixed_length", True), capture=spec.get("capture", True),
        capture_output=spec.get("capture_output", False), keep_raw=spec.get("capture_output", False),
        tokenizer=tokenizer, max_model_len=spec.get("max_model_len", 4096),
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
                if seam.keep_raw:
                    ids.append(seam.last_raw_id)
                result["drafts"].append(draft_record(pid, rep, d, k))
            say(f"{spec['mode']}: repeat {rep + 1} done")
        if seam.capture_output:
            result["self_consistency"] = self_consistency(seam, ids)
        if spec.get("batch_check"):
            chosen = [(pid, req) for pid, req in requests if pid in BATCH_IDS]
            seam.raw.clear()
            batch = seam.draft_many([req for _, req in chosen])
            result["batch"] = [draft_record(pid, -1, d, k) for (pid, _), d in zip(chosen, batch)]
            if seam.capture_output:
                result["batch_self_consistency"] = self_consistency(seam, list(seam.raw))
    finally:
        seam.close()
    return result


REDUCED_SIZES = {"hidden_size": 1024, "intermediate_size": 4096, "hidden_size_per_layer_input": 64}


def build_reduced_checkpoint(target: Path, tokenizer: Any, sizes: Optional[dict] = None, device: str = "") -> dict:
    """A 12-layer Gemma-4 with E4B head geometry, random bf16 weights, saved as safetensors.

    transformers 5.13.1 builds no k_norm on KV-shared layers (they reuse keys), but vLLM 0.22.1's
    Gemma-4 has one on every layer and refuses a checkpoint without it: add ones (unused there).
    """
    import torch
    from transformers import Gemma4ForCausalLM, Gemma4TextConfig

    from alignatt.models import e4b_config_path

    fields = json.loads(e4b_config_path().read_text())
    for key in ("architectures", "model_type"):
        fields.pop(key, None)
    pattern = fields["layer_types"][:6]
    fields.update(num_hidden_layers=12, layer_types=pattern * 2, num_kv_shared_layers=4, **(sizes or REDUCED_SIZES))
    config = Gemma4TextConfig(**fields)
    config.architectures = ["Gemma4ForCausalLM"]
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    with torch.random.fork_rng(devices=[]), torch.device(device):
        torch.manual_seed(0)
        model = Gemma4ForCausalLM(config).to(torch.bfloat16)
    first_shared = config.num_hidden_layers - config.num_kv_shared_layers
    added = []
    for i, layer in enumerate(model.model.layers):
        attn = layer.self_attn
        if i >= first_shared and not hasattr(attn, "k_norm"):
            norm = type(attn.q_norm)(attn.head_dim, eps=config.rms_norm_eps)
            norm.weight.data.fill_(1.0)
            attn.k_norm = norm.to(attn.q_norm.weight.device, torch.bfloat16)
            added.append(i)
    target.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(target, safe_serialization=True)
    tokenizer.save_pretrained(target)
    del model
    return {"dir": str(target), "layers": 12, "kv_shared": list(range(first_shared, 12)),
            "k_norm_added_on": added, **(sizes or REDUCED_SIZES)}


def register_recording_attention(plans: dict, recorded: dict) -> str:
    """An attention function for transformers that keeps each planned layer's full post-RoPE
    query and the keys its kernel received (a KV-shared layer gets its donor's), then runs sdpa."""
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface, sdpa_mask

    name = "alignatt_parity"

    def recording(module, query, key, value, attention_mask, **kwargs):  # noqa: ANN001, ANN202
        if module.layer_idx in plans:
            recorded[module.layer_idx] = (query[0].detach(), key[0].detach())  # [H,T,D], [KV,T,D]
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)

    AttentionInterface.register(name, recording)
    if name not in ALL_MASK_ATTENTION_FUNCTIONS._global_mapping:
        AttentionMaskInterface.register(name, sdpa_mask)
    return name


def teacher_forced_qk(model: Any, plans: dict, prompt_ids: list[int], drafted: list[int]) -> dict:
    """One transformers forward over prompt + drafted tokens (the last one is never fed): per
    planned layer, the q of the drafted tokens' producing positions [n, heads, D] and all keys
    [T, kv_heads, D]."""
    import torch

    recorded: dict = {}
    name = register_recording_attention(plans, recorded)
    if model.config._attn_implementation != name:
        model.set_attn_implementation(name)
    device = next(model.parameters()).device
    ids = torch.tensor([list(prompt_ids) + list(drafted[:-1])], device=device)
    with torch.inference_mode():
        model(input_ids=ids, use_cache=False)
    n_prompt = len(prompt_ids)
    qpos = torch.arange(n_prompt - 1, n_prompt - 1 + len(drafted), device=device)
    out = {}
    for layer, plan in plans.items():
        hq, hk = recorded[layer]
        q = hq.index_select(0, torch.tensor(plan.heads, device=device))[:, qpos].permute(1, 0, 2)
        out[layer] = (q, hk.permute(1, 0, 2), qpos)
    return out


def worker_parity(spec: dict) -> dict:
    import torch

    from alignatt.capture import Head
    from alignatt.prompt import build_prompt
    from alignatt.qcache import rebuild_rows, split_rows
    from alignatt.vllm_capture import VllmCaptureSeam

    tokenizer, tok_name = choose_tokenizer(spec.get("tokenizer", "auto"))
    ckpt = Path(spec["checkpoint"])
    result: dict = {"tokenizer": tok_name}
    t = time.perf_counter()
    result["checkpoint"] = build_reduced_checkpoint(ckpt, tokenizer)
    result["checkpoint"]["build_s"] = round(time.perf_counter() - t, 1)
    say(f"parity: checkpoint built in {result['checkpoint']['build_s']} s")
    heads = [Head(l, h) for l, h in spec["heads"]]
    requests = bench_requests(spec["tokens"])

    # 1. vLLM eager on the checkpoint: drafts, raw q/K per layer, self-consistency.
    seam = VllmCaptureSeam(str(ckpt), heads, vllm_mode="eager", fixed_length=True, capture_output=True,
                           keep_raw=True, tokenizer=tokenizer)
    vllm_runs = []
    try:
        for pid, req in requests:
            d = seam.draft(req)
            vllm_runs.append((pid, req, d, seam.raw[seam.last_raw_id]))
        result["vllm_self_consistency"] = self_consistency(seam, list(seam.raw))
        result["vllm"] = seam.describe()
        plans = seam.plans
    finally:
        seam.close()

    # 2. transformers on the same files, teacher-forced on vLLM's tokens, recording q and k.
    from alignatt.models import load_model

    loaded = load_model(str(ckpt), device="cuda", dtype="bfloat16")
    model = loaded.model
    layers: dict[int, dict] = {}
    for pid, req, d, raw in vllm_runs:
        prompt = build_prompt(tokenizer, req)
        toks = [t.token_id for t in d.tokens]
        hf_qk = teacher_forced_qk(model, plans, prompt.input_ids, toks)
        for layer, plan in plans.items():
            q_hf, k_hf, qpos = hf_qk[layer]
            kpos = torch.arange(k_hf.shape[0], device="cuda")
            probs = rebuild_rows(plan, q_hf, qpos, k_hf, kpos)
            split = split_rows(probs, 0, prompt.source_token_positions, prompt.prefix_start)
            v = raw.layers[layer]
            q_v = torch.from_numpy(v["q"]).cuda()
            lo = v["key_lo"]
            k_v = torch.from_numpy(v["keys"]).cuda()
            k_h = k_hf[lo: lo + k_v.shape[0]].float()
            vsplit = split_rows(torch.from_numpy(v["probs"]).cuda(), lo, prompt.source_token_positions,
                                prompt.prefix_start)
            s = layers.setdefault(layer, {"q_min_cos": 1.0, "q_max_abs": 0.0, "k_min_cos": 1.0, "k_max_abs": 0.0,
                                          "row_max_abs": 0.0, "row_abs_sum": 0.0, "row_count": 0,
                                          "aligned_same": 0, "aligned_total": 0})
            cos = torch.nn.functional.cosine_similarity
            s["q_min_cos"] = min(s["q_min_cos"], float(cos(q_v.flatten(0, 1), q_hf.float().flatten(0, 1), -1).min()))
            s["q_max_abs"] = max(s["q_max_abs"], float((q_v - q_hf.float()).abs().max()))
            s["k_min_cos"] = min(s["k_min_cos"], float(cos(k_v.flatten(0, 1), k_h.flatten(0, 1), -1).min()))
            s["k_max_abs"] = max(s["k_max_abs"], float((k_v - k_h).abs().max()))
            diff = (vsplit.rows - split.rows).abs()
            s["row_max_abs"] = max(s["row_max_abs"], float(diff.max()))
            s["row_abs_sum"] += float(diff.sum())
            s["row_count"] += diff.numel()
            s["aligned_same"] += int((vsplit.rows.argmax(-1) == split.rows.argmax(-1)).sum())
            s["aligned_total"] += int(vsplit.rows.shape[0] * vsplit.rows.shape[1])
    for layer, s in layers.items():
        s["row_mean_abs"] = s.pop("row_abs_sum") / max(s.pop("row_count"), 1)
        s["aligned_agreement"] = s["aligned_same"] / max(s["aligned_total"], 1)
        s["rows_within_bf16_tol"] = s["row_max_abs"] <= ROW_TOL_MAX and s["row_mean_abs"] <= ROW_TOL_MEAN
        s["inputs_agree"] = s["q_min_cos"] >= 0.999 and s["k_min_cos"] >= 0.999
        if s["aligned_agreement"] >= ALIGN_AGREEMENT_MIN:
            s["verdict"] = "agree"
        elif not s["inputs_agree"]:
            s["verdict"] = "numerics: the engines' q/k inputs to this layer already differ"
        else:
            s["verdict"] = "capture: q/k agree but rows differ"
    result["layers"] = {str(k): v for k, v in sorted(layers.items())}
    first = [l for l in sorted(layers)][:2]
    result["first_layers"] = first
    result["passed_rows_first_layers"] = all(layers[l]["rows_within_bf16_tol"] for l in first)
    result["passed_alignment_all_layers"] = all(s["aligned_agreement"] >= ALIGN_AGREEMENT_MIN for s in layers.values())
    result["no_capture_fault"] = all(not s["verdict"].startswith("capture") for s in layers.values())
    del model, loaded
    torch.cuda.empty_cache()

    # 3. The real hf_qk_fast seam on the same weights: its own greedy drafts vs vLLM's.
    try:
        from alignatt.seams import make_seam

        hf = make_seam("hf_qk_fast", model=str(ckpt), heads=heads, device="cuda", dtype="bfloat16")
        same_prefix, total, row_max = 0, 0, 0.0
        for pid, req, d, _ in vllm_runs:
            h = hf.draft(req)
            a, b = [t.token_id for t in d.tokens], [t.token_id for t in h.tokens]
            n = 0
            while n < min(len(a), len(b)) and a[n] == b[n]:
                n += 1
            same_prefix += n
            total += len(a)
            if n:
                ra = np.stack([t.rows for t in d.tokens[:n]])
                rb = np.stack([t.rows for t in h.tokens[:n]])
                row_max = max(row_max, float(np.abs(ra - rb).max()))
        result["hf_qk_fast_seam"] = {"tokens_in_common_prefix": same_prefix, "vllm_tokens": total,
                                     "row_max_abs_on_common_prefix": row_max}
    except Exception as e:  # noqa: BLE001 - report, the teacher-forced comparison above stands
        result["hf_qk_fast_seam"] = {"error": f"{type(e).__name__}: {e}"}
    result["passed"] = bool(result["passed_rows_first_layers"] and result["passed_alignment_all_layers"]
                            and result["vllm_self_consistency"]["passed"])
    return result


def worker_main(spec_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text())
    try:
        result = {"drafts": worker_drafts, "parity": worker_parity}[spec["task"]](spec)
        result["ok"] = True
    except Exception as e:  # noqa: BLE001 - the parent records it
        traceback.print_exc()
        result = {"ok": False, "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-4000:]}
    with open(spec["result"], "wb") as f:
        pickle.dump(result, f)
    return 0 if result["ok"] else 1


# ---- parent side ----


def run_worker(spec: dict, workdir: Path, timeout_s: float) -> dict:
    name = spec["name"]
    spec = dict(spec, result=str(workdir / f"{name}.pkl"))
    spec_path = workdir / f"{name}.json"
    spec_path.write_text(json.dumps(spec))
    say(f"worker {name}: start (timeout {timeout_s:.0f} s)")
    started = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, "-m", "alignatt.vllm_checks", "worker", str(spec_path)],
                              timeout=timeout_s)
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


def compare_drafts(a: list[dict], b: list[dict]) -> dict:
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


def compare_batch(batch: list[dict], singles: list[dict]) -> dict:
    """Each request of a batched step vs the same request drafted alone (repeat 0)."""
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
            entry["aligned_agreement"] = float((ra["rows"][:n].argmax(-1) == rb["rows"][:n].argmax(-1)).mean())
            entry["own_rows"] = entry["aligned_agreement"] >= ALIGN_AGREEMENT_MIN
        else:
            entry["own_rows"] = False
        out.append(entry)
    return {"requests": out, "passed": bool(out) and all(e["own_rows"] for e in out)}


def timing_summary(drafts: list[dict]) -> dict:
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


def check_demo(args: argparse.Namespace, workdir: Path) -> dict:
    import torch

    from alignatt.graph_replay import naive_vs_fixed

    out = {"cpu_eager": naive_vs_fixed("cpu", replay=False), "cpu_replayed": naive_vs_fixed("cpu", replay=True)}
    if torch.cuda.is_available():
        out["cuda_eager"] = naive_vs_fixed("cuda", replay=False)
        out["cuda_graph"] = naive_vs_fixed("cuda", replay=True)
    graph = out.get("cuda_graph")
    out["passed"] = bool(
        graph is not None and not graph["naive_list"]["ok"] and graph["fixed"]["ok"]
        and out["cuda_eager"]["naive_list"]["ok"] and out["cuda_eager"]["fixed"]["ok"]
    )
    if graph is None:
        out["note"] = "no CUDA here: only the CPU replay simulation ran"
    return out


def _e4b_spec(name: str, mode: str, args: argparse.Namespace, **kw: Any) -> dict:
    spec = {"name": name, "task": "drafts", "model": "gemma4-e4b-synthetic", "mode": mode,
            "heads": [list(h) for h in E4B_TOP8 + E4B_SHARED], "tokens": args.tokens, "warmup": 1,
            "repeats": args.repeats, "fixed_length": True, "tokenizer": args.tokenizer, "decision_heads": 8}
    spec.update(kw)
    return spec


def check_exact(args: argparse.Namespace, workdir: Path) -> dict:
    eager = run_worker(_e4b_spec("exact_eager", "eager", args, capture_output=True, batch_check=True),
                       workdir, args.worker_timeout)
    graph = run_worker(_e4b_spec("exact_cudagraph", "cudagraph", args, batch_check=True), workdir,
                       args.worker_timeout)
    out: dict = {"eager": _worker_summary(eager), "cudagraph": _worker_summary(graph)}
    if eager.get("ok"):
        (workdir / "eager_drafts.pkl").write_bytes(pickle.dumps(eager["drafts"]))
    if not (eager.get("ok") and graph.get("ok")):
        out["passed"] = False
        return out
    cmp = compare_drafts(graph["drafts"], eager["drafts"])
    out["cudagraph_vs_eager"] = cmp
    out["batch"] = {"eager": compare_batch(eager["batch"], eager["drafts"]),
                    "cudagraph": compare_batch(graph["batch"], graph["drafts"]),
                    "eager_self_consistency": eager.get("batch_self_consistency")}
    out["eager_self_consistency"] = eager.get("self_consistency")
    n = cmp["rows"]
    out["passed_exact"] = n == 16 * args.repeats and cmp["identical_drafts"] == cmp["identical_decisions"] == cmp[
        "bit_identical_rows"] == n
    out["passed_batch"] = out["batch"]["eager"]["passed"] and out["batch"]["cudagraph"]["passed"] and bool(
        (eager.get("batch_self_consistency") or {}).get("passed"))
    out["passed"] = bool(out["passed_exact"] and out["passed_batch"]
                         and (eager.get("self_consistency") or {}).get("passed"))
    return out


def check_parity(args: argparse.Namespace, workdir: Path) -> dict:
    spec = {"name": "parity", "task": "parity", "checkpoint": str(workdir / "reduced-gemma4"),
            "heads": [list(h) for h in PARITY_HEADS], "tokens": args.tokens, "tokenizer": args.tokenizer}
    res = run_worker(spec, workdir, args.worker_timeout)
    if not res.get("ok"):
        return {"passed": False, "error": res.get("error"), "traceback": res.get("traceback")}
    res.pop("ok", None)
    return res


def check_compiled(args: argparse.Namespace, workdir: Path) -> dict:
    res = run_worker(_e4b_spec("compiled", "compiled", args, capture_output=True), workdir,
                     args.worker_timeout_compiled)
    out: dict = {"compiled": _worker_summary(res)}
    if not res.get("ok"):
        out["passed"] = False
        return out
    out["self_consistency"] = res.get("self_consistency")
    eager_path = workdir / "eager_drafts.pkl"
    if eager_path.exists():
        out["compiled_vs_eager"] = compare_drafts(res["drafts"], pickle.loads(eager_path.read_bytes()))
    else:
        out["compiled_vs_eager"] = "eager drafts unavailable (run the exact check first in the same --workdir)"
    out["passed"] = bool((res.get("self_consistency") or {}).get("passed"))
    return out


def _check_speed(args: argparse.Namespace, workdir: Path, mode: str) -> dict:
    base = dict(heads=[list(h) for h in E4B_TOP8], repeats=3)
    timeout = args.worker_timeout_compiled if mode == "compiled" else args.worker_timeout
    plain = run_worker(_e4b_spec(f"speed_{mode}_plain", mode, args, capture=False, **base), workdir, timeout)
    captured = run_worker(_e4b_spec(f"speed_{mode}_captured", mode, args, **base), workdir, timeout)
    out = {"uncaptured": _worker_summary(plain), "captured": _worker_summary(captured)}
    if plain.get("ok") and captured.get("ok"):
        a, b = timing_summary(plain["drafts"]), timing_summary(captured["drafts"])
        out["uncaptured_timing"], out["captured_timing"] = a, b
        out["decode_ratio"] = round(b["decode_ms_per_token"] / a["decode_ms_per_token"], 4)
        out["end_to_end_ratio"] = round(b["per_token_ms"] / a["per_token_ms"], 4)
        out["target_decode_ratio_max"] = 1.15
        out["passed"] = out["decode_ratio"] <= 1.15
    else:
        out["passed"] = False
    return out


def _worker_summary(res: dict) -> dict:
    if not res.get("ok"):
        return {"ok": False, "error": res.get("error"), "traceback": res.get("traceback")}
    summary = {"ok": True, "wall_s": res.get("wall_s"), "describe": res.get("describe"),
               "tokenizer": res.get("tokenizer")}
    if res.get("drafts"):
        summary["timing"] = timing_summary(res["drafts"])
        summary["example_draft"] = res["drafts"][0]["text"][:200]
    return summary


CHECK_FUNCS = {
    "demo": check_demo, "exact": check_exact, "parity": check_parity, "compiled": check_compiled,
    "speed": lambda a, w: _check_speed(a, w, "cudagraph"),
    "speed_compiled": lambda a, w: _check_speed(a, w, "compiled"),
}


def _jsonable(x: Any) -> Any:
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, np.ndarray):
        return None  # arrays stay out of the artifact
    if isinstance(x, (np.floating, float)):
        return None if math.isnan(float(x)) else float(x)
    if isinstance(x, (np.integer,)):
        return int(x)
    return x


def run_checks(checks: list[str], out_path: Path, args: argparse.Namespace) -> dict:
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="alignatt-vllm-checks-"))
    workdir.mkdir(parents=True, exist_ok=True)
    artifact: dict = {"artifact": "vllm_checks", "schema_version": SCHEMA_VERSION, "checks": {}, "summary": {},
                      "config": {"tokens": args.tokens, "repeats": args.repeats, "tokenizer": args.tokenizer,
                                 "e4b_heads": E4B_TOP8, "e4b_shared_heads": E4B_SHARED,
                                 "parity_heads": PARITY_HEADS, "weights": "synthetic (random)"}}
    try:
        from alignatt.provenance import collect_provenance

        artifact["provenance"] = collect_provenance(model_id="alignatt:data/models/gemma-4-E4B-it/config.json",
                                                    model_revision=None).model_dump(mode="json")
    except Exception as e:  # noqa: BLE001 - provenance is best effort here, and says why not
        artifact["provenance"] = {"error": f"{type(e).__name__}: {e}"}
    started = time.perf_counter()
    for name in checks:
        elapsed = time.perf_counter() - started
        if elapsed > args.budget_s:
            artifact["checks"][name] = {"skipped": f"time budget {args.budget_s:.0f} s used up"}
            artifact["summary"][name] = "skipped"
            continue
        say(f"check {name}: start ({elapsed:.0f} s elapsed)")
        t = time.perf_counter()
        try:
            result = CHECK_FUNCS[name](args, workdir)
        except Exception as e:  # noqa: BLE001 - one check's failure never loses the others
            traceback.print_exc()
            result = {"passed": False, "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-4000:]}
        result["wall_s"] = round(time.perf_counter() - t, 1)
        artifact["checks"][name] = result
        artifact["summary"][name] = "passed" if result.get("passed") else (
            "error" if "error" in result else "failed")
        say(f"check {name}: {artifact['summary'][name]} in {result['wall_s']} s")
        out_path.parent.mkdir(parents=True, exist_ok=True)
        out_path.write_text(json.dumps(_jsonable(artifact), indent=1) + "\n")
    artifact["total_s"] = round(time.perf_counter() - started, 1)
    out_path.write_text(json.dumps(_jsonable(artifact), indent=1) + "\n")
    return artifact


def main(argv: Optional[list[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["worker"]:
        return worker_main(argv[1])
    parser = argparse.ArgumentParser(prog="python -m alignatt.vllm_checks", description=__doc__.split("\n")[0])
    parser.add_argument("check", choices=("all",) + ALL_CHECKS)
    parser.add_argument("--out", required=True, type=Path, help="the JSON artifact to write")
    parser.add_argument("--only", default="", help=f"comma-separated subset of {','.join(ALL_CHECKS)} (with 'all')")
    parser.add_argument("--workdir", default=os.environ.get("ALIGNATT_CHECKS_WORKDIR"),
                        help="scratch dir shared by the checks (eager drafts feed the compiled check)")
    parser.add_argument("--tokens", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tokenizer", choices=("auto", "tiny"), default="auto")
    parser.add_argument("--budget-s", type=float, default=570.0, help="start no new check after this")
    parser.add_argument("--worker-timeout", type=float, default=300.0)
    parser.add_argument("--worker-timeout-compiled", type=float, default=420.0)
    args = parser.parse_args(argv)
    if args.check == "all":
        checks = [c.strip() for c in args.only.split(",") if c.strip()] or list(DEFAULT_CHECKS)
        unknown = [c for c in checks if c not in ALL_CHECKS]
        if unknown:
            parser.error(f"unknown checks {unknown}: use {', '.join(ALL_CHECKS)}")
    else:
        checks = [args.check]
    artifact = run_checks(checks, args.out, args)
    say("summary: " + ", ".join(f"{k}={v}" for k, v in artifact["summary"].items()))
    return 0 if all(v == "passed" for v in artifact["summary"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
