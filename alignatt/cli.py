"""The `alignatt` command: a thin typer layer over typed functions in the modules.

Each section below belongs to one module; commands parse options, call one function, print.
Expected failures (`AlignattError`) become one clear line on stderr and exit code 2.
"""

from __future__ import annotations

from pathlib import Path
from typing import NoReturn

import typer
from typer.core import TyperGroup

from alignatt.capture.names import DEFAULT_SEAM
from alignatt.core.errors import AlignattError
from alignatt.models.presets import DEFAULT_MODEL
from alignatt.core.policy import DEFAULT_PRESET, PRESET_NAMES


def fail(message: str) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)


class _Commands(TyperGroup):
    """Every command's expected failure (`AlignattError`) becomes one line and exit code 2."""

    def invoke(self, ctx):  # noqa: ANN001, ANN201 - click's signature
        try:
            return super().invoke(ctx)
        except AlignattError as e:
            fail(str(e))


app = typer.Typer(cls=_Commands, no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)


def validated(options_cls, prefix: str = "", **fields):
    """`options_cls(**fields)`; a bad option is one line (AlignattError), not a traceback."""
    from pydantic import ValidationError

    try:
        return options_cls(**fields)
    except ValidationError as e:
        first = e.errors()[0]
        raise AlignattError(f"{prefix}{'.'.join(map(str, first['loc']))}: {first['msg']}") from None


# The options of the commands that serve a model (serve, smoke, load, soak, eval): declared once.
MODEL = typer.Option(DEFAULT_MODEL, help="model preset or local checkpoint")
SEAM = typer.Option(DEFAULT_SEAM, help="capture seam: hf_eager | hf_qk_fast | vllm_capture")
PRESET = typer.Option(DEFAULT_PRESET, help=f"latency preset: {' | '.join(PRESET_NAMES)}")
DEVICE = typer.Option("cpu")
DTYPE = typer.Option(None, help="float32 | bfloat16 (default: the model's)")
TOP_K = typer.Option(4, "--top-k", help="alignment heads used")
HEADS = typer.Option(None, help="head-set file or bundled name (default: the model's)")
VLLM_MODE = typer.Option(None, help="vllm_capture only: eager | cudagraph | fullgraph | compiled (default cudagraph)")


# ---- capture core: translate, parity (alignatt.capture.registry / models / prompt) ----


@app.command("translate")
def translate_cmd(
    source: str = typer.Option(..., "--source", help="source text (committed words first, then the tail)"),
    committed_words: int = typer.Option(None, "--committed-words", help="committed source words (default: all)"),
    prefix: str = typer.Option("", "--prefix", help="accepted target text the draft continues"),
    seam: str = typer.Option(DEFAULT_SEAM, "--seam", help="hf_eager | hf_qk_fast | vllm_capture"),
    model: str = typer.Option(DEFAULT_MODEL, "--model", help="model preset or local checkpoint"),
    heads: int = typer.Option(4, "--heads", help="use the model's top-K default alignment heads"),
    head: list[str] = typer.Option(None, "--head", help="explicit head LAYER:HEAD (repeatable; overrides --heads)"),
    max_new_tokens: int = typer.Option(20, "--max-new-tokens"),
    policy: str = typer.Option(DEFAULT_PRESET, "--policy", help="policy preset"),
    final: bool = typer.Option(False, "--final", help="the source is complete: emit the whole draft"),
    device: str = typer.Option("cpu", "--device"),
    dtype: str = typer.Option(None, "--dtype", help="float32 | bfloat16 (default: the model's)"),
    as_json: bool = typer.Option(False, "--json", help="print the draft and every decision as JSON"),
) -> None:
    """Draft a translation once and show what AlignAtt emits, what it holds and why."""
    import json

    from alignatt.capture import registry as seams

    result = seams.translate(
        source, committed_words=committed_words, prefix=prefix, seam=seam, model=model,
        heads_k=heads, heads=seams.parse_heads(head) if head else None,
        max_new_tokens=max_new_tokens, policy=policy, final=final, device=device, dtype=dtype,
    )
    if as_json:
        typer.echo(json.dumps(result.as_dict(), ensure_ascii=False, indent=2))
    else:
        typer.echo(seams.describe_translation(result))


