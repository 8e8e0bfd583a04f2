"""A kernel trace cut into a step's parts: what `alignatt load --kernel-profile-speakers` records."""

import pytest

from alignatt.serve.step_anatomy import (CAPTURE_FETCH, COPIES, FETCH_RANGE, OTHER, STEP_RANGE, anatomy,
                                         device_peaks, part_of)


def _x(name, ts, dur, cat="kernel"):
    return {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur}


def test_kernel_names_of_the_stack_fall_in_their_parts():
    assert part_of("kernel_unified_attention_3d") == "attention, decode (split-KV)"
    assert part_of("reduce_segments") == "attention, decode (split-KV)"
    assert part_of("kernel_unified_attention_2d") == "attention, prefill or mixed"
    assert part_of("nvjet_tst_128x64_64x4_1x2_h_bz_coopB_TNT") == "GEMM"
    assert part_of("sm90_xmma_gemm_bf16bf16_bf16f32") == "GEMM"
    assert part_of("reshape_and_cache_flash_kernel") == "KV-cache write"
    assert part_of("void at::native::index_put_kernel_impl<...>") == "capture: q writes"
    assert part_of("void at::native::reduce_kernel<ArgMaxOps<float>>") == "sampling"
    assert part_of("triton_poi_fused_rms_norm_0") == OTHER


def test_a_window_of_two_steps_is_cut_into_parts_idle_time_and_its_roofline():
    events = [
        _x(STEP_RANGE, 0, 1000, "user_annotation"), _x(STEP_RANGE, 1500, 1000, "user_annotation"),
        _x(STEP_RANGE, 100, 600, "gpu_user_annotation"),  # a range's GPU twin: not a step of its own
        _x("nvjet_gemm", 100, 400), _x("kernel_unified_attention_3d", 500, 200),
        _x("nvjet_gemm", 1600, 400), _x("kernel_unified_attention_2d", 2000, 100),
        _x("Memcpy DtoH (Device -> Pinned)", 2100, 50, "gpu_memcpy"),
        _x(FETCH_RANGE, 2200, 100, "gpu_user_annotation"), _x("index_select_kernel", 2210, 50),
        _x("index_select_kernel", 2350, 20),  # between two fetch ranges: not the capture's
        _x(FETCH_RANGE, 2400, 40, "gpu_user_annotation"), _x("index_select_kernel", 2405, 10),
        _x("nvjet_gemm", 2450, 100),  # runs past the window's end: only its part inside counts
        _x("nvjet_gemm", 9000, 100),  # after the window: not counted
    ]
    a = anatomy(events, {"prefill": 200, "decode": 40}, weight_bytes=8_000_000_000,
                peak_bandwidth_gbs=4800.0, peak_tflops=989.0, active_params=4_000_000_000)
    assert a["steps"] == 2 and a["window_s"] == 0.0025 and a["step_wall_ms"] == 1.0
    parts = a["parts_ms"]
    assert parts["GEMM"] == pytest.approx((400 + 400 + 50) / 2 / 1e3)
    assert parts["attention, decode (split-KV)"] == 0.1 and parts["attention, prefill or mixed"] == 0.05
    assert parts[CAPTURE_FETCH] == 0.03 and parts[COPIES] == 0.025  # by its range, not by its name
    assert parts[OTHER] == 0.01
    busy_us = 400 + 200 + 400 + 100 + 50 + 50 + 50 + 20 + 10
    assert a["gpu_busy_ms"] == pytest.approx(busy_us / 2 / 1e3) and a["idle_ms"] == pytest.approx((2500 - busy_us) / 2 / 1e3)
    assert a["largest_part"] == "GEMM" and a["kernels"]["GEMM"] == 3
    # 2 forwards of 8 GB in 2.5 ms: 6,400 GB/s, past the 4,800 GB/s peak (a synthetic trace)
    assert a["weights_gb_per_s"] == 6400.0 and a["bandwidth_share"] == pytest.approx(6400 / 4800, abs=1e-4)
    assert a["weight_read_floor_ms"] == pytest.approx(8e9 / 4800e9 * 1e3, abs=1e-4)
    assert a["tflops"] == pytest.approx(2 * 4e9 * 240 / 0.0025 / 1e12, abs=1e-3)
    assert a["top_kernels"][0]["name"] == "nvjet_gemm" and a["top_kernels"][0]["calls"] == 3


def test_a_trace_without_a_step_says_so():
    with pytest.raises(ValueError, match="no step was profiled"):
        anatomy([_x("nvjet_gemm", 0, 10)], {}, None, None, None, None)


