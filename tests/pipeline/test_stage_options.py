"""A stage command's options come from its params profile (`--profile`), its own flags over them.

dvc.yaml passes `--profile ${profile}` and nothing else of the profile: the command reads the
profile's model, device, dtype and its section (`smoke:`, `load:`, `eval:`, `eval_directions:`),
validates them as its options model, and a flag given on the command line wins. A key the model
does not know is one line, exit 2, before anything loads.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from alignatt.cli import app
from alignatt.core.errors import AlignattError

ROOT = Path(__file__).resolve().parents[2]

PARAMS = {
    "profile": "t",
    "profiles": {
        "t": {
            "model": "gemma3-270m", "device": "cpu", "dtype": "float32",
            "smoke": {"speed": 3.0, "client": "native"},
            "load": {"speakers": "1,3", "streams": "smoke", "stagger": 0.5},  # `stagger`: an older name of stagger_s
            "eval": {"limit": 2, "purpose": "scorer_smoke", "tails": "gold,none", "tail_p_wrong": 0.2},
            "eval_directions": {"limit": 1, "presets": "balanced", "model": "tiny-gemma4"},
        },
    },
}


@pytest.fixture
def params(tmp_path):
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(PARAMS))
    return path


def _options(monkeypatch, tmp_path, module: str, runner: str, argv: list[str]):  # noqa: ANN202
    """The options model the command would run with: its runner is stopped before any model loads."""
    import importlib

    got = {}

    def stop(options, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        got["options"] = options
        raise AlignattError("stopped before any model loads")

    monkeypatch.setattr(importlib.import_module(module), runner, stop)
    result = CliRunner().invoke(app, [*argv, "--out", str(tmp_path / "out.json")])
    assert "options" in got, result.output
    return got["options"]


def test_a_profile_value_reaches_the_smoke_options_and_a_flag_overrides_it(monkeypatch, tmp_path, params):
    smoke = _options(monkeypatch, tmp_path, "alignatt.measure.smoke", "run_smoke",
                     ["smoke", "--profile", "t", "--params", str(params)])
    assert (smoke.model, smoke.device, smoke.dtype, smoke.speed, smoke.client) == (
        "gemma3-270m", "cpu", "float32", 3.0, "native")
    flagged = _options(monkeypatch, tmp_path, "alignatt.measure.smoke", "run_smoke",
                       ["smoke", "--profile", "t", "--params", str(params), "--speed", "8", "--dtype", "bfloat16"])
    assert (flagged.speed, flagged.dtype, flagged.client) == (8.0, "bfloat16", "native")


def test_without_a_profile_the_flags_alone_give_the_options(monkeypatch, tmp_path, params):
    smoke = _options(monkeypatch, tmp_path, "alignatt.measure.smoke", "run_smoke", ["smoke", "--params", str(params)])
    assert (smoke.speed, smoke.client, smoke.dtype) == (None, "auto", None)  # SmokeOptions' defaults


def test_load_takes_its_section_under_older_names_and_its_flags_over_them(monkeypatch, tmp_path, params):
    load = _options(monkeypatch, tmp_path, "alignatt.measure.capacity", "run_load",
                    ["load", "--profile", "t", "--params", str(params)])
    assert (load.speakers, load.streams, load.stagger_s, load.dtype) == ([1, 3], ["smoke"], 0.5, "float32")
    flagged = _options(monkeypatch, tmp_path, "alignatt.measure.capacity", "run_load",
                       ["load", "--profile", "t", "--params", str(params), "--stagger-s", "0.1", "--speakers", "2"])
    assert (flagged.speakers, flagged.stagger_s, flagged.streams) == ([2], 0.1, ["smoke"])


def test_one_level_may_be_a_yaml_number_and_a_bad_one_is_one_line(tmp_path):
    """`speakers: 128` (what `dvc exp run -S ...speakers=128` writes) is one level, not a traceback."""
    one = yaml.safe_load(yaml.safe_dump(PARAMS))
    one["profiles"]["t"]["load"]["speakers"] = 128
    path = tmp_path / "one.yaml"
    path.write_text(yaml.safe_dump(one))
    from alignatt.measure.capacity import LoadOptions
    from alignatt.pipeline.params import stage_options

    assert stage_options(LoadOptions, "load", {}, path, profile="t").speakers == [128]
    one["profiles"]["t"]["load"]["speakers"] = {"a": 1}
    path.write_text(yaml.safe_dump(one))
    result = CliRunner().invoke(app, ["load", "--profile", "t", "--params", str(path)])
    assert result.exit_code == 2 and result.stderr.startswith("error: bad profiles.t.load option speakers:"), \
        result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_eval_reads_its_section_and_with_a_test_set_the_directions_section(monkeypatch, tmp_path, params):
    run = ("alignatt.evaluate.run", "run_eval")
    en_de = _options(monkeypatch, tmp_path, *run, ["eval", "--profile", "t", "--params", str(params)])
    assert (en_de.limit, en_de.purpose, en_de.tails, en_de.model) == (2, "scorer_smoke", ["gold", "none"], "gemma3-270m")
    assert en_de.tail_noise.p_wrong == 0.2  # a flat tail-noise knob of the section, folded as the flag is
    # a flag over the profile, the nested tail noise field by field: the section's p_wrong stays
    flagged = _options(monkeypatch, tmp_path, *run, ["eval", "--profile", "t", "--params", str(params),
                                                     "--limit", "5", "--tail-noise-seed", "7"])
    assert (flagged.limit, flagged.tail_noise.seed, flagged.tail_noise.p_wrong) == (5, 7, 0.2)
    direction = _options(monkeypatch, tmp_path, *run, ["eval", "--profile", "t", "--params", str(params),
                                                       "--test-set", "cs-en"])
    # the section's model overrides the profile's; its device and dtype are the profile's
    assert (direction.test_set, direction.limit, direction.presets, direction.model, direction.dtype) == (
        "cs-en", 1, ["balanced"], "tiny-gemma4", "float32")


@pytest.mark.parametrize("command, section, key", [
    ("smoke", "smoke", "speeed"), ("load", "load", "stagger_seconds"), ("eval", "eval", "limitt"),
])
def test_a_key_its_options_do_not_know_fails_in_one_line(tmp_path, command, section, key):
    bad = yaml.safe_load(yaml.safe_dump(PARAMS))
    bad["profiles"]["t"][section][key] = 1
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(bad))
    out = tmp_path / "out.json"
    result = CliRunner().invoke(app, [command, "--profile", "t", "--params", str(path), "--out", str(out)])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert lines == [f"error: unknown profiles.t.{section} option {key!r}: "
                     f"{ {'smoke': 'SmokeOptions', 'load': 'LoadOptions', 'eval': 'EvalOptions'}[section]} "
                     "has no such field"], result.stderr
    assert not out.exists()


def test_a_bad_value_or_an_unknown_profile_is_one_line(tmp_path, params):
    bad = yaml.safe_load(yaml.safe_dump(PARAMS))
    bad["profiles"]["t"]["smoke"]["speed"] = -1
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(bad))
    result = CliRunner().invoke(app, ["smoke", "--profile", "t", "--params", str(path)])
    assert result.exit_code == 2 and result.stderr.startswith("error: bad profiles.t.smoke option speed:"), result.stderr
    result = CliRunner().invoke(app, ["load", "--profile", "nope", "--params", str(params)])
    assert result.exit_code == 2 and result.stderr.strip() == "error: unknown profile 'nope': params define t"


def test_env_records_the_profiles_model_unless_one_is_given(monkeypatch, tmp_path, params):
    from alignatt.record import artifacts

    seen = []

    def stop(model):  # noqa: ANN001, ANN202
        seen.append(model)
        raise AlignattError("stopped before the machine is looked at")

    monkeypatch.setattr(artifacts, "fingerprint_artifact", stop)
    for extra in ([], ["--model", "tiny-gemma4"]):
        CliRunner().invoke(app, ["env", "--fingerprint", "--profile", "t", "--params", str(params), *extra,
                                 "--out", str(tmp_path / "fingerprint.json")])
    assert seen == ["gemma3-270m", "tiny-gemma4"]


def test_the_doctor_checks_each_section_with_the_model_its_command_reads():
    """One registry of sections (pipeline/doctor.py), the models the commands build their options from."""
    from alignatt.cli.options import CommandKnobs
    from alignatt.pipeline.doctor import stage_sections
    from alignatt.pipeline.params import STAGE_SECTIONS

    assert tuple(stage_sections()) == STAGE_SECTIONS
    group = {info.name: info.callback for info in app.registered_commands}
    for section, (model, _) in stage_sections().items():
        command = next((c for c in ("eval", "load") if section.startswith(c)), section)  # load_speech: load
        command = command.replace("_", "-")  # speech_e2e: speech-e2e
        knobs: CommandKnobs = group[command].alignatt_knobs
        assert model in {s.model for s in knobs.sources}, (section, command)
        assert {"profile", "params"} <= set(knobs.own), command


# ---- dvc.yaml: stages pass --profile, nothing spliced ------------------------------------------

def _stage_commands() -> list[tuple[str, dict, str]]:
    spec = yaml.safe_load((ROOT / "dvc.yaml").read_text())
    out = []
    for name, stage in spec["stages"].items():
        body = stage.get("do", stage)
        for cmd in body["cmd"] if isinstance(body["cmd"], list) else [body["cmd"]]:
            out.append((name, body, cmd))
    return out


def test_dvc_splices_no_profile_section_into_a_command():
    for name, _, cmd in _stage_commands():
        assert not re.search(r"(?<!\$)\{\w+\}", cmd), f"{name}: {cmd}"  # only DVC's own ${...}


def test_every_measuring_stage_command_passes_its_profile():
    commands = [(n, c) for n, _, c in _stage_commands() if re.search(r"\balignatt (?!report\b)", c)]
    assert {re.search(r"\balignatt ([\w-]+)", c)[1] for _, c in commands} >= {"bench", "smoke", "load", "eval", "env"}
    for name, cmd in commands:
        assert "--profile ${profile}" in cmd, f"{name}: {cmd}"


def test_each_stage_depends_on_the_profile_params_its_command_reads():
    """`dvc status` sees a change in exactly what `--profile` reads: the model, device, dtype and
    the command's section (pipeline/params.py:section_knobs), or the whole profile."""
    for name, body, cmd in _stage_commands():
        command = re.search(r"\balignatt ([\w-]+)", cmd)[1]
        if command not in ("smoke", "load", "eval", "speech-e2e"):
            continue
        section = "eval_directions" if command == "eval" and "--test-set" in cmd else command.replace("-", "_")
        section = re.search(r"--section (\w+)", cmd)[1] if "--section " in cmd else section  # load's load_speech
        params = body["params"]
        if "profiles.${profile}" in params:
            continue
        for key in ("model", "device", "dtype", section):
            assert f"profiles.${{profile}}.{key}" in params, f"{name} reads profiles.<profile>.{key}"
        assert "profile" in params, name