@app.command("parity")
def parity_cmd(
    model: str = typer.Option("tiny-gemma4", "--model", help="model preset or local checkpoint"),
    seams_csv: str = typer.Option("hf_eager,hf_qk_fast", "--seams", help="comma-separated seams to compare"),
    head: list[str] = typer.Option(None, "--head", help="heads LAYER:HEAD (repeatable; default: every head)"),
    max_new_tokens: int = typer.Option(12, "--max-new-tokens"),
    limit: int = typer.Option(None, "--limit", help="use only the first N benchmark prompts"),
    device: str = typer.Option("cpu", "--device"),
    dtype: str = typer.Option("float32", "--dtype"),
    as_json: bool = typer.Option(False, "--json", help="print the parity report as JSON"),
) -> None:
    """Compare the attention rows and drafts of two or more seams on the same prompts."""
    from alignatt.checks import seam_parity as parity
    from alignatt.capture import registry as seams

    names = [s.strip() for s in seams_csv.split(",") if s.strip()]
    for name in names:
        if name not in seams.SEAMS:
            raise AlignattError(f"unknown seam {name!r}: use one of {', '.join(seams.SEAMS)}")
    if limit is not None and limit < 1:
        raise AlignattError(f"--limit must be >= 1, got {limit}")
    report = parity.run_parity(
        model=model, seams=names, heads=seams.parse_heads(head) if head else None, device=device,
        dtype=dtype, max_new_tokens=max_new_tokens, limit=limit,
    )
    typer.echo(report.model_dump_json(indent=2) if as_json else parity.describe(report))

# ---- heads: heads calibrate, heads show (alignatt.heads.sets / calibrate) ----

heads_app = typer.Typer(no_args_is_help=True, help="Alignment head sets: show and calibrate.")
app.add_typer(heads_app, name="heads")


@heads_app.command("show")
def heads_show(
    name: str = typer.Argument(None, help="bundled head-set name or a head-set JSON path; omit to list"),
    model: str = typer.Option(None, "--model", help="show the default head set of this model instead"),
    direction: str = typer.Option("en-de", "--direction"),
    top: int = typer.Option(10, "--top", help="heads to list (0 = all)"),
    as_json: bool = typer.Option(False, "--json", help="print the head set as JSON"),
) -> None:
    """Show a head set (ranked heads and calibration facts), or list the bundled ones."""
    from alignatt.heads import sets as heads

    if name is None and model is None:
        typer.echo(heads.describe_bundled())
        return
    head_set = heads.default_head_set(model, direction) if model else heads.load_head_set(name)
    if top < 0:
        raise AlignattError(f"--top must be >= 0, got {top}")
    if as_json:
        typer.echo(head_set.to_json(), nl=False)
    else:
        typer.echo(heads.describe_head_set(head_set, top or None))


@heads_app.command("calibrate")
def heads_calibrate(
    model: str = typer.Option(DEFAULT_MODEL, "--model", help="model preset or local checkpoint"),
    pairs: str = typer.Option(None, "--pairs", help="word-aligned pairs JSON (default: bundled en-de)"),
    max_pairs: int = typer.Option(None, "--max-pairs", help="use only the first N pairs"),
    out: str = typer.Option(..., "--out", help="where to write the head-set JSON"),
    top: int = typer.Option(10, "--top", help="heads to print after calibrating"),
    device: str = typer.Option("cpu", "--device"),
    dtype: str = typer.Option(None, "--dtype", help="float32 | bfloat16 (default: the model's)"),
    reverse: bool = typer.Option(False, "--reverse", help="read the pairs target->source (cs-en pairs calibrate en-cs)"),
) -> None:
    """Score every head by how often its source argmax hits the aligned word; write a head set."""
    from alignatt.heads.calibrate import calibrate
    from alignatt.heads.sets import describe_head_set, write_head_set

    head_set = calibrate(model, pairs, max_pairs=max_pairs, device=device, dtype=dtype, reverse=reverse)
    path = write_head_set(out, head_set)
    typer.echo(describe_head_set(head_set, max(top, 1)))
    typer.echo(f"wrote {path}")


# ---- server: serve, smoke (alignatt.serve.server / smoke) ----


def _server_config(
    config: str | None, host: str, port: int, model: str, seam: str, preset: str, direction: str,
    heads: str | None, top_k: int, device: str, dtype: str | None, max_sessions: int,
    max_utterance_words: int, vllm_mode: str | None, engines: str, settle_buffer_tokens: int | None = None,
    engine_process: bool | None = None,
):
    from alignatt.serve.config import server_config

    return server_config(
        config_path=config, host=host, port=port, model=model, seam=seam, preset=preset,
        direction=direction, heads=heads, top_k=top_k, device=device, dtype=dtype,
        max_sessions=max_sessions, max_utterance_words=max_utterance_words, vllm_mode=vllm_mode,
        engines=engines, settle_buffer_tokens=settle_buffer_tokens, engine_process=engine_process,
    )


