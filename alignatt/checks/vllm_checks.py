"""GPU correctness checks for `vllm_capture`, each writing into one JSON artifact.

    alignatt check-vllm all --part a --workdir W --out OUT/vllm_checks_a.json
    alignatt check-vllm all --part b --workdir W --out OUT/vllm_checks_b.json

(`all` without --part runs both parts in one go; `--only demo,exact,...` picks checks.) Each vLLM
engine runs in its own subprocess (alignatt.checks.worker): a crash or a timeout loses only that
check, and the artifact is rewritten after every check. The two parts share --workdir (part b compares with part a's
eager drafts and reuses its reduced checkpoint).

Part a:
- demo:      naive vs fixed capture under real CUDA-graph replay (plain torch) and on CPU.
- exact:     E4B architecture, synthetic weights initialised like transformers (vLLM's own dummy
             weights are degenerate for Gemma-4: see alignatt/models/synthetic_init.py), 16 benchmark
             prompts x (1 warm-up + 3 repeats), 20 tokens: full decode graphs without
             torch.compile vs eager: identical drafts, identical emit/hold decisions, bit-identical
             rows on all 48 rows; the batch check (three different requests in one step, decode
             padded 3 -> 4) in both modes; self-consistency of both modes.
- parity:    a reduced-depth Gemma-4 loaded by vLLM (eager) and by transformers, compared
             teacher-forced on vLLM's tokens: float32 is the strict test, bfloat16 is reported
             beside transformers' own bf16-vs-fp32 noise (alignatt/checks/cross_engine.py).
- speed:     captured vs uncaptured decode, full decode graphs (top-8 heads, 20 tokens).
- compiled_reduced: torch.compile + graphs on the reduced checkpoint: self-consistency, drafts
             vs the eager ones.
Part b:
- compiled:  torch.compile + graphs on synthetic E4B: self-consistency and differences from eager.
- speed_compiled: captured vs uncaptured decode in the compiled mode.
- exact_fullgraph: the served mode (every step in a full graph, prefills padded to a capture
             size) against eager, as in exact; reuses exact's eager drafts from the work dir.
- fp8:       the served mode on FP8 weights (vLLM's online quantization): self-consistency, and
             its drafts against eager's.

Self-consistency: in the same step, the layer's own attention output for the captured heads
(written by the same op after the attention) must equal softmax(q K) V rebuilt from the
captured q and the cached K/V, by norm-relative error and cosine; a layer whose outputs are
~0 reports "degenerate activations" instead of passing or failing.
"""

import json
import math
import pickle
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Literal, Optional

import numpy as np
from pydantic import BaseModel

from alignatt.checks.compare import compare_batch, compare_drafts, timing_summary
from alignatt.checks.messages import CAPTURED_DECODE_RATIO_MAX, WorkerResult, WorkerSpec, load_result
from alignatt.checks.records import E4B_KV_GIB, draft_variety, say
from alignatt.checks.worker import run_worker

SCHEMA_VERSION = 2
PARTS = {
    "a": ("demo", "exact", "parity", "speed", "compiled_reduced"),
    "b": ("compiled", "speed_compiled", "exact_fullgraph", "fp8"),
}
ALL_CHECKS = PARTS["a"] + PARTS["b"]
# Published top-8 E4B en->de heads, plus two heads on KV-shared layers (29: full, reads layer 23;
# 26: sliding, reads layer 22) so graphs vs eager is also proven there. Decisions use the top 8.
E4B_TOP8 = [(11, 3), (6, 5), (17, 3), (20, 0), (5, 0), (11, 2), (10, 0), (10, 4)]
E4B_SHARED = [(29, 2), (26, 5)]
# Reduced Gemma-4 for parity: 12 layers, s s s s s F s s | s s s F (last 4 KV-shared: sliding
# ones read layer 7, the full one reads layer 5). A head on every layer, so the first layer where
# the engines part is visible.
PARITY_HEADS = [(0, 1), (1, 2), (2, 5), (3, 4), (4, 0), (5, 2), (5, 6), (6, 1), (7, 3), (8, 0), (9, 4),
                (10, 6), (11, 3), (11, 7)]
