"""One vLLM engine per subprocess: the parent's `run_worker` and the worker's entry point.

`run_worker(spec)` (parent side) writes the `WorkerSpec` as JSON and runs `python -m
alignatt.checks.worker SPEC`; the worker builds one `VllmCaptureSeam` (or, for parity, one engine of
alignatt.checks.cross_engine), drafts, and pickles one `WorkerResult` back: per draft its tokens,
rows, masses, timings and AlignAtt decisions (`records.draft_record`), plus self-consistency and
identity probes. A crash or timeout loses only that worker's check.
"""

import pickle
import sys
import time
import traceback
from pathlib import Path

from alignatt.checks.messages import WorkerResult, WorkerSpec, load_result
from alignatt.record.isolated import run_module
from alignatt.checks.records import (
    BATCH_IDS,
    bench_requests,
    choose_tokenizer,
    draft_record,
    identity_probe,
    say,
    self_consistency,
)


def worker_drafts(spec: WorkerSpec) -> dict:
    from alignatt.core.draft import Head
    from alignatt.capture.vllm.seam import VllmCaptureSeam

    tokenizer, tok_name = choose_tokenizer(spec.tokenizer)
    heads = [Head(l, h) for l, h in spec.heads]
    seam = VllmCaptureSeam(
        spec.model, heads, vllm_mode=spec.mode, dtype="bfloat16", quantization=spec.quantization,
        fixed_length=spec.fixed_length, capture=spec.capture,
        capture_output=spec.capture_output, keep_raw=spec.capture_output,
        tokenizer=tokenizer, max_model_len=spec.max_model_len,
        kv_cache_memory_gib=spec.kv_cache_memory_gib,
    )
    result: dict = {"describe": seam.describe(), "tokenizer": tok_name, "drafts": []}
    requests = bench_requests(spec.tokens)
    k = spec.decision_heads
    ids: list[str] = []
    try:
        for _ in range(spec.warmup):
            for pid, req in requests:
                seam.draft(req)
        seam.raw.clear()
        for rep in range(spec.repeats):
            for pid, req in requests:
                d = seam.draft(req)
                rec = draft_record(pid, rep, d, k)
                if seam.keep_raw:
                    ids.append(seam.last_raw_id)
                    if rep == 0 and pid in BATCH_IDS:
                        rec["probe"] = identity_probe(seam.raw[seam.last_raw_id], d.prompt_token_count)
                result["drafts"].append(rec)
            say(f"{spec.mode}: repeat {rep + 1} done")
        if seam.capture_output:
            result["self_consistency"] = self_consistency(seam, ids)
        if spec.batch_check:
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
    spec = WorkerSpec.model_validate_json(Path(spec_path).read_text())
    try:
        from alignatt.checks.cross_engine import worker_parity_hf, worker_parity_vllm

        tasks = {"drafts": worker_drafts, "parity_vllm": worker_parity_vllm, "parity_hf": worker_parity_hf}
        result = WorkerResult(ok=True, **tasks[spec.task](spec))
    except Exception as e:  # noqa: BLE001 - the parent records it
        traceback.print_exc()
        result = WorkerResult.failed(f"{type(e).__name__}: {e}", traceback=traceback.format_exc()[-4000:])
    with open(spec.result, "wb") as f:
        pickle.dump(result, f)
    return 0 if result.ok else 1


def run_worker(spec: WorkerSpec, workdir: Path, timeout_s: float) -> WorkerResult:
    spec = spec.model_copy(update={"result": str(workdir / f"{spec.name}.pkl")})
    Path(spec.result).unlink(missing_ok=True)  # a rerun in the same work dir must not read the last result
    spec_path = workdir / f"{spec.name}.json"
    spec_path.write_text(spec.model_dump_json())
    say(f"worker {spec.name}: start (timeout {timeout_s:.0f} s)")
    started = time.perf_counter()
    done = run_module("alignatt.checks.worker", str(spec_path), env=spec.env, timeout_s=timeout_s)
    if done.timed_out:
        return WorkerResult.failed(f"timed out after {timeout_s:.0f} s", wall_s=timeout_s)
    rc = done.code
    wall = time.perf_counter() - started
    path = Path(spec.result)
    if not path.exists():
        return WorkerResult.failed(f"worker exited with {rc} and wrote no result", wall_s=wall)
    result = load_result(path)
    result.wall_s = round(wall, 1)
    say(f"worker {spec.name}: {'ok' if result.ok else 'FAILED: ' + (result.error or '')} in {wall:.0f} s")
    return result


if __name__ == "__main__":
    sys.exit(worker_main(sys.argv[1]))
