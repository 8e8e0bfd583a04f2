"""Commands of the capture core and the head sets: translate, parity, heads show, heads calibrate."""

from __future__ import annotations

import typer

from alignatt.capture.names import DEFAULT_SEAM
from alignatt.cli.app import app
from alignatt.core.errors import AlignattError
from alignatt.core.policy import DEFAULT_PRESET
from alignatt.models.presets import DEFAULT_MODEL


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


