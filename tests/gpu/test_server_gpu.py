"""The MT server on a GPU: the E4B architecture through the vLLM capture seam (skipped without CUDA).

Run on the GPU host:  pytest tests/gpu/test_server_gpu.py -m gpu -q -s
"""

import pytest

pytest.importorskip("torch")
from tests.gpu_marks import GPU_SERVER  # noqa: E402 - after the torch check

pytestmark = GPU_SERVER


@pytest.mark.parametrize("seam", ["vllm_capture", "hf_qk_fast"])
def test_two_sentences_on_the_e4b_architecture(tmp_path, seam):
    if seam == "vllm_capture":
        pytest.importorskip("vllm")
    from alignatt.replay.stream import load_stream
    from alignatt.measure.smoke import SmokeOptions, run_smoke, summary_line

    short = tmp_path / "stream.json"
    short.write_text(load_stream().first_sentences(2).model_dump_json())
    a = run_smoke(
        SmokeOptions(model="gemma4-e4b-synthetic", seam=seam, device="cuda", speed=1.0,
                     client="native", stream=str(short)),
        tmp_path / "smoke.json",
    )
    print(summary_line(a))
    assert a.finals == 2 and a.retractions == 0
    assert a.fast_path_events and all(e.engine_calls == 0 for e in a.fast_path_events)
    assert a.rtt_ms_p50 is not None
