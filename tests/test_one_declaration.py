"""Every knob declared once (issue 43): a command's options are its options model's fields.

A command built by `alignatt.cli.options.model_options` takes one option per field, with the
field's default and description; its own parameters are the options that are no field (`--out`,
`--config`), listed here so that a new one is a decision. The checker below fails when an option's
default or help differs from its field, when an option names a field it does not come from, or when
a command declares an option that neither its model nor this list knows; it is itself tested on a
command that breaks each rule. params.yaml's stage sections may hold only keys their models know.
"""

from __future__ import annotations

import pytest
import typer

from alignatt.cli import app
from alignatt.cli.options import CommandKnobs, knob_option, model_options
from alignatt.core.options import knob_names, knob_type

# Each converted command and its options that are no field of its models (why, in the command).
NOT_FIELDS = {
    "soak": {"out"},
    # --profile, --params: the params profile whose section gives the options (pipeline/params.py:stage_options)
    "smoke": {"out", "profile", "params"},
    "speech-e2e": {"out", "profile", "params"},
    # --section: which of the profile's sections (load or load_speech) --profile reads
    "load": {"out", "metrics", "plot", "profile", "params", "section"},
    "failover": {"out"},
    # the direction is a key of `directions`; the rest are resolved for the route serve builds
    "serve": {"direction", "vllm_mode", "settle_buffer_tokens", "engine_process", "config"},
    # the tail-noise knobs are TailNoise's fields, nested in EvalOptions.tail_noise, given flat
    # (test_eval_tail_noise_options_are_tail_noise_fields holds them to TailNoise)
    "eval": {"out", "metrics", "plot", "figure", "tail_noise_seed", "tail_p_wrong", "tail_p_drop", "tail_p_split",
             "profile", "params"},
}


def _commands(typer_app: typer.Typer) -> dict[str, tuple[object, object]]:
    """name -> (the registered callback, its click command)."""
    group = typer.main.get_command(typer_app)
    return {info.name: (info.callback, group.commands[info.name])
            for info in typer_app.registered_commands if info.name in group.commands}


def problems(name: str, callback, command, not_fields: set[str]) -> list[str]:  # noqa: ANN001
    knobs: CommandKnobs | None = getattr(callback, "alignatt_knobs", None)
    if knobs is None:
        return [f"{name}: its options are not built from its model (alignatt.cli.options.model_options)"]
    out = []
    known = {n: (s.model, f) for s in knobs.sources for f in s.fields() for n in knob_names(s.model, f)}
    for param in command.params:
        if param.name == "help" or param.name is None:
            continue
        if param.name in knobs.own:
            if param.name in known:
                out.append(f"{name} --{param.name}: declared by the command but a field of {known[param.name][0].__name__}")
            elif param.name not in not_fields:
                out.append(f"{name} --{param.name}: an option its model does not know")
            continue
        field_of = knobs.field_of(param.name)
        if field_of is None:
            out.append(f"{name} --{param.name}: an option its model does not know")
            continue
        model, field = field_of
        expected, _ = knob_option(model, field, knobs.shown.get(field))
        if param.help != model.model_fields[field].description:
            out.append(f"{name} --{param.name}: help {param.help!r} is not {model.__name__}.{field}'s description")
        if param.default != expected.default:
            out.append(f"{name} --{param.name}: default {param.default!r} is not {model.__name__}.{field}'s "
                       f"{expected.default!r}")
        if f"--{field.replace('_', '-')}" not in param.opts:
            out.append(f"{name} --{param.name}: not named after {model.__name__}.{field}")
    return out


def test_every_converted_command_is_its_models_options():
    commands = _commands(app)
    found = [p for name in NOT_FIELDS for p in problems(name, *commands[name], NOT_FIELDS[name])]
    assert not found, "\n".join(found)


def test_the_checker_fails_a_drifted_option_and_an_unknown_one():
    from pydantic import BaseModel, Field

    class Opts(BaseModel):
        minutes: float = Field(30.0, description="how long")

    bad = typer.Typer()

    @bad.command("drifted")
    @model_options(Opts)
    def drifted(out: str = typer.Option(None), bogus: int = typer.Option(1), **fields) -> None: ...

    @bad.command("other")  # two commands: a group, as the app is
    def other() -> None: ...

    callback, command = _commands(bad)["drifted"]
    next(p for p in command.params if p.name == "minutes").default = 20.0  # as a hand-written option drifts
    next(p for p in command.params if p.name == "minutes").help = "how long sessions keep starting"
    found = problems("drifted", callback, command, {"out"})
    assert any("--minutes: default" in p for p in found)
    assert any("--minutes: help" in p for p in found)
    assert any("--bogus: an option its model does not know" in p for p in found)
    assert not any("--out" in p for p in found)


