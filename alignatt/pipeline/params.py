"""params.yaml: the pipeline's knobs, hardware profiles, and the options of each stage.

`profile:` selects one of `profiles:` (model, device, dtype, protocol overrides, a section of
options per stage command); `bench:` holds the published protocol and `modes:` (one DVC stage per
vLLM mode, with the seams it measures). `config_from_params` turns them into the `BenchConfig` of
one stage; `stage_options` turns a profile's `smoke:`, `load:` (and `load_speech:`, `load_anatomy:`),
`eval:`, `eval_directions:` or `speech_e2e:` section into its command's options model, the command's
own flags over it. Every stage command reads params.yaml itself (`--profile`): dvc.yaml splices no
options into command lines.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Mapping

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from alignatt.record.artifacts import KNOWN_SEAMS, BenchConfig
from alignatt.core.errors import AlignattError
from alignatt.core.options import flat_fields, one_line
from alignatt.models.presets import DEFAULT_MODEL


class Profile(BaseModel):
    """A hardware profile of params.yaml: which model runs where, and protocol overrides."""

    model_config = ConfigDict(extra="forbid")

    model: str
    device: str = "cpu"
    dtype: str | None = None
    bench: dict[str, Any] = Field(default_factory=dict)  # overrides of the `bench:` section
    # Each stage section is a partial of its command's options model, its keys that model's knobs
    # (`stage_options`; `alignatt doctor` validates them all in the env stage, pipeline/doctor.py
    # STAGE_SECTIONS). Kept as mappings here: this module imports no command's model, so the bench
    # stages do not depend on the server's code.
    smoke: dict[str, Any] = Field(default_factory=dict)  # SmokeOptions of `alignatt smoke --profile`
    load: dict[str, Any] = Field(default_factory=dict)  # LoadOptions of `alignatt load --profile`
    # LoadOptions of `alignatt load --profile P --section load_speech`: capacity on a recognised stream
    load_speech: dict[str, Any] = Field(default_factory=dict)
    # LoadOptions of `alignatt load --profile P --section load_anatomy`: one level traced step by step
    # (the GPU step's anatomy), apart from the load stage's levels, whose latency the tracing would slow
    load_anatomy: dict[str, Any] = Field(default_factory=dict)
    eval: dict[str, Any] = Field(default_factory=dict)  # EvalOptions of `alignatt eval --profile` (en-de)
    # EvalOptions of the eval-direction stages (en-it, en-zh, cs-en: `alignatt eval --profile P --test-set <d>`)
    eval_directions: dict[str, Any] = Field(default_factory=dict)
    # SpeechE2EOptions of `alignatt speech-e2e --profile`: WhisperLiveKit's own server in front of ours
    speech_e2e: dict[str, Any] = Field(default_factory=dict)
    note: str = ""  # why the profile deviates from the protocol, shown in the methodology
    # seams that cannot run on this profile's machine by design (vllm_capture on a CPU): their
    # skip is expected; a bench stage where every *other* seam was skipped fails
    expect_skipped: list[str] = Field(default_factory=list)
    # GPU test children run side by side (alignatt test-gpu --lanes): engine starts are CPU-bound
    gpu_lanes: int = Field(1, ge=1, le=8)


class BenchParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    max_new_tokens: int = 20
    heads_k: int = 8
    warmup: int = 1
    repeats: int = 3
    prompts: str | None = None
    policy: dict[str, int] = Field(default_factory=dict)
    modes: dict[str, list[str]]  # vLLM mode -> seams measured in that stage


def load_params(path: str | Path = "params.yaml") -> dict[str, Any]:
    import yaml

    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise AlignattError(f"{path}: no such params file") from None
    except yaml.YAMLError as e:
        raise AlignattError(f"{path}: not valid YAML ({e})") from None
    if not isinstance(data, dict):
        raise AlignattError(f"{path}: expected a mapping at the top level")
    return data


def profile_of(params: dict[str, Any], profile: str | None = None) -> tuple[str, Profile]:
    name = profile or params.get("profile")
    profiles = params.get("profiles") or {}
    if name not in profiles:
        raise AlignattError(f"unknown profile {name!r}: params define {', '.join(profiles) or 'none'}")
    try:
        return name, Profile.model_validate(profiles[name])
    except ValidationError as e:
        raise AlignattError(f"profile {name!r} in params: {e}") from None


def config_from_params(
    params: dict[str, Any], mode: str, profile: str | None = None, **overrides: Any
) -> BenchConfig:
    """The bench config of one stage (`bench@<mode>`): `bench:` + the profile's overrides."""
    name, prof = profile_of(params, profile)
    try:
        section = BenchParams.model_validate({**params.get("bench", {}), **prof.bench})
    except ValidationError as e:
        raise AlignattError(f"bench params: {e}") from None
    if mode not in section.modes:
        raise AlignattError(f"unknown bench mode {mode!r}: params define {', '.join(section.modes)}")
    fields = {
        "profile": name,
        "model": prof.model,
        "device": prof.device,
        "dtype": prof.dtype,
        "seams": section.modes[mode],
        "vllm_mode": mode,
        "max_new_tokens": section.max_new_tokens,
        "heads_k": section.heads_k,
        "warmup": section.warmup,
        "repeats": section.repeats,
        "prompts_file": section.prompts,
        "policy": section.policy,
        "expect_skipped": [s for s in prof.expect_skipped if s in section.modes[mode]],
    }
    fields.update({k: v for k, v in overrides.items() if v is not None})
    try:
        return BenchConfig.model_validate(fields)
    except ValidationError as e:
        raise AlignattError(f"bench config: {e}") from None


