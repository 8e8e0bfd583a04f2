"""Commands of the pipeline and its checks: env, bench, doctor, test-gpu, report, audit, check-vllm."""

from __future__ import annotations

from pathlib import Path

import typer

from alignatt.cli.app import app, scratch_out
from alignatt.checks.vllm_checks import ALL_CHECKS, PARTS


# ---- pipeline: env, bench, report, audit (alignatt.record.provenance / bench / report / audit) ----


@app.command("env")
def env_cmd(
    out: str = typer.Option(None, help="where to write the env artifact (default: runs/env-<time>/)"),
    model: str = typer.Option(None, help="model preset / HF id / path whose identity to record"),
    fingerprint: bool = typer.Option(False, "--fingerprint", help="write only the machine fingerprint "
                                     "(no timestamp, load or git state): what the DVC stages depend on"),
    profile: str = typer.Option(None, help="params profile whose model to record (unless --model)"),
    params: str = typer.Option("params.yaml", help="params file of --profile"),
) -> None:
    """Record this machine's provenance (GPU, driver, CUDA, torch, vLLM, git, container)."""
    from alignatt.record.artifacts import env_artifact, fingerprint_artifact, write_artifact

    if profile is not None and model is None:
        from alignatt.pipeline.params import load_params, profile_of

        model = profile_of(load_params(params), profile)[1].model
    out = scratch_out(out, "env", "fingerprint.json" if fingerprint else "env.json")

    if fingerprint:
        written = fingerprint_artifact(model)
        write_artifact(out, written)
        f = written.fingerprint
        gpu = f"{f.gpu_count} x {f.gpus[0].name}" if f.gpus else "no GPU"
        typer.echo(f"wrote {out}: {gpu}; torch {f.torch}, vLLM {f.vllm}, transformers {f.transformers}; "
                   f"container {f.container_image}")
        return
    artifact = env_artifact(model)
    write_artifact(out, artifact)
    p = artifact.provenance
    gpu = f"{p.gpu_count} x {p.gpu_name}" if p.gpus else "no GPU"
    typer.echo(f"wrote {out}: {gpu}; torch {p.torch}, vLLM {p.vllm}, transformers {p.transformers}; "
               f"git {(p.git_commit or 'none')[:12]}{' (dirty)' if p.git_dirty else ''}; "
               f"container {p.container_image}")


@app.command("bench")
def bench_cmd(
    mode: str = typer.Option("eager", help="vLLM mode (a key of bench.modes in params.yaml)"),
    params: str = typer.Option("params.yaml", help="params file; built-in defaults if absent"),
    profile: str = typer.Option(None, help="params profile (default: params' `profile:`)"),
    model: str = typer.Option(None, help="override the profile's model"),
    seams: str = typer.Option(None, help="comma-separated seams to measure (override)"),
    device: str = typer.Option(None),
    dtype: str = typer.Option(None),
    repeats: int = typer.Option(None, help="measured passes over every prompt"),
    warmup: int = typer.Option(None, help="unmeasured passes before measuring"),
    max_new_tokens: int = typer.Option(None),
    heads_k: int = typer.Option(None, help="top-k alignment heads"),
    prompts: str = typer.Option(None, help="prompts JSON (default: the 16 published prompts)"),
    out: str = typer.Option(None, help="the bench artifact (default: runs/bench-<time>/)"),
    metrics: str = typer.Option(None, help="also write headline metrics JSON here"),
    plot: str = typer.Option(None, help="also write the per-seam latency CSV here"),
    add: bool = typer.Option(False, "--add", help="add these seams to the existing --out (same session)"),
    progress: bool = typer.Option(True, help="progress bars on stderr"),
) -> None:
    """Measure the capture seams on the published protocol; each seam in its own subprocess."""
    from alignatt.measure import bench
    from alignatt.pipeline.params import bench_config

    out = scratch_out(out, "bench", "bench.json")

    config = bench_config(
        params, mode, profile, model=model, device=device, dtype=dtype, repeats=repeats,
        warmup=warmup, max_new_tokens=max_new_tokens, heads_k=heads_k, prompts_file=prompts,
        seams=[s.strip() for s in seams.split(",") if s.strip()] if seams else None,
    )
    _check_bench_outputs(config, out, metrics, plot, add)
    artifact = bench.run_bench(config, bench.SubprocessRunner(progress=progress))
    bench.check_expected_seams(artifact)  # all expected seams skipped: one line, exit 2, nothing written
    artifact = bench.write_bench_outputs(artifact, out, metrics, plot, add)
    typer.echo(bench.format_summary(artifact))
    typer.echo(f"wrote {out}")