def test_the_repos_profiles_give_every_stage_command_its_options():
    from alignatt.pipeline.doctor import stage_sections
    from alignatt.pipeline.params import stage_options

    for profile in yaml.safe_load((ROOT / "params.yaml").read_text())["profiles"]:
        for section, (model, fold) in stage_sections().items():
            assert isinstance(stage_options(model, section, {}, ROOT / "params.yaml", profile, fold=fold), model)


def test_the_step_anatomy_is_traced_on_a_level_of_its_own_at_the_bandwidth_targets_speakers():
    """A traced level stalls while its trace is written: the load stage's levels stay untraced, and
    load-anatomy traces the level that report.step_bandwidth_target is judged at."""
    from alignatt.measure.capacity import LoadOptions
    from alignatt.pipeline.params import stage_options

    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    for profile in params["profiles"]:
        load = stage_options(LoadOptions, "load", {}, ROOT / "params.yaml", profile)
        anatomy = stage_options(LoadOptions, "load_anatomy", {}, ROOT / "params.yaml", profile)
        assert load.kernel_profile_speakers == [] and anatomy.kernel_profile_speakers == anatomy.speakers, profile
        assert all(c.own_process for c in anatomy.runs()), profile  # the traced engine is a process of its own
    h200 = stage_options(LoadOptions, "load_anatomy", {}, ROOT / "params.yaml", "h200")
    assert h200.speakers == [params["report"]["step_bandwidth_target"]["speakers"]]
    assert h200.capture_cost == "off"  # params' bare `false`, as YAML 1.1 reads it
