"""Commands that serve a model or measure one served: serve, smoke, speech-stream, speech-e2e, load, soak,
failover, replicas, eval, and deploy haproxy (the balancer's configuration)."""

from __future__ import annotations

import typer

from alignatt.cli.app import app, scratch_out, validated
from alignatt.cli.options import Knobs, knob_option, model_options, params_option, profile_option, was_given
from alignatt.cli.preflight import check_output, check_served, check_served_model
from alignatt.evaluate.run import EvalOptions
from alignatt.evaluate.tails import TAIL_NOISE_KNOBS, TailNoise, fold_tail_noise
from alignatt.measure.capacity import LoadOptions
from alignatt.measure.failover import FailoverOptions
from alignatt.measure.replicas import ReplicasOptions
from alignatt.measure.smoke import SmokeOptions
from alignatt.measure.soak import SoakOptions
from alignatt.record.artifacts.speech import SpeechE2EOptions
from alignatt.speech.recognise import RecogniserOptions
from alignatt.serve.balancer import BalancerOptions
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
    profile: str = profile_option("`smoke:`"),
    params: str = params_option(),
    **fields,
) -> None:
    """Start the server on loopback, replay the smoke stream through a real client, write the artifact."""
    from alignatt.measure.smoke import run_smoke, summary_line
    from alignatt.pipeline.params import stage_options

    options = stage_options(SmokeOptions, "smoke", fields, params, profile)
    check_served_model(options.model, options.seam, options.heads)
    out = scratch_out(out, "smoke", "server_smoke.json")
    check_output(out)
    artifact = run_smoke(options, out)
    typer.echo(summary_line(artifact))
    typer.echo(f"wrote {out}")


@app.command("speech-stream")
@model_options(RecogniserOptions)
def speech_stream_cmd(
    out: str = typer.Option(None, help="where to write the stream (default: alignatt/data/speech/<clip>.json, "
                                       "which `--stream speech:<clip>` replays)"),
    **fields,
) -> None:
    """Recognise a clip live (LocalAgreement over faster-whisper) into a timed stream that smoke and load replay."""
    from pathlib import Path

    from alignatt.record.artifacts import write_artifact
    from alignatt.speech.recognise import speech_stream

    options = validated(RecogniserOptions, "speech-stream option ", **fields)
    if out is None:
        out = str(Path(__file__).resolve().parents[1] / "data" / "speech" / f"{Path(options.clip).stem}.json")
    check_output(out)
    stream = speech_stream(options)
    write_artifact(out, stream)
    r = stream.recognised or {}
    typer.echo(f"{len(stream.words)} words in {r.get('audio_s')} s of audio, real-time factor "
               f"{r.get('real_time_factor')}, committed WER {r.get('wer_committed')} (live tail "
               f"{r.get('wer_tail')}), tail revised in "
               f"{(r.get('tail_revisions') or {}).get('revised_share')} of the steps that showed one")
    typer.echo(f"wrote {out}")


@app.command("speech-e2e")
@model_options(SpeechE2EOptions)
def speech_e2e_cmd(
    out: str = typer.Option(None, help="where to write the speech_e2e artifact (default: runs/speech-e2e-<time>/)"),
    profile: str = profile_option("`speech_e2e:`"),
    params: str = params_option(),
    **fields,
) -> None:
    """The user's path end to end: whisperlivekit-server hears a clip, asks `alignatt serve`; the artifact."""
    from alignatt.measure.speech_e2e import run_speech_e2e, summary_line
    from alignatt.pipeline.params import stage_options

    options = stage_options(SpeechE2EOptions, "speech_e2e", fields, params, profile, "speech-e2e option ")
    check_served_model(options.model, options.seam)
    out = scratch_out(out, "speech-e2e", "speech_e2e.json")
    check_output(out)
    artifact = run_speech_e2e(options, out)
    typer.echo(summary_line(artifact))
    typer.echo(f"wrote {out}")


@app.command("load")
@model_options(LoadOptions)
def load_cmd(
    out: str = typer.Option(None, help="where to write the load artifact (default: runs/load-<time>/)"),
    metrics: str = typer.Option(None, help="DVC metrics JSON"),
    plot: str = typer.Option(None, help="plot CSV: RTT against speakers"),
    profile: str = profile_option("`load:` (or --section's)"),
    params: str = params_option(),
    section: str = typer.Option("load", help="the profile's section --profile reads: load, load_speech (the "
                                             "capacity benchmark on a recognised speech stream) or load_anatomy "
                                             "(a level traced step by step)"),
    **fields,
) -> None:
    """N concurrent real-time speakers on one server per load level; writes the load artifact."""
    from alignatt.core.errors import AlignattError
    from alignatt.measure.capacity import run_load
    from alignatt.pipeline.params import LOAD_SECTIONS, stage_options

    if section not in LOAD_SECTIONS:
        raise AlignattError(f"--section {section}: load reads the profile's {', '.join(LOAD_SECTIONS)} section")
    options = stage_options(LoadOptions, section, fields, params, profile, "load option ")
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