# KV cache per engine (see records.E4B_KV_GIB): the reduced model, 4096 blocks in bf16 and fp32.
REDUCED_KV_GIB = {"bfloat16": 0.25, "float32": 0.5}


class ChecksOptions(BaseModel):
    """How one `alignatt check-vllm` run goes (the typer command fills it)."""

    workdir: Optional[str] = None  # scratch dir shared by the checks (eager drafts feed the compiled check)
    tokens: int = 20
    repeats: int = 3
    tokenizer: Literal["auto", "tiny"] = "auto"
    budget_s: Optional[float] = None  # start no new check after this (default 450 s for one part, 900 for both)
    worker_timeout: float = 300.0
    worker_timeout_compiled: float = 420.0


def check_demo(args: ChecksOptions, workdir: Path) -> dict:
    import torch

    from alignatt.checks.graph_replay import naive_vs_fixed

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


def _e4b_spec(name: str, mode: str, args: ChecksOptions, **kw: Any) -> WorkerSpec:
    fields: dict[str, Any] = dict(name=name, task="drafts", model="gemma4-e4b-synthetic", mode=mode,
                                  heads=E4B_TOP8 + E4B_SHARED, tokens=args.tokens, warmup=1,
                                  repeats=args.repeats, fixed_length=True, tokenizer=args.tokenizer,
                                  decision_heads=8, kv_cache_memory_gib=E4B_KV_GIB)
    return WorkerSpec(**(fields | kw))


def _eager_drafts(args: ChecksOptions, workdir: Path, reuse: bool) -> tuple[WorkerResult, str]:
    """The eager E4B drafts: with `reuse`, the exact check's (pickled in the work dir) if there;
    otherwise a run of their own (pickled for the checks after)."""
    path = workdir / "eager_drafts.pkl"
    if reuse and path.exists():
        return WorkerResult(ok=True, drafts=pickle.loads(path.read_bytes())), "from the exact check (same work dir)"
    eager = run_worker(_e4b_spec("exact_eager", "eager", args, capture_output=True, batch_check=True),
                       workdir, args.worker_timeout)
    if eager.ok:
        path.write_bytes(pickle.dumps(eager.drafts))
    return eager, "run here"


def check_exact(args: ChecksOptions, workdir: Path, mode: str = "cudagraph") -> dict:
    """A graphed mode against eager, bit for bit (exact: cudagraph; exact_fullgraph: the served mode)."""
    eager, eager_source = _eager_drafts(args, workdir, reuse=mode != "cudagraph")
    graph = run_worker(_e4b_spec(f"exact_{mode}", mode, args, capture_output=True, batch_check=True),
                       workdir, args.worker_timeout)
    out: dict = {"eager": _worker_summary(eager) if eager_source == "run here" else {"ok": eager.ok, "source": eager_source},
                 mode: _worker_summary(graph)}
    if not (eager.ok and graph.ok):
        out["passed"] = False
        return out
    cmp = compare_drafts(graph.drafts, eager.drafts)
    out[f"{mode}_vs_eager"] = cmp
    out["draft_variety"] = draft_variety(eager.drafts)
    consistency = {mode: graph.self_consistency, f"{mode}_batch": graph.batch_self_consistency}
    batch = {mode: compare_batch(graph.batch or [], graph.drafts)}
    if eager_source == "run here":
        consistency |= {"eager": eager.self_consistency, "eager_batch": eager.batch_self_consistency}
        batch["eager"] = compare_batch(eager.batch or [], eager.drafts)
    out["self_consistency"], out["batch"] = consistency, batch
    n = cmp["rows"]
    # Equality only means something on real activations: varied drafts, live attention outputs.
    out["passed_exact"] = bool(n == 16 * args.repeats and not out["draft_variety"]["degenerate"]
                               and cmp["identical_drafts"] == cmp["identical_decisions"] == cmp["bit_identical_rows"] == n)
    out["passed_batch"] = all(b["passed"] for b in batch.values())
    out["passed_self_consistency"] = all((c or {}).get("passed") for c in consistency.values())
    out["degenerate"] = sorted({k for k, c in consistency.items() if (c or {}).get("status") == "degenerate activations"}
                               | ({"drafts"} if out["draft_variety"]["degenerate"] else set()))
    out["passed"] = bool(out["passed_exact"] and out["passed_batch"] and out["passed_self_consistency"])
    return out


