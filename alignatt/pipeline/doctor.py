"""`alignatt doctor`: which seams of a params profile can run on this machine, and what the others miss.

It looks, without loading any model, for what each seam of the profile needs: CUDA (a `cuda`
profile, and vLLM always), vLLM at the pinned version, the transformers pin vLLM's Gemma-4 code
needs, a Gemma tokenizer (the synthetic E4B borrows the embedded package's), and the weights (the
embedded package, the HF cache, a local checkpoint; random-weight presets need only their
config). The env stage runs it first, so a GPU host that lacks a piece fails in seconds with the
missing piece named, instead of after a long bench stage of skips. Exit 1 when a seam the profile
expects to run cannot run here (`profiles.<name>.expect_skipped` lists the seams that may not).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
from pathlib import Path
from typing import Callable

from pydantic import BaseModel, ConfigDict, Field, computed_field

from alignatt.capture.names import PINNED_VLLM, VLLM_CAPTURE
from alignatt.models.presets import E4B_HF_ID, MODEL_PRESETS
from alignatt.record.provenance import NOT_INSTALLED, package_version

PINNED_TRANSFORMERS = "5.13.1"  # from 5.14 on, Gemma4TextConfig.head_dim raises inside vLLM 0.22.1
VLLM_MODELS = tuple(name for name, preset in MODEL_PRESETS.items() if preset.vllm)


class SeamReadiness(BaseModel):
    model_config = ConfigDict(extra="forbid")

    seam: str
    expected_to_run: bool  # False: listed in the profile's expect_skipped
    missing: list[str] = Field(default_factory=list)  # empty: it can run here

    @computed_field
    @property
    def can_run(self) -> bool:
        return not self.missing


class Diagnosis(BaseModel):
    model_config = ConfigDict(extra="forbid")

    profile: str
    model: str
    device: str
    seams: list[SeamReadiness]

    @computed_field
    @property
    def ok(self) -> bool:
        return all(s.can_run for s in self.seams if s.expected_to_run)

    def as_text(self) -> str:
        lines = [f"profile {self.profile}: model {self.model} on {self.device}"]
        for s in self.seams:
            if s.can_run:
                state = "can run here"
            else:
                state = ("MISSING " if s.expected_to_run else "expected to skip: ") + "; ".join(s.missing)
            lines.append(f"  {s.seam:<13} {state}")
        blocked = [s.seam for s in self.seams if s.expected_to_run and not s.can_run]
        lines.append(f"doctor: {'ok' if not blocked else 'cannot run ' + ', '.join(blocked)}")
        return "\n".join(lines)


# ---- the pieces ------------------------------------------------------------------------------


def _hf_hub() -> Path:
    return Path(os.environ.get("HF_HUB_CACHE") or Path(
        os.environ.get("HF_HOME", Path.home() / ".cache" / "huggingface")) / "hub")


def _hf_snapshots(repo_id: str) -> list[Path]:
    root = _hf_hub() / f"models--{repo_id.replace('/', '--')}" / "snapshots"
    return sorted(p for p in root.glob("*") if p.is_dir()) if root.is_dir() else []


def _has_tokenizer(folder: Path) -> bool:
    return (folder / "tokenizer.json").exists() or (folder / "tokenizer.model").exists()


def _has_weights(folder: Path) -> bool:
    return (folder / "config.json").exists() and any(folder.glob("*.safetensors"))


def _embedded_package() -> bool:
    from alignatt.models.embedded import EMBEDDED_PACKAGE

    return importlib.util.find_spec(EMBEDDED_PACKAGE) is not None


def _embedded_tokenizer_cached() -> bool:
    """The folders `embedded_tokenizer` reads before it needs the package (ALIGNATT_CACHE)."""
    from alignatt.models.embedded import EMBEDDED_CACHE_STAMP, _cache_stamp, cache_dir, embedded_model_dir

    converted = embedded_model_dir()
    if (converted / "config.json").exists() and _cache_stamp(converted) == EMBEDDED_CACHE_STAMP:
        return True
    return _cache_stamp(cache_dir() / "tokenizers" / "gemma3") == EMBEDDED_CACHE_STAMP


def tokenizer_gap(model: str) -> str | None:
    """None when the model's tokenizer is available offline; else what is missing."""
    from alignatt.models.embedded import EMBEDDED_INSTALL_HINT, cache_dir

    source = MODEL_PRESETS[model].source if model in MODEL_PRESETS else None
    if source == "tiny_random":
        return None  # built in memory
    if source == "embedded_gguf":
        ok = _embedded_package() or _embedded_tokenizer_cached()
        return None if ok else f"tokenizer: the embedded package ({EMBEDDED_INSTALL_HINT})"
    if source == "random_config":  # borrows a Gemma tokenizer (models.presets.synthetic_tokenizer)
        if any(_has_tokenizer(s) for s in _hf_snapshots(E4B_HF_ID)):
            return None
        if _embedded_package() or _embedded_tokenizer_cached():
            return None
        return (f"tokenizer: a Gemma tokenizer ({E4B_HF_ID} in the HF cache, the embedded package "
                f"({EMBEDDED_INSTALL_HINT}), or its tokenizer under {cache_dir()}/tokenizers/gemma3)")
    if source == "pretrained":
        model_id = MODEL_PRESETS[model].model_id
        return None if any(_has_tokenizer(s) for s in _hf_snapshots(model_id)) else (
            f"tokenizer: {model_id} is not in the HF cache ({_hf_hub()})")
    path = Path(model)
    if path.is_dir():
        return None if _has_tokenizer(path) else f"tokenizer: no tokenizer.json in {path}"
    return f"tokenizer: {model!r} is neither a preset nor a local checkpoint directory"