def test_an_option_declared_by_hand_beside_its_field_is_refused():
    from alignatt.measure.soak import SoakOptions

    with pytest.raises(TypeError, match="declared twice"):
        @model_options(SoakOptions)
        def twice(minutes: float = typer.Option(30.0), **fields) -> None: ...


def test_every_field_of_an_options_model_is_described_and_can_be_an_option():
    models = {s.model for name in NOT_FIELDS for s in _commands(app)[name][0].alignatt_knobs.sources}
    for model in models:
        for field, info in model.model_fields.items():
            assert info.description, f"{model.__name__}.{field} has no description"
        for source in (s for name in NOT_FIELDS for s in _commands(app)[name][0].alignatt_knobs.sources
                       if s.model is model):
            for field in source.fields():
                knob_type(model, field)  # TypeError for a field no command line can give


def test_eval_tail_noise_options_are_tail_noise_fields():
    from alignatt.evaluate.tails import TAIL_NOISE_KNOBS, TailNoise

    callback, command = _commands(app)["eval"]
    params = {p.name: p for p in command.params}
    for name, field in TAIL_NOISE_KNOBS.items():
        assert name in callback.alignatt_knobs.own
        expected, _ = knob_option(TailNoise, field, names=[name])
        assert params[name].default == expected.default == TailNoise.model_fields[field].default
        assert params[name].help == TailNoise.model_fields[field].description
        assert params[name].opts == [f"--{name.replace('_', '-')}"]


def test_eval_keeps_its_documented_option_names(monkeypatch, tmp_path):
    """README's --commit-lag and --tail-p-*, the tests' --no-offline: older names of EvalOptions' knobs."""
    from typer.testing import CliRunner

    from alignatt.core.errors import AlignattError
    from alignatt.evaluate import run

    got = {}

    def fake_run_eval(options, out, progress=None):  # noqa: ANN001, ANN202 - the options, then stop
        got["options"] = options
        raise AlignattError("stopped before any model loads")

    monkeypatch.setattr(run, "run_eval", fake_run_eval)
    result = CliRunner().invoke(app, ["eval", "--commit-lag", "1.5", "--no-offline", "--tail-p-wrong", "0.1",
                                      "--tail-noise-seed", "7", "--load-levels", "1,4", "--settle-buffer-tokens",
                                      "2", "--out", str(tmp_path / "eval.json")])
    options = got.get("options")
    assert options is not None, result.output
    assert options.commit_lag_seconds == 1.5 and options.offline_baseline is False
    assert (options.tail_noise.p_wrong, options.tail_noise.seed, options.tail_noise.p_drop) == (0.1, 7, 0.05)
    assert options.load_levels == [1, 4] and options.settle_buffer_tokens == 2


def test_every_profile_of_params_yaml_holds_only_options_its_stage_commands_know():
    from pathlib import Path

    from alignatt.pipeline.doctor import check_stage_options
    from alignatt.pipeline.params import load_params

    params = load_params(Path(__file__).resolve().parents[1] / "params.yaml")
    for profile in params["profiles"]:
        check_stage_options(params, profile)


def test_doctor_takes_the_eval_commands_older_names_and_flat_tail_noise():
    from pathlib import Path

    from alignatt.pipeline.doctor import check_stage_options
    from alignatt.pipeline.params import load_params

    params = load_params(Path(__file__).resolve().parents[1] / "params.yaml")
    params["profiles"]["cpu"]["eval"].update({"commit_lag": 1.0, "offline": False, "tail_p_drop": 0.1,
                                              "tail_noise_seed": 3})
    params["profiles"]["cpu"]["eval_directions"].update({"commit_lag_seconds": 1.0, "settle_buffer_tokens": "none"})
    check_stage_options(params, "cpu")


@pytest.mark.parametrize("section, key, value, said", [
    ("load", "stagger_seconds", 0.05, "unknown profiles.cpu.load option 'stagger_seconds'"),
    ("eval", "tails", "gold,loud", "bad profiles.cpu.eval option tails"),
    ("eval", "tail_p_wrong", 2.0, "bad profiles.cpu.eval option tail_noise.p_wrong"),
])
def test_doctor_names_a_bad_stage_option_in_one_line_before_anything_else(tmp_path, section, key, value, said):
    from pathlib import Path

    import yaml
    from typer.testing import CliRunner

    from alignatt.pipeline.params import load_params

    params = load_params(Path(__file__).resolve().parents[1] / "params.yaml")
    params["profiles"]["cpu"][section][key] = value
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    result = CliRunner().invoke(app, ["doctor", "--params", str(path), "--profile", "cpu"])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {said}"), result.stderr