def test_peaks_come_from_the_device_table_or_not_at_all():
    assert device_peaks("NVIDIA H200") == (4800.0, 989.0)
    assert device_peaks("cpu") == (None, None)


def _on(thread, name, ts, dur, cat):
    return {**_x(name, ts, dur, cat), "pid": 1, "tid": thread}


def test_a_step_is_split_into_host_work_and_waiting_on_the_gpu():
    engine, other = 7, 8
    events = [
        _on(engine, STEP_RANGE, 0, 1000, "user_annotation"), _on(engine, STEP_RANGE, 1500, 1000, "user_annotation"),
        _on(engine, "schedule: allocate_slots", 10, 200, "user_annotation"),
        _on(engine, "gpu_model_runner: forward", 300, 100, "user_annotation"),
        _on(engine, "gpu_model_runner: forward", 1600, 300, "user_annotation"),
        _on(engine, "cudaEventSynchronize", 500, 400, "cuda_runtime"),  # vLLM waits on its output copy
        _on(engine, "cudaStreamSynchronize", 2000, 100, "cuda_runtime"),
        _on(engine, "cudaLaunchKernel", 420, 5, "cuda_runtime"),  # a launch does not wait
        _on(engine, "cudaEventSynchronize", 1100, 300, "cuda_runtime"),  # between steps: the loop's own
        _on(other, "cudaDeviceSynchronize", 0, 900, "cuda_runtime"),  # another thread's wait
        _on(other, "schedule: allocate_slots", 0, 900, "user_annotation"),
        _x("nvjet_gemm", 500, 400),
    ]
    a = anatomy(events, {}, None, None, None, None)
    assert a["gpu_wait_ms"] == pytest.approx((400 + 100) / 2 / 1e3)
    assert a["host_ms"] == pytest.approx((2000 - 500) / 2 / 1e3)
    assert a["host_ms"] + a["gpu_wait_ms"] == pytest.approx(a["step_wall_ms"])
    assert a["between_steps_ms"] == pytest.approx(500 / 2 / 1e3)
    assert a["host_ranges_ms"] == {"gpu_model_runner: forward": 0.2, "schedule: allocate_slots": 0.1}


class _ScopedSeam:
    """A seam with host scopes: its step opens a vLLM-named range only while they are on."""

    def __init__(self):
        self.switched: list[bool] = []

    def host_scopes(self, on):
        self.switched.append(on)

    def run(self):
        from torch.profiler import record_function

        if self.switched and self.switched[-1]:
            with record_function("schedule: stand-in"):
                sum(range(20000))
        return []


def test_a_kernel_window_turns_the_seams_host_scopes_on_for_its_steps_only(tmp_path):
    import json

    from alignatt.serve.engine_profile import KernelWindow

    seam = _ScopedSeam()
    window = KernelWindow(seam)
    window.step(seam.run)  # not armed: no scopes
    assert seam.switched == []
    window.arm(str(tmp_path / "engine0.json"), 2)
    window.step(seam.run), window.step(seam.run)
    assert seam.switched == [True, False]
    written = json.loads((tmp_path / "engine0.json").read_text())
    assert written["host_ranges_ms"]["schedule: stand-in"] > 0 and written["gpu_wait_ms"] == 0
    window.arm(str(tmp_path / "dropped.json"), 5)
    window.step(seam.run), window.arm(None, 0)  # a window dropped mid-way switches them off too
    assert seam.switched == [True, False, True, False] and not (tmp_path / "dropped.json").exists()


def test_the_vllm_seam_switches_vllms_scope_function_and_restores_it(monkeypatch):
    import sys
    import types

    from torch.profiler import record_function

    from alignatt.capture.vllm.seam import VllmCaptureSeam

    utils = types.ModuleType("vllm.v1.utils")
    utils._PROFILER_FUNC = None  # vLLM has not picked one yet
    for name, module in (("vllm", types.ModuleType("vllm")), ("vllm.v1", types.ModuleType("vllm.v1")),
                         ("vllm.v1.utils", utils)):
        monkeypatch.setitem(sys.modules, name, module)
    sys.modules["vllm"].v1, sys.modules["vllm.v1"].utils = sys.modules["vllm.v1"], utils
    seam = VllmCaptureSeam.__new__(VllmCaptureSeam)
    seam._scopes_before = None
    seam.host_scopes(True)
    assert utils._PROFILER_FUNC is record_function
    seam.host_scopes(False)
    assert utils._PROFILER_FUNC is None  # vLLM picks again from its environment
    seam.host_scopes(False)  # off twice: nothing to restore
    assert utils._PROFILER_FUNC is None
