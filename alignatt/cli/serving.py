"""Commands that serve a model or measure one served: serve, smoke, load, soak, failover, eval."""

from __future__ import annotations

import typer

from alignatt.capture.names import DEFAULT_SEAM
from alignatt.cli.app import DEVICE, DTYPE, HEADS, MODEL, TOP_K, app, scratch_out, validated
from alignatt.cli.options import Knobs, model_options
from alignatt.cli.preflight import check_output, check_served, check_served_model
from alignatt.measure.capacity import LoadOptions
from alignatt.measure.failover import FailoverOptions
from alignatt.measure.smoke import SmokeOptions
from alignatt.measure.soak import SoakOptions
from alignatt.serve.config import (SERVE_CONFIG_FIELDS, SERVE_LIMIT_FIELDS, SERVE_ROUTE_FIELDS, DirectionRoute,
                                   ServerConfig, ServerLimits, server_config)


# ---- server: serve, smoke (alignatt.serve.server / smoke) ----


@app.command("serve")
@model_options(Knobs(ServerConfig, only=SERVE_CONFIG_FIELDS), Knobs(DirectionRoute, only=SERVE_ROUTE_FIELDS),
               Knobs(ServerLimits, only=SERVE_LIMIT_FIELDS))
def serve_cmd(
    # What is no one field of ServerConfig: the direction (a key of `directions`), and what the
    # command resolves for the route it builds (serve/config.py server_config).
    direction: str = typer.Option("en-de", help="the direction served (source-target)"),
    vllm_mode: str = typer.Option(None, help="vllm_capture only: eager | cudagraph | fullgraph | compiled "
                                             "(default: fullgraph, serve/config.py SERVED_VLLM_OPTIONS)"),
    settle_buffer_tokens: str = typer.Option(
        "auto", help="ServerConfig.settle_buffer_tokens: stop a partial draft once the policy's answer is known, "
                     "N tokens past its first held token (the shown buffer); none: whole drafts; auto: 2 for "
                     "vllm_capture on CUDA (the measured best), else none"),
    engine_process: bool = typer.Option(
        None, "--engine-process/--engine-in-server", help="the engine in a process of its own, or in the "
                                                           "server's; default: its own for vllm_capture on CUDA"),
    config: str = typer.Option(None, help="ServerConfig JSON (several directions); replaces the options above "
                                          "but those of who may connect (origins, token, TLS)"),
    **fields,
) -> None:
    """Run the MT server (WhisperLiveKit `alignatt` protocol v1) until interrupted."""
    import logging

    from alignatt.serve.access import TOKEN_ENV, check_exposure, ssl_context
    from alignatt.serve.server import serve

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    cfg = server_config(config, direction=direction, vllm_mode=vllm_mode, settle_buffer_tokens=settle_buffer_tokens,
                        engine_process=engine_process, token_env=TOKEN_ENV, **fields)
    check_exposure(cfg)  # before any model is loaded: no token beyond loopback is refused at once
    ssl_context(cfg)
    check_served(cfg)  # the models, head sets and port: before any model is loaded
    typer.echo(f"loading {', '.join(f'{d}: {r.model}/{r.seam}' for d, r in cfg.directions.items())} ...")
    serve(cfg, on_ready=lambda s: typer.echo(
        f"alignatt-mt-server listening on {'wss' if s.ssl else 'ws'}://{cfg.host}:{s.port} (preset {cfg.default_preset})"))


@app.command("smoke")
@model_options(SmokeOptions)
def smoke_cmd(
    out: str = typer.Option(None, help="where to write the smoke artifact (default: runs/smoke-<time>/)"),
    **fields,
) -> None:
    """Start the server on loopback, replay the smoke stream through a real client, write the artifact."""
    from alignatt.measure.smoke import run_smoke, summary_line

    options = validated(SmokeOptions, **fields)
    check_served_model(options.model, options.seam, options.heads)
    out = scratch_out(out, "smoke", "server_smoke.json")
    check_output(out)
    artifact = run_smoke(options, out)
    typer.echo(summary_line(artifact))
    typer.echo(f"wrote {out}")


