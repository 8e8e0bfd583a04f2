"""`alignatt bench`: the capture-speed benchmark, on the published protocol.

Protocol: the 16 fixed en->de prompts, greedy drafts of `max_new_tokens`, the top-k alignment
heads, per seam one unmeasured warm-up pass over every prompt and then `repeats` measured passes,
each seam in its own subprocess (so one seam's allocator, compile caches or crash cannot touch the
next). Timing is the seam's own `Draft.timings` for every seam alike (prefill + decode + capture +
reconstruct); per-token ms = that total / drafted tokens (`Timings.per_token_ms`). The headline is
the median per-token ms over every measured row of a seam.

A seam that cannot run here (no CUDA, vLLM not installed, weights missing: `AlignattError` from
its factory) or whose worker fails is recorded as skipped with the reason, never dropped.

The runner takes a seam factory, so the aggregation can be tested with a fake seam. The front end
is `alignatt bench` (typer, alignatt.cli); `python -m alignatt.measure.bench JOB.json` is only the
per-seam worker that `SubprocessRunner` starts (a `WorkerJob`), not a second command line.
"""

from __future__ import annotations

import collections
import csv
import importlib
import io
import json
import os
import statistics
import sys
import tempfile
import time
import traceback
from importlib import resources
from pathlib import Path
from typing import Any, Callable

from pydantic import BaseModel, ConfigDict, ValidationError

from alignatt.record.artifacts import (
    ARTIFACT_SCHEMA_VERSION,
    KNOWN_SEAMS,
    TIMING_KEYS,
    BenchArtifact,
    BenchConfig,
    BenchPrompt,
    BenchRow,
    Divergence,
    MedianSummary,
    PromptSummary,
    SeamResult,
)
from alignatt.capture.names import VLLM_CAPTURE
from alignatt.core.errors import AlignattError
from alignatt.record.isolated import run_module

DEFAULT_FACTORY = "alignatt.measure.bench:default_seam_factory"
# The same factory under the module paths it had earlier: committed bench artifacts record them, and
# they name alignatt's own seams all the same (the audit flags any other factory).
OWN_FACTORIES = (DEFAULT_FACTORY, "alignatt.pipeline.bench:default_seam_factory", "alignatt.bench:default_seam_factory")
FACTORY_ENV = "ALIGNATT_BENCH_SEAM_FACTORY"

BenchSeamFactory = Callable[[str, BenchConfig], Any]  # returns an object implementing capture.Seam
SeamRunner = Callable[[str, BenchConfig], SeamResult]


# ---- prompts and one measured row -------------------------------------------------------------


def load_prompts(path: str | None = None) -> list[BenchPrompt]:
    if path is None:
        text = resources.files("alignatt").joinpath("data/mt_capture_prompts.json").read_text("utf-8")
    else:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as e:
            raise AlignattError(f"prompts file {path}: {e.strerror}") from None
    try:
        data = json.loads(text)
        prompts = [BenchPrompt.model_validate(p) for p in data["prompts"]]
    except (json.JSONDecodeError, KeyError, TypeError, ValidationError) as e:
        raise AlignattError(f"prompts file {path or '(packaged)'}: {e}") from None
    if not prompts:
        raise AlignattError(f"prompts file {path or '(packaged)'} holds no prompts")
    return prompts


def draft_request(prompt: BenchPrompt, max_new_tokens: int):
    from alignatt.core.draft import DraftRequest

    return DraftRequest(
        source_words=prompt.source_text.split(),
        committed_words=prompt.accessible_units,
        target_prefix=prompt.assistant_prefill,
        max_new_tokens=max_new_tokens,
    )


def row_from_draft(draft, prompt: BenchPrompt, repeat: int, config: BenchConfig) -> BenchRow:
    from alignatt.core.policy import PolicyConfig, decide

    result = decide(draft, prompt.accessible_units, PolicyConfig(**config.policy))
    n = len(draft.tokens)
    t = draft.timings
    return BenchRow(
        id=prompt.id,
        repeat=repeat,
        length_bin=prompt.length_bin,
        prompt_tokens=draft.prompt_token_count,
        generated_tokens=n,
        draft_text=draft.text,
        emitted_text=result.emitted_text,
        emit_count=result.emit_count,
        draft_stop_reason=draft.stop_reason,
        policy_stop_reason=result.stop_reason,
        aligned_words=[d.aligned_word for d in result.decisions],
        prefill_ms=t.prefill_ms,
        decode_ms=t.decode_ms,
        capture_ms=t.capture_ms,
        reconstruct_ms=t.reconstruct_ms,
        total_ms=t.total_ms,
        per_token_ms=t.per_token_ms(n),
    )


def _bar(total: int, desc: str, enabled: bool):
    from alignatt.core.progress import progress_bar

    return progress_bar(total, desc, "draft", enabled)  # a bar on a terminal, plain lines in a log


