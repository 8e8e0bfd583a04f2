"""Model presets and loading: tiny random Gemma-4, the embedded Gemma-3-270M, offline errors."""

import sys

import pytest
import torch

from alignatt.core.errors import AlignattError
from alignatt.models import embedded
from alignatt.models import presets as models
from alignatt.models.presets import MODEL_PRESETS, load_model


def test_presets_are_the_documented_four():
    assert set(MODEL_PRESETS) == {"gemma3-270m", "tiny-gemma4", "gemma4-e4b", "gemma4-e4b-synthetic"}
    assert MODEL_PRESETS["gemma4-e4b"].model_id == "google/gemma-4-E4B-it"


def test_unknown_model_is_a_clear_error():
    with pytest.raises(AlignattError, match="unknown model 'nope'.*gemma3-270m"):
        load_model("nope")


def test_cuda_device_without_cuda_is_a_clear_error():
    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    with pytest.raises(AlignattError, match="CUDA is not available"):
        load_model("tiny-gemma4", device="cuda")


def test_bad_dtype_is_a_clear_error():
    with pytest.raises(AlignattError, match="unknown dtype"):
        load_model("tiny-gemma4", dtype="int3", reuse=False)


def test_tiny_gemma4_is_deterministic_and_fits_its_tokenizer(tiny_gemma4):
    again = load_model("tiny-gemma4", reuse=False)
    for (name, a), (_, b) in zip(tiny_gemma4.model.state_dict().items(), again.model.state_dict().items()):
        assert torch.equal(a, b), name
    config = tiny_gemma4.model.config
    assert config.vocab_size == len(tiny_gemma4.tokenizer)
    assert tiny_gemma4.synthetic_weights
    assert config.num_kv_shared_layers > 0
    assert tiny_gemma4.stop_token_ids == sorted(
        {tiny_gemma4.tokenizer.eos_token_id, tiny_gemma4.tokenizer.convert_tokens_to_ids("<end_of_turn>")}
    )
    # the shared fixture is the process-wide copy
    assert load_model("tiny-gemma4") is tiny_gemma4


def test_local_pretrained_model_absent_is_a_clear_error():
    with pytest.raises(AlignattError, match="not available locally"):
        models._load_pretrained("alignatt-tests/definitely-not-cached", torch.float32)


def test_missing_embedded_package_tells_how_to_install(tmp_path, monkeypatch):
    monkeypatch.setenv("ALIGNATT_CACHE", str(tmp_path))
    monkeypatch.setitem(sys.modules, embedded.EMBEDDED_PACKAGE, None)  # import fails
    with pytest.raises(AlignattError, match=r"pip install 'alignatt\[embedded\]'"):
        load_model("gemma3-270m", reuse=False)
    assert not (tmp_path / "models" / "gemma3-270m").exists()  # no half-written cache left behind


def test_cache_dir_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("ALIGNATT_CACHE", str(tmp_path))
    assert embedded.embedded_model_dir() == tmp_path / "models" / "gemma3-270m"


@pytest.mark.slow
def test_embedded_gemma3_loads_from_the_cache(gemma3_270m):
    assert gemma3_270m.layout.family == "gemma3_text"
    assert not gemma3_270m.synthetic_weights
    assert embedded._cache_stamp(embedded.embedded_model_dir()) == embedded.EMBEDDED_CACHE_STAMP
    assert 1 in gemma3_270m.stop_token_ids and 106 in gemma3_270m.stop_token_ids  # <eos>, <end_of_turn>
    assert gemma3_270m.model.config.num_hidden_layers == 18


@pytest.mark.slow
def test_embedded_gemma3_is_a_real_language_model(gemma3_270m):
    """With the right tokenizer the base model predicts English text well (random would not)."""
    tok, model = gemma3_270m.tokenizer, gemma3_270m.model
    ids = tok("The quick brown fox jumps over the lazy dog.", return_tensors="pt")["input_ids"]
    with torch.inference_mode():
        loss = float(model(input_ids=ids, labels=ids).loss)
    assert loss < 4.0, loss


@pytest.mark.gpu
def test_synthetic_e4b_builds_on_cuda():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    loaded = load_model("gemma4-e4b-synthetic", device="cuda")
    assert loaded.synthetic_weights and loaded.dtype == "bfloat16"
    assert loaded.layout.n_layers == 42
    assert next(loaded.model.parameters()).device.type == "cuda"