def _check_bench_outputs(config, out: str, metrics: str | None, plot: str | None, add: bool) -> None:  # noqa: ANN001
    """Before minutes of measuring: the outputs can be written and, with --add, `out` is a bench
    artifact of this configuration to add to (its provenance is compared after, as it must be)."""
    from alignatt.cli.preflight import check_existing_output, check_output
    from alignatt.core.errors import AlignattError
    from alignatt.measure.bench import BenchArtifact
    from alignatt.record.artifacts import load_artifact

    for path, option in ((out, "--out"), (metrics, "--metrics"), (plot, "--plot")):
        check_output(path, option)
    if not add:
        return
    check_existing_output(out)
    try:
        base = load_artifact(out)
    except AlignattError as e:  # its pydantic detail follows on more lines
        raise AlignattError(f"--add: {str(e).splitlines()[0]}") from None
    if not isinstance(base, BenchArtifact):
        raise AlignattError(f"{out} is a {base.kind} artifact, not a bench artifact: nothing to add to")
    a, b = base.config.model_dump(exclude={"seams"}), config.model_dump(exclude={"seams"})
    differ = sorted(k for k in a if a[k] != b.get(k))
    if differ:
        raise AlignattError(f"cannot add to {out}: its bench config differs in {', '.join(differ)}")


@app.command("doctor")
def doctor_cmd(
    params: str = typer.Option("params.yaml", help="params file"),
    profile: str = typer.Option(None, help="params profile (default: params' `profile:`)"),
    as_json: bool = typer.Option(False, "--json", help="machine-readable readiness"),
) -> None:
    """Before any long stage: which seams of the profile can run here, and what the others miss."""
    from alignatt.pipeline.doctor import diagnose

    result = diagnose(params, profile)
    typer.echo(result.model_dump_json(indent=1) if as_json else result.as_text())
    if not result.ok:
        raise typer.Exit(1)