@app.command("serve")
def serve_cmd(
    host: str = typer.Option("127.0.0.1", help="interface to listen on"),
    port: int = typer.Option(8765, help="TCP port (0 = any free port)"),
    model: str = MODEL,
    seam: str = SEAM,
    preset: str = typer.Option(DEFAULT_PRESET, help=f"default latency preset: {' | '.join(PRESET_NAMES)}"),
    direction: str = typer.Option("en-de", help="the direction served (source-target)"),
    heads: str = HEADS,
    top_k: int = TOP_K,
    device: str = DEVICE,
    dtype: str = DTYPE,
    max_sessions: int = typer.Option(8, help="concurrent sessions; more get `busy`"),
    max_utterance_words: int = typer.Option(80, help="longer utterances are forced final"),
    vllm_mode: str = VLLM_MODE,
    engines: str = typer.Option("auto", help="engines per route: auto (one process per visible GPU with "
                                             "--device cuda, else 1) or a number (more than 1: a process each)"),
    settle_buffer_tokens: int = typer.Option(
        None, min=0, help="stop a partial draft once the policy's answer is known, N tokens past its first held "
                          "token (the shown buffer); unset: draft the whole 16 tokens (docs/batching.md)"),
    engine_process: bool = typer.Option(
        None, "--engine-process/--engine-in-server", help="the engine in a process of its own, or in the "
                                                           "server's; default: its own for vllm_capture on CUDA"),
    config: str = typer.Option(None, help="ServerConfig JSON (several directions); replaces the options above"),
) -> None:
    """Run the MT server (WhisperLiveKit `alignatt` protocol v1) until interrupted."""
    import logging

    from alignatt.serve.server import serve

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    cfg = _server_config(config, host, port, model, seam, preset, direction, heads, top_k,
                         device, dtype, max_sessions, max_utterance_words, vllm_mode, engines, settle_buffer_tokens,
                         engine_process)
    typer.echo(f"loading {', '.join(f'{d}: {r.model}/{r.seam}' for d, r in cfg.directions.items())} ...")
    serve(cfg, on_ready=lambda s: typer.echo(
        f"alignatt-mt-server listening on ws://{cfg.host}:{s.port} (preset {cfg.default_preset})"))


@app.command("smoke")
def smoke_cmd(
    model: str = MODEL,
    seam: str = SEAM,
    preset: str = PRESET,
    device: str = DEVICE,
    dtype: str = DTYPE,
    top_k: int = TOP_K,
    heads: str = HEADS,
    speed: float = typer.Option(None, help="replay speed (default: the stream file's, 4x)"),
    client: str = typer.Option("auto", help="native | wlk | both | auto (both when WhisperLiveKit imports)"),
    vllm_mode: str = VLLM_MODE,
    stream: str = typer.Option(None, help="stream JSON (default: the bundled smoke stream)"),
    out: str = typer.Option("outputs/server_smoke.json", help="where to write the smoke artifact"),
) -> None:
    """Start the server on loopback, replay the smoke stream through a real client, write the artifact."""
    from alignatt.measure.smoke import SmokeOptions, run_smoke, summary_line

    options = validated(SmokeOptions, model=model, seam=seam, preset=preset, device=device, dtype=dtype,
                        top_k=top_k, heads=heads, speed=speed, client=client, stream=stream, vllm_mode=vllm_mode)
    artifact = run_smoke(options, out)
    typer.echo(summary_line(artifact))
    typer.echo(f"wrote {out}")