def _measure_served(options, out: str | None, name: str, run, summary_line) -> None:
    """A measurement of a served model that writes one artifact and exits 1 when it misses a target."""
    check_served_model(options.model, options.seam, options.heads)
    out = scratch_out(out, name, f"{name}.json")
    check_output(out)
    artifact = run(options, out)
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

    _measure_served(validated(FailoverOptions, "failover option ", **fields), out, "failover", run_failover,
                    summary_line)


@app.command("replicas")
@model_options(Knobs(ReplicasOptions, exclude=("seam_factory", "seam_options")))  # the tests' stand-ins
def replicas_cmd(
    out: str = typer.Option(None, help="where to write the replicas artifact (default: runs/replicas-<time>/)"),
    **fields,
) -> None:
    """Replicas behind HAProxy, one killed and one drained under load: what the clients saw through it."""
    from alignatt.measure.replicas import run_replicas
    from alignatt.measure.replicas_record import summary_line

    _measure_served(validated(ReplicasOptions, "replicas option ", **fields), out, "replicas", run_replicas,
                    summary_line)


deploy_app = typer.Typer(no_args_is_help=True, help="What runs alignatt past one machine: the balancer's config.")
app.add_typer(deploy_app, name="deploy")


@deploy_app.command("haproxy")
@model_options(BalancerOptions)
def deploy_haproxy_cmd(
    out: str = typer.Option(None, help="write the configuration here (default: print it)"),
    **fields,
) -> None:
    """HAProxy's configuration for `alignatt serve` replicas (least connections, /health checks, retries)."""
    from pathlib import Path

    from alignatt.serve.balancer import haproxy_config

    text = haproxy_config(validated(BalancerOptions, "balancer option ", **fields))
    if out is None:
        typer.echo(text, nl=False)
        return
    check_output(out)
    Path(out).write_text(text)
    typer.echo(f"wrote {out}")


# The noisy tail's knobs: fields of TailNoise, nested in EvalOptions.tail_noise, given flat (their
# defaults and help are TailNoise's; alignatt.evaluate.tails.TAIL_NOISE_KNOBS folds them back).
_TAIL_NOISE = {name: knob_option(TailNoise, field, names=[name])[0] for name, field in TAIL_NOISE_KNOBS.items()}


@app.command("eval")
@model_options(Knobs(EvalOptions, exclude=("tail_noise",)))  # nested: its own options below
def eval_cmd(
    ctx: typer.Context,
    tail_noise_seed: int = _TAIL_NOISE["tail_noise_seed"],
    tail_p_wrong: float = _TAIL_NOISE["tail_p_wrong"],
    tail_p_drop: float = _TAIL_NOISE["tail_p_drop"],
    tail_p_split: float = _TAIL_NOISE["tail_p_split"],
    out: str = typer.Option(None, help="the eval artifact, SimulEval instance logs beside it (default: runs/eval-<time>/)"),
    metrics: str = typer.Option(None, help="also write DVC metrics JSON here"),
    plot: str = typer.Option(None, help="also write the quality-vs-latency CSV here"),
    figure: str = typer.Option(None, help="also write the quality-vs-latency SVG here (needs matplotlib)"),
    profile: str = profile_option("`eval:` (with --test-set: `eval_directions:`)"),
    params: str = params_option(),
    **fields,
) -> None:
    """Replay a test set ASR-style through the server's Session per preset; score quality and latency."""
    from alignatt.evaluate.outputs import write_derived
    from alignatt.evaluate.run import run_eval
    from alignatt.pipeline.params import stage_options

    tail_noise = {"tail_noise_seed": tail_noise_seed, "tail_p_wrong": tail_p_wrong, "tail_p_drop": tail_p_drop,
                  "tail_p_split": tail_p_split}
    # only the tail-noise options given: a default must not hide the profile's value
    given = {**fields, **{k: v for k, v in tail_noise.items() if was_given(ctx, k)}}
    # the en-de eval stage reads the profile's `eval:`; an eval-direction stage (--test-set) its `eval_directions:`
    section = "eval_directions" if "test_set" in fields else "eval"
    options = stage_options(EvalOptions, section, given, params, profile, fold=fold_tail_noise)
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