def _reduced_spec(name: str, mode: str, dtype: str, args: ChecksOptions, workdir: Path) -> WorkerSpec:
    # Triton's tl.dot takes fp32 inputs as TF32 unless told otherwise: the strict test wants IEEE
    # fp32 in vLLM's attention kernel too (fresh kernel cache, so no TF32 build is reused).
    env = {"TRITON_F32_DEFAULT": "ieee", "TRITON_CACHE_DIR": str(workdir / "triton-cache-ieee")} if dtype == "float32" else {}
    return WorkerSpec(name=name, task="parity_vllm", checkpoint=str(workdir / "reduced-gemma4"), mode=mode,
                      dtype=dtype, heads=PARITY_HEADS, tokens=args.tokens, tokenizer=args.tokenizer,
                      kv_cache_memory_gib=REDUCED_KV_GIB[dtype], env=env)


def _failure(res: WorkerResult) -> dict:
    return {"ok": False, "error": res.error, "traceback": res.traceback}


def _vllm_parity_summary(res: WorkerResult) -> dict:
    if not res.ok:
        return _failure(res)
    return {"ok": True, "wall_s": res.wall_s, "describe": res.describe, "checkpoint": res.checkpoint,
            "triton_f32_default": res.triton_f32_default, "self_consistency": res.self_consistency,
            "draft_variety": draft_variety(res.runs), "drafts": len(res.runs)}


def check_parity(args: ChecksOptions, workdir: Path) -> dict:
    v16 = run_worker(_reduced_spec("parity_vllm_bf16", "eager", "bfloat16", args, workdir), workdir, args.worker_timeout)
    v32 = run_worker(_reduced_spec("parity_vllm_fp32", "eager", "float32", args, workdir), workdir, args.worker_timeout)
    out: dict = {"vllm_bf16": _vllm_parity_summary(v16), "vllm_fp32": _vllm_parity_summary(v32)}
    if not (v16.ok or v32.ok):
        out["passed"] = False
        return out
    spec = WorkerSpec(name="parity_hf", task="parity_hf", checkpoint=str(workdir / "reduced-gemma4"),
                      heads=PARITY_HEADS, tokens=args.tokens, tokenizer=args.tokenizer,
                      vllm_bf16=str(workdir / "parity_vllm_bf16.pkl") if v16.ok else None,
                      vllm_fp32=str(workdir / "parity_vllm_fp32.pkl") if v32.ok else None)
    hf = run_worker(spec, workdir, args.worker_timeout)
    if not hf.ok:
        out.update(passed=False, error=hf.error, traceback=hf.traceback)
        return out
    out.update(fp32=hf.fp32, bf16=hf.bf16, hf_qk_fast_seam=hf.hf_qk_fast_seam, hf_wall_s=hf.wall_s)
    consistency = [out[k].get("self_consistency") or {} for k in ("vllm_bf16", "vllm_fp32")]
    out["passed_fp32_strict"] = bool(v32.ok and (out["fp32"] or {}).get("passed"))
    out["passed_self_consistency"] = all(c.get("passed") for c in consistency)
    out["degenerate"] = [k for k, c in zip(("vllm_bf16", "vllm_fp32"), consistency)
                         if c.get("status") == "degenerate activations"]
    out["passed"] = bool(out["passed_fp32_strict"] and out["passed_self_consistency"])
    return out


def check_compiled_reduced(args: ChecksOptions, workdir: Path) -> dict:
    """torch.compile + graphs on the reduced checkpoint: self-consistency, and its drafts vs the
    eager bf16 ones of the parity check (same work dir)."""
    res = run_worker(_reduced_spec("compiled_reduced", "compiled", "bfloat16", args, workdir), workdir,
                     args.worker_timeout_compiled)
    out = _vllm_parity_summary(res)
    if not res.ok:
        return {"compiled": out, "passed": False}
    eager_path = workdir / "parity_vllm_bf16.pkl"
    if eager_path.exists():
        eager = {r["id"]: r["token_ids"] for r in load_result(eager_path).runs}
        same = [r["id"] for r in res.runs if eager.get(r["id"]) == r["token_ids"]]
        out["identical_drafts_vs_eager"] = f"{len(same)}/{len(res.runs)}"
    sc = out["self_consistency"] or {}
    return {"compiled": out, "self_consistency": sc, "passed": bool(sc.get("passed")),
            "degenerate": ["compiled"] if sc.get("status") == "degenerate activations" else []}