def measure_seam(
    seam, name: str, prompts: list[BenchPrompt], config: BenchConfig, progress: bool = True
) -> tuple[list[BenchRow], list[tuple[int, int]]]:
    """Warm-up passes (discarded), then `repeats` measured passes over every prompt.

    Returns the rows and the (layer, head) pairs the seam captured."""
    with _bar(config.warmup * len(prompts), f"{name} warm-up", progress) as bar:
        for _ in range(config.warmup):
            for prompt in prompts:
                seam.draft(draft_request(prompt, config.max_new_tokens))
                bar.update()
    rows, heads = [], []
    with _bar(config.repeats * len(prompts), f"{name} measured", progress) as bar:
        for repeat in range(config.repeats):
            for prompt in prompts:
                draft = seam.draft(draft_request(prompt, config.max_new_tokens))
                rows.append(row_from_draft(draft, prompt, repeat, config))
                heads = [(h.layer, h.head) for h in draft.heads]
                bar.update()
    return rows, heads


# ---- aggregation ------------------------------------------------------------------------------


def _summary(rows: list[BenchRow]) -> MedianSummary:
    return MedianSummary(
        rows=len(rows),
        median_per_token_ms=statistics.median(r.per_token_ms for r in rows),
        median_total_ms=statistics.median(r.total_ms for r in rows),
    )


def _modal(values: list[str]) -> str:
    # most common; ties go to the earliest repeat, so the choice is deterministic
    counts = collections.Counter(values)
    return max(values, key=lambda v: (counts[v], -values.index(v)))


def summarize_seam(
    name: str, rows: list[BenchRow], heads: list[tuple[int, int]], load_s: float | None
) -> SeamResult:
    if not rows:
        return skipped_seam(name, "no measured rows (no prompts or zero repeats)")
    by_bin: dict[str, list[BenchRow]] = {}
    by_prompt: dict[str, list[BenchRow]] = {}
    for r in rows:
        by_bin.setdefault(r.length_bin, []).append(r)
        by_prompt.setdefault(r.id, []).append(r)
    prompts = {}
    for pid, prows in by_prompt.items():
        draft = _modal([r.draft_text for r in prows])
        emitted = _modal([r.emitted_text for r in prows])
        prompts[pid] = PromptSummary(
            **_summary(prows).model_dump(),
            draft_text=draft,
            emitted_text=emitted,
            unstable_repeats=sum(r.draft_text != draft or r.emitted_text != emitted for r in prows),
        )
    return SeamResult(
        seam=name,
        status="ok",
        heads=heads,
        load_s=load_s,
        rows=rows,
        median_per_token_ms=statistics.median(r.per_token_ms for r in rows),
        median_timings_ms={k: statistics.median(getattr(r, k) for r in rows) for k in TIMING_KEYS},
        by_length_bin={b: _summary(v) for b, v in by_bin.items()},
        by_prompt=prompts,
    )


def skipped_seam(name: str, reason: str) -> SeamResult:
    return SeamResult(seam=name, status="skipped", skip_reason=reason)


def find_divergences(results: list[SeamResult]) -> list[Divergence]:
    """Per prompt: do the seams that ran draft the same text and emit the same part of it?"""
    ran = [r for r in results if r.status == "ok"]
    if len(ran) < 2:
        return []
    out = []
    for pid in ran[0].by_prompt:
        drafts = {r.seam: r.by_prompt[pid].draft_text for r in ran if pid in r.by_prompt}
        emitted = {r.seam: r.by_prompt[pid].emitted_text for r in ran if pid in r.by_prompt}
        kinds = [k for k, d in (("draft", drafts), ("decision", emitted)) if len(set(d.values())) > 1]
        if kinds:
            out.append(Divergence(id=pid, kinds=kinds, drafts_by_seam=drafts, emitted_by_seam=emitted))
    return out


# ---- running seams ----------------------------------------------------------------------------


def default_seam_factory(name: str, config: BenchConfig):
    from alignatt.heads.sets import default_heads
    from alignatt.capture.registry import make_seam

    heads = default_heads(config.model, config.heads_k)
    options = {"vllm_mode": config.vllm_mode} if name == VLLM_CAPTURE else {}
    return make_seam(
        name, model=config.model, heads=heads, device=config.device, dtype=config.dtype, **options
    )