@app.command("load")
@model_options(LoadOptions)
def load_cmd(
    out: str = typer.Option(None, help="where to write the load artifact (default: runs/load-<time>/)"),
    metrics: str = typer.Option(None, help="DVC metrics JSON"),
    plot: str = typer.Option(None, help="plot CSV: RTT against speakers"),
    **fields,
) -> None:
    """N concurrent real-time speakers on one server per load level; writes the load artifact."""
    from alignatt.measure.capacity import run_load

    options = validated(LoadOptions, "load option ", **fields)
    check_served_model(options.model, options.seam, options.heads)
    out = scratch_out(out, "load", "load.json")
    for path, option in ((out, "--out"), (metrics, "--metrics"), (plot, "--plot")):
        check_output(path, option)
    run_load(options, out, metrics, plot)
    typer.echo(f"wrote {out}")


@app.command("soak")
@model_options(SoakOptions)
def soak_cmd(
    out: str = typer.Option(None, help="where to write the soak artifact (default: runs/soak-<time>/)"),
    **fields,
) -> None:
    """Mixed well-formed and hostile sessions on loopback for N minutes; RSS, descriptors, targets."""
    from alignatt.measure.soak import run_soak, summary_line

    options = validated(SoakOptions, "soak option ", **fields)
    check_served_model(options.model, options.seam, options.heads)
    out = scratch_out(out, "soak", "soak.json")
    check_output(out)
    artifact = run_soak(options, out, progress=lambda m: typer.echo(m, err=True))
    typer.echo(summary_line(artifact))
    typer.echo(f"wrote {out}")
    if not artifact.passed:
        raise typer.Exit(1)


@app.command("failover")
@model_options(Knobs(FailoverOptions, exclude=("seam_factory", "seam_options")))  # the tests' stand-ins
def failover_cmd(
    out: str = typer.Option(None, help="where to write the failover artifact (default: runs/failover-<time>/)"),
    **fields,
) -> None:
    """Engines killed and stopped under load: what the clients saw (nothing lost, told within a bound)."""
    from alignatt.measure.failover import run_failover
    from alignatt.measure.failover_record import summary_line

    options = validated(FailoverOptions, "failover option ", **fields)
    check_served_model(options.model, options.seam, options.heads)
    out = scratch_out(out, "failover", "failover.json")
    check_output(out)
    artifact = run_failover(options, out)
    typer.echo(summary_line(artifact))
    typer.echo(f"wrote {out}")
    if not artifact.passed:
        raise typer.Exit(1)