@app.command("test-gpu", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def test_gpu_cmd(
    ctx: typer.Context,
    out: str = typer.Option(None, help="the gpu_tests artifact (default: runs/test-gpu-<time>/)"),
    verdict: str = typer.Option(None, help="also write the stable verdict the measuring stages depend on"),
    profile: str = typer.Option(None, help="params profile: one without a CUDA device records 'not run'"),
    params: str = typer.Option("params.yaml", help="params file (with --profile)"),
    lanes: int = typer.Option(None, help="test children side by side (default: the profile's gpu_lanes, else 1)"),
) -> None:
    """The GPU test suite whole, in one command (each test in a child process); an artifact of it.

    Extra arguments go to pytest (e.g. `-x`). Exit 1 when any GPU test failed or none passed."""
    from alignatt.measure.gpu_suite import record_gpu_suite, summary_line

    out = scratch_out(out, "test-gpu", "gpu_tests.json")

    device = None
    if profile is not None:
        from alignatt.pipeline.params import load_params, profile_of

        profile, prof = profile_of(load_params(params), profile)
        device = prof.device
        lanes = prof.gpu_lanes if lanes is None else lanes
    artifact = record_gpu_suite(Path(out), Path(verdict) if verdict else None, profile, device, list(ctx.args),
                                lanes=lanes or 1)
    typer.echo(summary_line(artifact))
    if artifact.ran and not artifact.passed:
        raise typer.Exit(1)


@app.command("report")
def report_cmd(
    check: bool = typer.Option(False, "--check", help="exit 1 if reports/BENCHMARKS.md is stale"),
    root: str = typer.Option(".", help="project root (params.yaml, outputs/, reports/)"),
) -> None:
    """Render reports/BENCHMARKS.md from params.yaml and the artifacts (byte-stable)."""
    from alignatt.report.page import stale_report, write_report

    if check:
        stale = stale_report(root)
        if stale:
            typer.echo(stale, err=True)
            raise typer.Exit(1)
        typer.echo("report is up to date")
        return
    path = write_report(root)
    typer.echo(f"wrote {path}")


@app.command("audit")
def audit_cmd(
    paths: list[str] = typer.Argument(None, help="artifact files or folders (default: outputs/)"),
    as_json: bool = typer.Option(False, "--json", help="everything, machine-readable: findings, accepted, records"),
    show_accepted: bool = typer.Option(False, "--show-accepted", help="also list the accepted findings and why"),
    trust: list[Path] = typer.Option(None, "--trust", help="an allowed_signers file or .pub key trusted for this "
                                     "audit only (a CI run's ephemeral key); repeatable"),
    root: str = typer.Option(".", help="project root, for the report checks"),
    report: bool = typer.Option(True, help="also check combined report rows and report staleness"),
) -> None:
    """Verdict first: artifacts, their signed run records, provenance, historical hashes and the report.

    Exit 1 on any finding (each names its file), 2 on bad input."""
    from alignatt.report.audit import run_audit

    result = run_audit(paths or None, root, report, trusted=list(trust or []))
    typer.echo(result.as_json() if as_json else result.as_text(show_accepted))
    if not result.ok:
        raise typer.Exit(1)


@app.command("attest")
def attest_cmd(
    folders: list[Path] = typer.Argument(None, help="folders under outputs/ (default: each one there)"),
    note: str = typer.Option(None, help="the record's note (default: says the digests were taken at import)"),
    new_key: str = typer.Option(None, "--new-key", metavar="PRINCIPAL", help="make this host's signing key "
                                "(at $ALIGNATT_SIGNING_KEY, else keys/private/signing_key), trust it in "
                                "keys/allowed_signers under PRINCIPAL, and stop"),
    root: Path = typer.Option(Path("."), help="project root"),
) -> None:
    """Sign run records for files measured before run records existed (recorded "at import")."""
    import os

    from alignatt.core.errors import AlignattError
    from alignatt.record.attestation import RECORDS_DIR
    from alignatt.record.importing import attest_imported
    from alignatt.record.signing import (ALLOWED_SIGNERS, DEFAULT_KEY, SIGNING_KEY_ENV, allowed_signers_line,
                                         generate_key, load_signing_key, signing_key_path)

    if new_key:
        path = Path(os.environ.get(SIGNING_KEY_ENV) or root / DEFAULT_KEY).expanduser()
        key = generate_key(path, new_key)
        allowed = root / ALLOWED_SIGNERS
        allowed.parent.mkdir(parents=True, exist_ok=True)
        with open(allowed, "a", encoding="utf-8") as f:
            f.write(allowed_signers_line(key))
        typer.echo(f"made {path} ({key.fingerprint}); trusted as {new_key} in {allowed}: commit that file, "
                   "never the private key")
        return
    key_path = signing_key_path(root)
    if key_path is None:
        raise AlignattError(f"no signing key: set {SIGNING_KEY_ENV} or make one with --new-key PRINCIPAL")
    outputs = root / "outputs"
    records = (root / RECORDS_DIR).resolve()
    folders = folders or sorted(p for p in outputs.iterdir() if p.is_dir() and p.resolve() != records)
    for path, count in attest_imported(root, list(folders), load_signing_key(key_path), note):
        typer.echo(f"wrote {path.relative_to(root.resolve())}: {count} file(s), signed at import by {key_path}")


# ---- GPU correctness checks of the vLLM seam (alignatt.checks.vllm_checks) ----


@app.command("check-vllm")
def check_vllm_cmd(
    check: str = typer.Argument("all", help=f"all, or one check: {', '.join(ALL_CHECKS)}"),
    out: Path = typer.Option(..., "--out", help="the JSON artifact to write"),
    only: str = typer.Option("", "--only", help="with 'all': a comma-separated subset"),
    part: str = typer.Option(None, "--part", help=f"with 'all': a ({', '.join(PARTS['a'])}) or b "
                             f"({', '.join(PARTS['b'])}), each fitting one ~9-minute GPU call"),
    workdir: str = typer.Option(None, "--workdir", envvar="ALIGNATT_CHECKS_WORKDIR",
                                help="scratch dir shared by the checks (part b reads part a's eager drafts)"),
    tokens: int = typer.Option(20, "--tokens"),
    repeats: int = typer.Option(3, "--repeats"),
    tokenizer: str = typer.Option("auto", "--tokenizer", help="auto | tiny"),
    budget_s: float = typer.Option(None, "--budget-s", help="start no new check after this many seconds"),
    worker_timeout: float = typer.Option(300.0, "--worker-timeout"),
    worker_timeout_compiled: float = typer.Option(420.0, "--worker-timeout-compiled"),
) -> None:
    """Run the vLLM seam's GPU correctness checks (each engine in its own process); exit 1 unless all pass."""
    from alignatt.checks.vllm_checks import ChecksOptions, run

    options = ChecksOptions(workdir=workdir, tokens=tokens, repeats=repeats, tokenizer=tokenizer,
                            budget_s=budget_s, worker_timeout=worker_timeout,
                            worker_timeout_compiled=worker_timeout_compiled)
    artifact = run(check, out, options, only=only, part=part)
    if not all(v == "passed" for v in artifact["summary"].values()):
        raise typer.Exit(1)