def check_compiled(args: ChecksOptions, workdir: Path) -> dict:
    return _check_self_consistent(args, workdir, "compiled", _e4b_spec("compiled", "compiled", args, capture_output=True),
                                  args.worker_timeout_compiled)


def check_fp8(args: ChecksOptions, workdir: Path) -> dict:
    return _check_self_consistent(args, workdir, "fp8", _e4b_spec("fp8", "fullgraph", args, capture_output=True,
                                                                  quantization="fp8"), args.worker_timeout)


def _check_self_consistent(args: ChecksOptions, workdir: Path, name: str, spec: WorkerSpec, timeout: float) -> dict:
    """A configuration whose numerics differ from eager's: held to self-consistency, its drafts
    reported against eager's (the exact check's, same work dir)."""
    res = run_worker(spec, workdir, timeout)
    out: dict = {name: _worker_summary(res)}
    if not res.ok:
        out["passed"] = False
        return out
    sc = res.self_consistency or {}
    out["self_consistency"] = sc
    out["draft_variety"] = draft_variety(res.drafts)
    eager_path = workdir / "eager_drafts.pkl"
    if eager_path.exists():
        out[f"{name}_vs_eager"] = compare_drafts(res.drafts, pickle.loads(eager_path.read_bytes()))
    else:
        out[f"{name}_vs_eager"] = "eager drafts unavailable (run the exact check first in the same --workdir)"
    out["degenerate"] = (["self_consistency"] if sc.get("status") == "degenerate activations" else []) + (
        ["drafts"] if out["draft_variety"]["degenerate"] else [])
    out["passed"] = bool(sc.get("passed"))
    return out


def _check_speed(args: ChecksOptions, workdir: Path, mode: str) -> dict:
    base = dict(heads=E4B_TOP8, repeats=3)
    timeout = args.worker_timeout_compiled if mode == "compiled" else args.worker_timeout
    plain = run_worker(_e4b_spec(f"speed_{mode}_plain", mode, args, capture=False, **base), workdir, timeout)
    captured = run_worker(_e4b_spec(f"speed_{mode}_captured", mode, args, **base), workdir, timeout)
    out = {"uncaptured": _worker_summary(plain), "captured": _worker_summary(captured)}
    if plain.ok and captured.ok:
        a, b = timing_summary(plain.drafts), timing_summary(captured.drafts)
        out["uncaptured_timing"], out["captured_timing"] = a, b
        out["decode_ratio"] = round(b["decode_ms_per_token"] / a["decode_ms_per_token"], 4)
        out["end_to_end_ratio"] = round(b["per_token_ms"] / a["per_token_ms"], 4)
        out["target_decode_ratio_max"] = CAPTURED_DECODE_RATIO_MAX
        out["passed"] = out["decode_ratio"] <= CAPTURED_DECODE_RATIO_MAX
    else:
        out["passed"] = False
    return out


def _worker_summary(res: WorkerResult) -> dict:
    if not res.ok:
        return _failure(res)
    summary = {"ok": True, "wall_s": res.wall_s, "describe": res.describe, "tokenizer": res.tokenizer}
    if res.drafts:
        summary["timing"] = timing_summary(res.drafts)
        summary["example_draft"] = res.drafts[0]["text"][:200]
        summary["draft_variety"] = draft_variety(res.drafts)
    return summary