@app.command("eval")
def eval_cmd(
    test_set: str = typer.Option("en-de", "--test-set", help="named set (en-de), .jsonl, word-alignment .json, or SOURCE:TARGET files"),
    direction: str = typer.Option(None, help="source-target, e.g. cs-en (default: the test set's, else en-de)"),
    model: str = MODEL,
    variants: str = typer.Option(DEFAULT_SEAM, help="comma-separated seam[:vllm_mode], e.g. vllm_capture:cudagraph,vllm_capture:eager"),
    presets: str = typer.Option("low_latency,balanced,high_latency", help="comma-separated latency presets"),
    drivers: str = typer.Option("inprocess", help="comma-separated: inprocess, websocket (alignatt serve, native client), wlk (alignatt serve, WhisperLiveKit client)"),
    limit: int = typer.Option(None, help="first N sentences of the test set"),
    max_source_words: int = typer.Option(None, help="only sentences with at most this many words"),
    longform_talks: int = typer.Option(0, help="long-form talks of consecutive pairs (0: none)"),
    pairs_per_talk: int = typer.Option(5, help="pairs concatenated into one talk"),
    words_per_second: float = typer.Option(2.4, help="ASR word rate"),
    commit_lag: float = typer.Option(2.0, "--commit-lag", help="seconds from a word's arrival to its commit"),
    device: str = DEVICE,
    dtype: str = DTYPE,
    top_k: int = TOP_K,
    heads: str = HEADS,
    comet_model: str = typer.Option(None, "--comet-model", help="local COMET checkpoint (unbabel-comet); else skipped"),
    offline: bool = typer.Option(True, help="also the offline full-sentence baseline"),
    tails: str = typer.Option("gold,noisy,none", help="comma-separated ASR tails, a row each: gold, noisy (seeded noise), none (no lookahead)"),
    longform_tails: str = typer.Option("gold", help="comma-separated tails of the long-form rows"),
    tail_noise_seed: int = typer.Option(0, help="seed of the noisy tail"),
    tail_p_wrong: float = typer.Option(0.2, help="noisy tail: P(a tail word is another vocabulary word)"),
    tail_p_drop: float = typer.Option(0.05, help="noisy tail: P(a tail word is missing)"),
    tail_p_split: float = typer.Option(0.05, help="noisy tail: P(a tail word is split in two)"),
    bootstrap: int = typer.Option(1000, help="sacrebleu bootstrap resamples for the 95% intervals"),
    significance: str = typer.Option("bs", help="paired test against offline: bs (bootstrap) or ar (approximate randomization)"),
    significance_samples: int = typer.Option(0, help="resamples/trials of the paired test (0: sacrebleu's default)"),
    purpose: str = typer.Option("quality", help="quality, or scorer_smoke: too few sentences for a result (labelled so)"),
    concurrency: int = typer.Option(1, help="in-process streams replayed at once, their drafts batched by the engine (--engines: spread over several) (1: one at a time)"),
    engines: int = typer.Option(1, help="engine processes sharing the device, each batching its share of the --concurrency streams (1: the engine in this process)"),
    load_levels: str = typer.Option("", help="quality under load: comma-separated concurrencies, each a row of the default preset on the first --load-sentences"),
    load_sentences: int = typer.Option(100, help="sentences of each quality-under-load row"),
    settle_buffer_tokens: str = typer.Option(
        "auto", help="drafts settled as `alignatt serve --settle-buffer-tokens` settles them: N tokens past the "
                     "first held token; none: whole drafts; auto: the served default (2 for vllm_capture on CUDA, "
                     "else none)"),
    out: str = typer.Option(None, help="the eval artifact, SimulEval instance logs beside it (default: runs/eval-<time>/)"),
    metrics: str = typer.Option(None, help="also write DVC metrics JSON here"),
    plot: str = typer.Option(None, help="also write the quality-vs-latency CSV here"),
    figure: str = typer.Option(None, help="also write the quality-vs-latency SVG here (needs matplotlib)"),
) -> None:
    """Replay a test set ASR-style through the server's Session per preset; score quality and latency."""
    from alignatt.evaluate.outputs import write_derived
    from alignatt.evaluate.run import EvalOptions, run_eval

    split = lambda s: [x.strip() for x in s.split(",") if x.strip()]  # noqa: E731
    options = validated(
        EvalOptions, model=model, variants=split(variants), presets=split(presets), drivers=split(drivers),
        test_set=test_set, direction=direction, limit=limit, max_source_words=max_source_words,
        longform_talks=longform_talks, pairs_per_talk=pairs_per_talk, words_per_second=words_per_second,
        commit_lag_seconds=commit_lag, device=device, dtype=dtype, top_k=top_k, heads=heads,
        comet_model=comet_model, offline_baseline=offline, tails=split(tails), longform_tails=split(longform_tails),
        tail_noise={"seed": tail_noise_seed, "p_wrong": tail_p_wrong, "p_drop": tail_p_drop, "p_split": tail_p_split},
        bootstrap=bootstrap, significance=significance, significance_samples=significance_samples, purpose=purpose,
        concurrency=concurrency, engines=engines, load_levels=split(load_levels), load_sentences=load_sentences,
        settle_buffer_tokens=settle_buffer_tokens,
    )
    from alignatt.models.presets import check_model_name

    check_model_name(options.model)
    out = scratch_out(out, "eval", "eval.json")
    for path, option in ((out, "--out"), (metrics, "--metrics"), (plot, "--plot"), (figure, "--figure")):
        check_output(path, option)
    artifact = run_eval(options, out, progress=lambda m: typer.echo(m, err=True))
    write_derived(artifact, metrics, plot)
    if figure:
        from alignatt.evaluate.figure import quality_latency_svg

        if quality_latency_svg(artifact, figure) is None:
            typer.echo("matplotlib is not installed: no SVG written", err=True)
    for c in artifact.checks:
        typer.echo(f"{'ok  ' if c.passed else 'FAIL'} {c.name}: {c.detail}")
    typer.echo(f"wrote {out}")