def profile_seams(params: dict[str, Any], profile: str | None = None) -> list[str]:
    """Every seam some bench stage of the profile measures, in the order of `bench.modes`."""
    name, prof = profile_of(params, profile)
    try:
        section = BenchParams.model_validate({**params.get("bench", {}), **prof.bench})
    except ValidationError as e:
        raise AlignattError(f"bench params: {e}") from None
    return list(dict.fromkeys(s for seams in section.modes.values() for s in seams))


def bench_config(
    params_path: str | Path | None, mode: str = "eager", profile: str | None = None, **overrides: Any
) -> BenchConfig:
    """The config of one run: from params.yaml when there is one, else the built-in defaults."""
    if params_path is not None and Path(params_path).exists():
        return config_from_params(load_params(params_path), mode, profile, **overrides)
    if params_path is not None and profile is not None:
        raise AlignattError(f"--profile {profile} needs a params file; {params_path} does not exist")
    fields = {"model": DEFAULT_MODEL, "seams": list(KNOWN_SEAMS), "vllm_mode": mode}
    fields.update({k: v for k, v in overrides.items() if v is not None})
    try:
        return BenchConfig.model_validate(fields)
    except ValidationError as e:
        raise AlignattError(f"bench config: {e}") from None


# ---- a stage command's options: its profile section, the command's flags over it ---------------

# the profile keys that are a command's options
STAGE_SECTIONS = ("smoke", "load", "load_speech", "load_anatomy", "eval", "eval_directions", "speech_e2e")
# the sections `alignatt load --section` reads
LOAD_SECTIONS = ("load", "load_speech", "load_anatomy")


def section_knobs(prof: Profile, section: str) -> dict[str, Any]:
    """The flat knobs a profile gives a stage command: its model, device and dtype, then the
    section's own keys over them (h200's `eval:` scores other weights than the profile's model)."""
    if section not in STAGE_SECTIONS:
        raise AlignattError(f"no stage section {section!r} in a profile: {', '.join(STAGE_SECTIONS)}")
    return {"model": prof.model, "device": prof.device, "dtype": prof.dtype, **getattr(prof, section)}


def section_fields(
    model: type[BaseModel], name: str, prof: Profile, section: str, fold: Callable[..., dict] = dict
) -> dict[str, Any]:
    """The fields the profile's section sets, validated as `model` (what `alignatt doctor` checks
    for every section, and a stage command for its own): AlignattError, one line, naming a key no
    field knows or the first bad value as `profiles.<name>.<section> option`. `fold`: flat knobs
    that are a nested field's (eval's `tail_p_wrong` -> `tail_noise.p_wrong`) into that field."""
    where = f"profiles.{name}.{section} option"
    fields = flat_fields(model, fold(section_knobs(prof, section)), where)
    try:
        model.model_validate(fields)
    except ValidationError as e:
        raise AlignattError(one_line(e, f"bad {where} ")) from None
    return fields


def _over(base: dict[str, Any], given: dict[str, Any]) -> dict[str, Any]:
    """`given` over `base`; a nested model's fields (eval's tail_noise) one by one."""
    out = dict(base)
    for key, value in given.items():
        below = out.get(key)
        out[key] = {**below, **value} if isinstance(below, dict) and isinstance(value, dict) else value
    return out


def stage_options(
    model: type[BaseModel],
    section: str,
    given: Mapping[str, Any],
    params_path: str | Path = "params.yaml",
    profile: str | None = None,
    prefix: str = "",
    fold: Callable[..., dict] = dict,
) -> BaseModel:
    """A stage command's options: with `profile`, that profile's `section` of `params_path` (and
    its model, device, dtype) with the `given` flags over it; without, the flags alone. A bad
    section is named by its place in params (`section_fields`); a bad flag is one line after
    `prefix`, as the command says it without a profile."""
    base: dict[str, Any] = {}
    if profile is not None:
        name, prof = profile_of(load_params(params_path), profile)
        base = section_fields(model, name, prof, section, fold)
    try:
        return model.model_validate(_over(base, flat_fields(model, fold(given), prefix.strip() or "option")))
    except ValidationError as e:
        raise AlignattError(one_line(e, prefix)) from None