@app.command("load")
def load_cmd(
    model: str = MODEL,
    seam: str = SEAM,
    preset: str = PRESET,
    device: str = DEVICE,
    dtype: str = DTYPE,
    top_k: int = TOP_K,
    heads: str = HEADS,
    vllm_mode: str = typer.Option(None, help="vllm_capture: configurations, comma-separated, each a mode with "
                                             "optional +flags: verify, batch_invariant, engines<N> (N engine processes "
                                             "on the GPU), process (the one engine in a process of its own), settle<N> "
                                             "(stop drafts N tokens past the answer), e.g. "
                                             "fullgraph,fullgraph+settle4,fullgraph+settle4+process"),
    speakers: str = typer.Option("1,2,4", help="load levels: concurrent speakers, comma-separated"),
    streams: str = typer.Option("smoke,long", help="streams speakers replay in turn: smoke, long or paths"),
    speed: float = typer.Option(1.0, help="replay speed (1.0: real time)"),
    stagger: float = typer.Option(0.14, help="seconds between speakers' starts"),
    pacing: str = typer.Option("lockstep", help="lockstep (an update waits for its reply) | realtime (sent when due)"),
    clients: str = typer.Option("processes", help="speakers in client processes of their own | threads of the "
                                                  "server's process"),
    prefix_caching: bool = typer.Option(None, "--prefix-caching/--no-prefix-caching",
                                        help="vllm_capture: vLLM prefix caching (default on for the server)"),
    max_num_seqs: int = typer.Option(None, help="vllm_capture: engine batch limit (server default 128)"),
    engines: str = typer.Option("1", help="the server's engines: a number, or auto (one per visible GPU on cuda)"),
    capture_cost: str = typer.Option("auto", help="captured vs uncaptured wall per batch: auto | on | off"),
    capture_cost_batches: str = typer.Option("1,8,32,64", help="batch sizes of the capture-cost measurement"),
    profile_dir: str = typer.Option(None, help="capture cost: torch-profile drafts at batch 1 and the largest "
                                            "batch (captured and uncaptured), a folder per configuration"),
    out: str = typer.Option("outputs/load.json", help="where to write the load artifact"),
    metrics: str = typer.Option(None, help="DVC metrics JSON"),
    plot: str = typer.Option(None, help="plot CSV: RTT against speakers"),
) -> None:
    """N concurrent real-time speakers on one server per load level; writes the load artifact."""
    from alignatt.measure.capacity import LoadOptions, run_load

    options = validated(LoadOptions, "load option ", model=model, seam=seam, preset=preset, device=device,
                        dtype=dtype, top_k=top_k, heads=heads, vllm_mode=vllm_mode, speakers=speakers,
                        streams=streams, speed=speed, stagger_s=stagger, pacing=pacing, clients=clients,
                        prefix_caching=prefix_caching, max_num_seqs=max_num_seqs, engines=engines,
                        capture_cost=capture_cost, capture_cost_batches=capture_cost_batches, profile_dir=profile_dir)
    run_load(options, out, metrics, plot)
    typer.echo(f"wrote {out}")


@app.command("soak")
def soak_cmd(
    model: str = MODEL,
    seam: str = SEAM,
    device: str = DEVICE,
    minutes: float = typer.Option(30.0, help="how long sessions keep starting"),
    clients: int = typer.Option(3, help="concurrent client threads"),
    seed: int = typer.Option(0),
    out: str = typer.Option("outputs/cpu/soak.json", help="where to write the soak artifact"),
) -> None:
    """Mixed well-formed and hostile sessions on loopback for N minutes; RSS, descriptors, targets."""
    from alignatt.measure.soak import SoakOptions, run_soak, summary_line

    artifact = run_soak(SoakOptions(model=model, seam=seam, device=device, minutes=minutes, clients=clients,
                                    seed=seed), out, progress=lambda m: typer.echo(m, err=True))
    typer.echo(summary_line(artifact))
    typer.echo(f"wrote {out}")
    if not artifact.passed:
        raise typer.Exit(1)


@app.command("failover")
def failover_cmd(
    model: str = MODEL,
    seam: str = SEAM,
    preset: str = PRESET,
    device: str = DEVICE,
    dtype: str = DTYPE,
    top_k: int = TOP_K,
    heads: str = HEADS,
    vllm_mode: str = VLLM_MODE,
    engines: int = typer.Option(3, help="engine processes on the one device (3: one survives a kill and a stop)"),
    speakers: int = typer.Option(16, help="concurrent real-time speakers, each reconnecting when told"),
    streams: str = typer.Option("long", help="streams speakers replay in turn: smoke, long or paths"),
    speed: float = typer.Option(1.5, help="replay speed (1.0: real time)"),
    faults: str = typer.Option("kill@25,stop@50", help="action@seconds after the speakers start; kill = SIGKILL, "
                                                      "stop = SIGSTOP, each on the live engine with most sessions"),
    step_deadline: float = typer.Option(10.0, help="the server's hung-engine deadline (s)"),
    heartbeat: float = typer.Option(1.0, help="the server's engine heartbeat (s)"),
    out: str = typer.Option("outputs/failover.json", help="where to write the failover artifact"),
) -> None:
    """Engines killed and stopped under load: what the clients saw (nothing lost, told within a bound)."""
    from alignatt.measure.failover import FailoverOptions, run_failover
    from alignatt.measure.failover_record import summary_line

    options = validated(FailoverOptions, "failover option ", model=model, seam=seam, preset=preset, device=device,
                        dtype=dtype, top_k=top_k, heads=heads, vllm_mode=vllm_mode, engines=engines,
                        speakers=speakers, streams=streams, speed=speed, faults=faults,
                        step_deadline_s=step_deadline, heartbeat_s=heartbeat)
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
    out: str = typer.Option("outputs/eval.json", help="the eval artifact (SimulEval instance logs go beside it)"),
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
    )
    artifact = run_eval(options, out, progress=lambda m: typer.echo(m, err=True))
    write_derived(artifact, metrics, plot)
    if figure:
        from alignatt.evaluate.figure import quality_latency_svg

        if quality_latency_svg(artifact, figure) is None:
            typer.echo("matplotlib is not installed: no SVG written", err=True)
    for c in artifact.checks:
        typer.echo(f"{'ok  ' if c.passed else 'FAIL'} {c.name}: {c.detail}")
    typer.echo(f"wrote {out}")