def weights_gap(model: str) -> str | None:
    from alignatt.models.embedded import EMBEDDED_INSTALL_HINT, embedded_model_dir

    source = MODEL_PRESETS[model].source if model in MODEL_PRESETS else None
    if source in ("tiny_random", "random_config"):
        return None  # random weights from a packaged config
    if source == "embedded_gguf":
        ok = _embedded_package() or (embedded_model_dir() / "config.json").exists()
        return None if ok else f"weights: the embedded package ({EMBEDDED_INSTALL_HINT})"
    if source == "pretrained":
        model_id = MODEL_PRESETS[model].model_id
        return None if any(_has_weights(s) for s in _hf_snapshots(model_id)) else (
            f"weights: {model_id} is not in the HF cache ({_hf_hub()}); alignatt never downloads")
    path = Path(model)
    if path.is_dir():
        return None if _has_weights(path) else f"weights: no config.json + *.safetensors in {path}"
    return f"weights: {model!r} is neither a preset nor a local checkpoint directory"


def cuda_gap() -> str | None:
    try:
        import torch
    except ImportError:
        return "CUDA: torch is not installed"
    if torch.cuda.is_available():
        return None
    build = torch.version.cuda
    return f"CUDA: not available here (torch {torch.__version__}, " + (
        f"built for CUDA {build})" if build else "a CPU-only build)")


def vllm_gap() -> str | None:
    version = package_version("vllm")
    if version == NOT_INSTALLED:
        return f"vLLM {PINNED_VLLM}: not installed (pip install 'alignatt[vllm]')"
    if version != PINNED_VLLM and not os.environ.get("ALIGNATT_VLLM_ANY_VERSION"):
        return f"vLLM {PINNED_VLLM}: found {version} (vllm_capture uses that version's internals)"
    return None


def transformers_gap() -> str | None:
    version = package_version("transformers")
    if version != PINNED_TRANSFORMERS:
        return (f"transformers {PINNED_TRANSFORMERS}: found {version} (vLLM {PINNED_VLLM}'s Gemma-4 code "
                "breaks from 5.14 on; put the pinned one first on PYTHONPATH)")
    return None


# ---- per seam --------------------------------------------------------------------------------


def seam_gaps(seam: str, model: str, device: str) -> list[str]:
    gaps = []
    if seam == VLLM_CAPTURE:
        gaps += [cuda_gap(), vllm_gap(), transformers_gap()]
        if model not in VLLM_MODELS and not Path(model).is_dir():
            gaps.append(f"model: vllm_capture runs Gemma-4 only ({', '.join(VLLM_MODELS)} or a local one), "
                        f"not {model!r}")
    elif device.startswith("cuda"):
        gaps.append(cuda_gap())
    gaps += [tokenizer_gap(model), weights_gap(model)]
    return [g for g in gaps if g]


def stage_sections() -> dict[str, tuple[type, Callable[..., dict]]]:
    """Each stage section of a profile: the options model of the command that reads it (`alignatt
    smoke|load|eval|speech-e2e --profile`) and how its flat knobs fold into that model's fields."""
    from alignatt.evaluate.run import EvalOptions
    from alignatt.evaluate.tails import fold_tail_noise
    from alignatt.measure.capacity import LoadOptions
    from alignatt.measure.smoke import SmokeOptions
    from alignatt.record.artifacts.speech import SpeechE2EOptions

    return {"smoke": (SmokeOptions, dict), "load": (LoadOptions, dict), "load_speech": (LoadOptions, dict),
            "load_anatomy": (LoadOptions, dict), "eval": (EvalOptions, fold_tail_noise),
            "eval_directions": (EvalOptions, fold_tail_noise), "speech_e2e": (SpeechE2EOptions, dict)}


def check_stage_options(params: dict, profile: str | None = None) -> None:
    """Every stage section of the profile is its command's options (what `alignatt doctor` checks
    in the env stage, before anything is measured), validated as the command validates its own:
    AlignattError, one line, naming a key no field knows or the first bad value."""
    from alignatt.pipeline.params import profile_of, section_fields

    name, prof = profile_of(params, profile)
    for section, (model, fold) in stage_sections().items():
        section_fields(model, name, prof, section, fold)


def diagnose(params_path: str | Path = "params.yaml", profile: str | None = None) -> Diagnosis:
    from alignatt.pipeline.params import load_params, profile_of, profile_seams

    params = load_params(params_path)
    name, prof = profile_of(params, profile)
    check_stage_options(params, name)  # a stage section with a key its command does not know fails here
    seams = [
        SeamReadiness(seam=s, expected_to_run=s not in prof.expect_skipped,
                      missing=seam_gaps(s, prof.model, prof.device))
        for s in profile_seams(params, name)
    ]
    return Diagnosis(profile=name, model=prof.model, device=prof.device, seams=seams)
