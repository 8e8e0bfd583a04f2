"""params.yaml: the pipeline's knobs, hardware profiles, and the bench config of each stage.

`profile:` selects one of `profiles:` (model, device, dtype, protocol overrides, smoke options);
`bench:` holds the published protocol and `modes:` (one DVC stage per vLLM mode, with the seams
it measures). `config_from_params` turns them into the `BenchConfig` of one stage.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from alignatt.record.artifacts import KNOWN_SEAMS, BenchConfig
from alignatt.core.errors import AlignattError
from alignatt.models.presets import DEFAULT_MODEL


class Profile(BaseModel):
    """A hardware profile of params.yaml: which model runs where, and protocol overrides."""

    model_config = ConfigDict(extra="forbid")

    model: str
    device: str = "cpu"
    dtype: str | None = None
    bench: dict[str, Any] = Field(default_factory=dict)  # overrides of the `bench:` section
    smoke: dict[str, Any] = Field(default_factory=dict)  # options of the smoke stage
    load: dict[str, Any] = Field(default_factory=dict)  # options of the load stage (`alignatt load`)
    eval: dict[str, Any] = Field(default_factory=dict)  # options of the eval stage (`alignatt eval` flags)
    # options of the eval-direction stages (en-it, en-zh, cs-en: `alignatt eval --test-set <direction>`)
    eval_directions: dict[str, Any] = Field(default_factory=dict)
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