# ---- pipeline: env, bench, report, audit (alignatt.record.provenance / bench / report / audit) ----


@app.command("env")
def env_cmd(
    out: str = typer.Option("outputs/env.json", help="where to write the env artifact"),
    model: str = typer.Option(None, help="model preset / HF id / path whose identity to record"),
    fingerprint: bool = typer.Option(False, "--fingerprint", help="write only the machine fingerprint "
                                     "(no timestamp, load or git state): what the DVC stages depend on"),
) -> None:
    """Record this machine's provenance (GPU, driver, CUDA, torch, vLLM, git, container)."""
    from alignatt.record.artifacts import env_artifact, fingerprint_artifact, write_artifact

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
    out: str = typer.Option("outputs/bench.json", help="the bench artifact"),
    metrics: str = typer.Option(None, help="also write headline metrics JSON here"),
    plot: str = typer.Option(None, help="also write the per-seam latency CSV here"),
    add: bool = typer.Option(False, "--add", help="add these seams to the existing --out (same session)"),
    progress: bool = typer.Option(True, help="progress bars on stderr"),
) -> None:
    """Measure the capture seams on the published protocol; each seam in its own subprocess."""
    from alignatt.measure import bench
    from alignatt.pipeline.params import bench_config

    config = bench_config(
        params, mode, profile, model=model, device=device, dtype=dtype, repeats=repeats,
        warmup=warmup, max_new_tokens=max_new_tokens, heads_k=heads_k, prompts_file=prompts,
        seams=[s.strip() for s in seams.split(",") if s.strip()] if seams else None,
    )
    artifact = bench.run_bench(config, bench.SubprocessRunner(progress=progress))
    bench.check_expected_seams(artifact)  # all expected seams skipped: one line, exit 2, nothing written
    artifact = bench.write_bench_outputs(artifact, out, metrics, plot, add)
    typer.echo(bench.format_summary(artifact))
    typer.echo(f"wrote {out}")


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
    out: str = typer.Option("outputs/h200/gpu_tests.json", help="the gpu_tests artifact"),
    verdict: str = typer.Option(None, help="also write the stable verdict the measuring stages depend on"),
    profile: str = typer.Option(None, help="params profile: one without a CUDA device records 'not run'"),
    params: str = typer.Option("params.yaml", help="params file (with --profile)"),
    lanes: int = typer.Option(None, help="test children side by side (default: the profile's gpu_lanes, else 1)"),
) -> None:
    """The GPU test suite whole, in one command (each test in a child process); an artifact of it.

    Extra arguments go to pytest (e.g. `-x`). Exit 1 when any GPU test failed or none passed."""
    from alignatt.measure.gpu_suite import record_gpu_suite, summary_line

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
    as_json: bool = typer.Option(False, "--json", help="machine-readable findings"),
    root: str = typer.Option(".", help="project root, for the report checks"),
    report: bool = typer.Option(True, help="also check combined report rows and report staleness"),
) -> None:
    """Validate artifacts, provenance, historical hashes and the report; exit 1 on any finding."""
    from alignatt.report.audit import run_audit

    result = run_audit(paths or None, root, report)
    typer.echo(result.as_json() if as_json else result.as_text())
    if not result.ok:
        raise typer.Exit(1)


# ---- GPU correctness checks of the vLLM seam (alignatt.checks.vllm_checks) ----


@app.command("check-vllm")
def check_vllm_cmd(
    check: str = typer.Argument("all", help="all, or one check: demo, exact, parity, speed, compiled_reduced, "
                                "compiled, speed_compiled, exact_fullgraph"),
    out: Path = typer.Option(..., "--out", help="the JSON artifact to write"),
    only: str = typer.Option("", "--only", help="with 'all': a comma-separated subset"),
    part: str = typer.Option(None, "--part", help="with 'all': a (demo..compiled_reduced) or b (compiled, speed_compiled, "
                             "exact_fullgraph), "
                             "each fitting one ~9-minute GPU call"),
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


def main() -> None:
    app()


if __name__ == "__main__":
    main()