def run_seam(
    name: str, config: BenchConfig, factory: BenchSeamFactory, progress: bool = True
) -> SeamResult:
    """Build one seam and measure it, in this process. Expected failures become 'skipped'."""
    prompts = load_prompts(config.prompts_file)
    started = time.perf_counter()
    try:
        seam = factory(name, config)
    except AlignattError as e:
        return skipped_seam(name, str(e))
    load_s = time.perf_counter() - started
    try:
        rows, heads = measure_seam(seam, name, prompts, config, progress)
    except Exception as e:  # a seam that breaks mid-run is a finding, not a crash of the bench
        traceback.print_exc()
        return skipped_seam(name, f"failed while measuring: {type(e).__name__}: {e}")
    finally:
        seam.close()
    result = summarize_seam(name, rows, heads, round(load_s, 3))
    result.variant = getattr(seam, "variant", None)
    return result


class InProcessRunner:
    """Runs each seam in this process (tests; the fake seams need no isolation)."""

    def __init__(self, factory: BenchSeamFactory, progress: bool = False):
        self.factory_fn = factory
        self.factory = f"{factory.__module__}:{factory.__qualname__}"
        self.progress = progress

    def __call__(self, name: str, config: BenchConfig) -> SeamResult:
        return run_seam(name, config, self.factory_fn, self.progress)


class WorkerJob(BaseModel):
    """What one seam worker process measures and where it writes the `SeamResult`."""

    model_config = ConfigDict(extra="forbid")

    seam: str
    config: BenchConfig
    out: str
    factory: str = DEFAULT_FACTORY
    progress: bool = True


class SubprocessRunner:
    """Runs each seam in a fresh `python -m alignatt.measure.bench JOB.json` worker process."""

    def __init__(self, factory: str | None = None, progress: bool = True, python: str | None = None):
        # ALIGNATT_BENCH_SEAM_FACTORY=module:function swaps the seams (tests, external seams);
        # the artifact records which factory built them and the audit flags a non-default one.
        self.factory = factory or os.environ.get(FACTORY_ENV) or DEFAULT_FACTORY
        self.progress = progress
        self.python = python or sys.executable

    def __call__(self, name: str, config: BenchConfig) -> SeamResult:
        with tempfile.TemporaryDirectory(prefix="alignatt-bench-") as tmp:
            job_path, out_path = Path(tmp, "job.json"), Path(tmp, "result.json")
            job = WorkerJob(seam=name, config=config, out=str(out_path), factory=self.factory,
                            progress=self.progress)
            job_path.write_text(job.model_dump_json(), encoding="utf-8")
            done = run_module("alignatt.measure.bench", str(job_path), keep=8, stdout=False, python=self.python)
            code, tail = done.code, done.tail
            if code == 0 and out_path.exists():
                try:
                    return SeamResult.model_validate_json(out_path.read_text(encoding="utf-8"))
                except ValidationError as e:
                    return skipped_seam(name, f"worker wrote an invalid result: {e}")
            last = " | ".join(line for line in tail if line.strip())[-600:]
            return skipped_seam(name, f"worker exited with code {code}: {last or 'no output'}")


def run_bench(config: BenchConfig, runner: SeamRunner | None = None) -> BenchArtifact:
    """Measure every configured seam and assemble the artifact (provenance collected last)."""
    from alignatt.record.provenance import collect_provenance, model_identity

    unknown = [s for s in config.seams if s not in KNOWN_SEAMS]
    if unknown:
        raise AlignattError(f"unknown seam(s) {', '.join(unknown)}: use {', '.join(KNOWN_SEAMS)}")
    if not config.seams:
        raise AlignattError("no seams to measure")
    prompts = load_prompts(config.prompts_file)  # fail on a bad prompts file before any seam runs
    runner = runner or SubprocessRunner()
    results = [runner(name, config) for name in config.seams]
    model_id, revision = model_identity(config.model)
    provenance = collect_provenance(model_id=model_id, model_revision=revision)
    return BenchArtifact(
        schema_version=ARTIFACT_SCHEMA_VERSION,
        provenance=provenance,
        config=config,
        synthetic_weights=provenance.synthetic_weights,
        seam_factory=getattr(runner, "factory", "unknown"),
        prompt_count=len(prompts),
        seams=results,
        divergences=find_divergences(results),
    )


def check_expected_seams(artifact: BenchArtifact) -> None:
    """Fail when every seam the profile expects to run here was skipped: such a stage measured
    nothing, and a row of skips must not pass for a result (a GPU host missing its tokenizer)."""
    c = artifact.config
    expected = [s for s in c.seams if s not in c.expect_skipped]
    results = [artifact.seam(s) for s in expected]
    if not expected or any(r is not None and r.status == "ok" for r in results):
        return
    reasons = "; ".join(f"{s}: {' '.join((r.skip_reason or 'not run').split())[:160]}"
                        for s, r in zip(expected, results) if r is not None)
    raise AlignattError(f"bench {c.vllm_mode} (profile {c.profile or '-'}, model {c.model}): every seam "
                        f"expected to run was skipped, nothing written; `alignatt doctor` says what is "
                        f"missing ({reasons})")