CHECK_FUNCS = {
    "demo": check_demo, "exact": check_exact, "parity": check_parity, "compiled": check_compiled, "fp8": check_fp8,
    "exact_fullgraph": lambda a, w: check_exact(a, w, "fullgraph"),
    "compiled_reduced": check_compiled_reduced,
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
    if isinstance(x, np.bool_):
        return bool(x)
    return x


def summary_word(result: dict) -> str:
    if result.get("passed"):
        return "passed"
    if "error" in result:
        return "error"
    return "failed (degenerate activations)" if result.get("degenerate") else "failed"


def select_checks(check: str, only: str, part: Optional[str]) -> list[str]:
    """The checks one invocation runs, in order; raises ValueError naming unknown ones."""
    if check != "all":
        if only or part:
            raise ValueError("--only and --part go with 'all'")
        return [check]
    if only and part:
        raise ValueError("give --only or --part, not both")
    if part:
        return list(PARTS[part])
    checks = [c.strip() for c in only.split(",") if c.strip()] or list(ALL_CHECKS)
    unknown = [c for c in checks if c not in ALL_CHECKS]
    if unknown:
        raise ValueError(f"unknown checks {unknown}: use {', '.join(ALL_CHECKS)}")
    return checks


def run_checks(checks: list[str], out_path: Path, args: ChecksOptions) -> dict:
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="alignatt-vllm-checks-"))
    workdir.mkdir(parents=True, exist_ok=True)
    artifact: dict = {"artifact": "vllm_checks", "schema_version": SCHEMA_VERSION, "checks": {}, "summary": {},
                      "config": {"tokens": args.tokens, "repeats": args.repeats, "tokenizer": args.tokenizer,
                                 "e4b_heads": E4B_TOP8, "e4b_shared_heads": E4B_SHARED,
                                 "parity_heads": PARITY_HEADS, "checks": list(checks),
                                 "weights": "synthetic (random), initialised like transformers (alignatt.models.synthetic_init)",
                                 "kv_cache_memory_gib": {"e4b": E4B_KV_GIB, "reduced": REDUCED_KV_GIB}}}
    try:
        from alignatt.record.provenance import collect_provenance

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
        artifact["summary"][name] = summary_word(result)
        say(f"check {name}: {artifact['summary'][name]} in {result['wall_s']} s")
        write_checks(out_path, artifact)
    artifact["total_s"] = round(time.perf_counter() - started, 1)
    write_checks(out_path, artifact)
    return artifact


def as_measurement(raw: dict):
    """The checks' running record as the shared artifact schema (kind `measurement`)."""
    from alignatt.record.artifacts import ARTIFACT_SCHEMA_VERSION, Check, MeasurementArtifact

    raw = _jsonable(raw)
    return MeasurementArtifact(
        schema_version=ARTIFACT_SCHEMA_VERSION,
        provenance=raw["provenance"],
        name="vllm_checks",
        description="vllm_capture correctness and overhead on the GPU: "
        + ", ".join(raw["config"].get("checks", [])),
        config=raw["config"],
        results={"checks": raw["checks"], "total_s": raw.get("total_s")},
        checks=[Check(name=k, passed=v == "passed", detail=v) for k, v in raw["summary"].items()],
        synthetic_weights=True,
    )


def write_checks(out_path: Path, raw: dict) -> None:
    """Rewritten after every check, so a timeout loses only the check that was running."""
    from pydantic import ValidationError

    from alignatt.record.artifacts import write_artifact

    out_path.parent.mkdir(parents=True, exist_ok=True)
    try:
        write_artifact(out_path, as_measurement(raw))
    except ValidationError as e:  # e.g. provenance could not be collected: keep the results anyway
        say(f"WARNING: results written in raw form, not as an artifact ({e.error_count()} schema errors)")
        out_path.write_text(json.dumps(_jsonable(raw), indent=1) + "\n")


def run(check: str, out: Path, options: ChecksOptions, only: str = "", part: Optional[str] = None) -> dict:
    """Select, run and write the checks; the artifact's summary says which passed."""
    from alignatt.core.errors import AlignattError

    if part is not None and part not in PARTS:
        raise AlignattError(f"unknown part {part!r}: use {', '.join(sorted(PARTS))}")
    if check != "all" and check not in ALL_CHECKS:
        raise AlignattError(f"unknown check {check!r}: use all or one of {', '.join(ALL_CHECKS)}")
    try:
        checks = select_checks(check, only, part)
    except ValueError as e:
        raise AlignattError(str(e)) from None
    if options.budget_s is None:
        budget = 450.0 if any(set(checks) <= set(p) for p in PARTS.values()) else 900.0
        options = options.model_copy(update={"budget_s": budget})
    artifact = run_checks(checks, out, options)
    say("summary: " + ", ".join(f"{k}={v}" for k, v in artifact["summary"].items()))
    return artifact
