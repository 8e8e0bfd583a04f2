"""`alignatt doctor`: what each seam of a profile needs, found without loading a model."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from alignatt.cli import app
from alignatt.pipeline import doctor

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def bare_machine(monkeypatch, tmp_path):
    """No embedded package, empty alignatt and HF caches: nothing to tokenize with."""
    monkeypatch.setattr(doctor, "_embedded_package", lambda: False)
    monkeypatch.setenv("ALIGNATT_CACHE", str(tmp_path / "alignatt-cache"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    return tmp_path


def test_cpu_profile_of_the_repo_is_ready_here_and_expects_the_vllm_skip():
    d = doctor.diagnose(ROOT / "params.yaml", "cpu")
    seams = {s.seam: s for s in d.seams}
    assert list(seams) == ["hf_eager", "hf_qk_fast", "vllm_capture"]
    assert seams["hf_eager"].can_run and seams["hf_qk_fast"].can_run  # the embedded package is installed
    assert not seams["vllm_capture"].expected_to_run
    assert d.ok


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="this machine has CUDA")
def test_gpu_profile_on_this_cpu_says_what_is_missing():
    d = doctor.diagnose(ROOT / "params.yaml", "h200")
    assert not d.ok
    for s in d.seams:
        assert s.expected_to_run and any(m.startswith("CUDA: not available here") for m in s.missing)
    vllm = next(s for s in d.seams if s.seam == "vllm_capture")
    if doctor.package_version("vllm") == doctor.NOT_INSTALLED:
        assert any("vLLM 0.22.1: not installed" in m for m in vllm.missing)
    r = CliRunner().invoke(app, ["doctor", "--params", str(ROOT / "params.yaml"), "--profile", "h200"])
    assert r.exit_code == 1 and r.output.splitlines()[-1].startswith("doctor: cannot run hf_eager")
    r = CliRunner().invoke(app, ["doctor", "--params", str(ROOT / "params.yaml"), "--profile", "h200", "--json"])
    data = __import__("json").loads(r.output)
    assert r.exit_code == 1 and data["ok"] is False and data["seams"][0]["can_run"] is False


def test_synthetic_e4b_needs_a_gemma_tokenizer(bare_machine):
    gap = doctor.tokenizer_gap("gemma4-e4b-synthetic")
    assert gap and "a Gemma tokenizer" in gap and "tokenizers/gemma3" in gap
    assert doctor.weights_gap("gemma4-e4b-synthetic") is None  # random weights from its config
    # the carried tokenizer alone (ALIGNATT_CACHE/tokenizers/gemma3 with the cache stamp) is enough
    from alignatt.models.embedded import _STAMP_FILE, EMBEDDED_CACHE_STAMP

    carried = bare_machine / "alignatt-cache" / "tokenizers" / "gemma3"
    carried.mkdir(parents=True)
    (carried / _STAMP_FILE).write_text(EMBEDDED_CACHE_STAMP + "\n")
    assert doctor.tokenizer_gap("gemma4-e4b-synthetic") is None


def test_real_checkpoint_in_the_hf_cache_gives_tokenizer_and_weights(bare_machine):
    assert "not in the HF cache" in doctor.tokenizer_gap("gemma4-e4b")
    assert "never downloads" in doctor.weights_gap("gemma4-e4b")
    snap = bare_machine / "hub" / "models--google--gemma-4-E4B-it" / "snapshots" / ("a" * 40)
    snap.mkdir(parents=True)
    for name in ("tokenizer.json", "config.json", "model.safetensors"):
        (snap / name).write_text("{}")
    assert doctor.tokenizer_gap("gemma4-e4b") is None and doctor.weights_gap("gemma4-e4b") is None
    assert doctor.tokenizer_gap("gemma4-e4b-synthetic") is None  # the real tokenizer serves it too


def test_version_pins(monkeypatch):
    monkeypatch.setattr(doctor, "package_version", lambda name: {"vllm": "0.23.0", "transformers": "5.17.0"}[name])
    monkeypatch.delenv("ALIGNATT_VLLM_ANY_VERSION", raising=False)
    assert "found 0.23.0" in doctor.vllm_gap()
    assert "found 5.17.0" in doctor.transformers_gap()
    monkeypatch.setattr(doctor, "package_version", lambda name: {"vllm": "0.22.1", "transformers": "5.13.1"}[name])
    assert doctor.vllm_gap() is None and doctor.transformers_gap() is None


def test_an_expected_seam_that_cannot_run_fails_and_an_expected_skip_does_not(bare_machine, tmp_path):
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    d = doctor.diagnose(path, "cpu")  # no embedded package: the HF seams cannot tokenize
    assert not d.ok and "MISSING tokenizer: the embedded package" in d.as_text()
    params["profiles"]["cpu"]["expect_skipped"] = ["hf_eager", "hf_qk_fast", "vllm_capture"]
    path.write_text(yaml.safe_dump(params))
    assert doctor.diagnose(path, "cpu").ok