def merge_bench(base: BenchArtifact, part: BenchArtifact) -> BenchArtifact:
    """Add the seams of `part` to `base`: one stage measured in several calls (a GPU host that
    limits a command's time). Both must be the same session: same config apart from the seams,
    same day, machine, versions, commit and model. The provenance kept is `base`'s."""
    a, b = base.config.model_dump(exclude={"seams"}), part.config.model_dump(exclude={"seams"})
    differ = sorted(k for k in a if a[k] != b[k])
    pa, pb = base.provenance, part.provenance
    facts = ("date", "gpus", "torch", "vllm", "transformers", "git_commit", "git_dirty",
             "model_id", "model_revision", "container_digest")
    differ += sorted(f"provenance.{k}" for k in facts if getattr(pa, k) != getattr(pb, k))
    if base.seam_factory != part.seam_factory:
        differ.append("seam_factory")
    if differ:
        raise AlignattError(f"cannot add to a bench artifact of another session: {', '.join(differ)} differ")
    replaced = {s.seam for s in part.seams}
    seams = [s for s in base.seams if s.seam not in replaced] + part.seams
    config = base.config.model_copy(update={"seams": [s.seam for s in seams]})
    return base.model_copy(update={"config": config, "seams": seams, "divergences": find_divergences(seams)})


# ---- small derived outputs for DVC (metrics, plot data) ---------------------------------------


def bench_metrics(artifact: BenchArtifact) -> dict[str, Any]:
    """Flat headline numbers per seam, for `dvc metrics show`."""
    return {
        s.seam: {"median_per_token_ms": s.median_per_token_ms, "rows": len(s.rows), "status": s.status}
        for s in artifact.seams
    }


def latency_csv(artifact: BenchArtifact) -> str:
    """One line per prompt, one column per seam (median per-token ms): DVC's per-seam plot."""
    seams = [s.seam for s in artifact.seams]
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(["prompt_no", "prompt", *(f"{s}_ms" for s in seams)])
    prompt_ids = [p.id for p in load_prompts(artifact.config.prompts_file)]
    for no, pid in enumerate(prompt_ids, 1):
        cells = []
        for s in artifact.seams:
            summary = s.by_prompt.get(pid)
            cells.append(f"{summary.median_per_token_ms:.3f}" if summary else "")
        writer.writerow([no, pid, *cells])
    return buf.getvalue()


def write_bench_outputs(
    artifact: BenchArtifact, out: str | Path, metrics: str | Path | None = None,
    plot: str | Path | None = None, add: bool = False,
) -> BenchArtifact:
    """Write the artifact (merged into an existing `out` when `add`) and its derived files."""
    from alignatt.record.artifacts import load_artifact, write_artifact

    if add and Path(out).exists():
        base = load_artifact(out)
        if not isinstance(base, BenchArtifact):
            raise AlignattError(f"{out} is a {base.kind} artifact, not a bench artifact")
        artifact = merge_bench(base, artifact)
    write_artifact(out, artifact)
    if metrics is not None:
        Path(metrics).parent.mkdir(parents=True, exist_ok=True)
        Path(metrics).write_text(json.dumps(bench_metrics(artifact), indent=1) + "\n", encoding="utf-8")
    if plot is not None:
        Path(plot).parent.mkdir(parents=True, exist_ok=True)
        Path(plot).write_text(latency_csv(artifact), encoding="utf-8")
    return artifact


def format_summary(artifact: BenchArtifact) -> str:
    c = artifact.config
    lines = [f"bench {c.model} on {c.device} (vLLM mode {c.vllm_mode}): "
             f"{artifact.prompt_count} prompts x {c.repeats} repeats after {c.warmup} warm-up"]
    for s in artifact.seams:
        if s.status == "ok":
            lines.append(f"  {s.seam:<13} {len(s.rows):>3} rows  median {s.median_per_token_ms:8.2f} ms/token")
        else:
            lines.append(f"  {s.seam:<13} skipped: {s.skip_reason}")
    for d in artifact.divergences:
        lines.append(f"  divergence on {d.id}: {', '.join(d.kinds)} differ between seams")
    return "\n".join(lines)


# ---- the seam worker (started by SubprocessRunner) --------------------------------------------


def _import_factory(spec: str) -> BenchSeamFactory:
    module, _, attr = spec.partition(":")
    return getattr(importlib.import_module(module), attr)


def worker_main(job_file: str) -> int:
    job = WorkerJob.model_validate_json(Path(job_file).read_text(encoding="utf-8"))
    result = run_seam(job.seam, job.config, _import_factory(job.factory), progress=job.progress)
    Path(job.out).write_text(result.model_dump_json(), encoding="utf-8")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m alignatt.measure.bench JOB.json (the seam worker; use `alignatt bench`)")
    sys.exit(worker_main(sys.argv[1]))
