"""Scored = served: the load benchmark's served-default configuration is what `alignatt serve` builds."""

from __future__ import annotations

import pytest

from alignatt.core.errors import AlignattError
from alignatt.measure.load_configurations import is_served_default, served_default, served_default_label
from alignatt.pipeline.params import load_params
from alignatt.serve.config import server_config
from alignatt.serve.pool import served_route


def test_the_served_default_is_what_serve_builds_on_cuda():
    cfg = server_config(seam="vllm_capture", device="cuda", model="gemma4-e4b-synthetic")
    route = served_route(cfg.directions["en-de"])
    served = served_default()
    assert served.vllm_mode == route.seam_options["vllm_mode"]
    assert served.settle_buffer_tokens == cfg.settle_buffer_tokens == 2
    assert served.own_process is cfg.replicas.own_process is True
    # the label every committed artifact and the page name it by
    assert served_default_label() == "fullgraph+settle2+process"
    # and the server it stands for is the one serve builds, in what a load run changes
    built = served.server_config(cfg.directions["en-de"])
    assert (built.settle_buffer_tokens, built.replicas.own_process) == (2, True)
    assert served_route(built.directions["en-de"]).seam_options == route.seam_options


def test_the_served_row_is_found_by_configuration_not_by_its_text():
    assert is_served_default("fullgraph+settle2+process")
    assert is_served_default(" fullgraph + settle2 + process ")  # spaced, as a hand-written label may be
    assert not is_served_default("fullgraph+settle2+process+verify") and not is_served_default("fullgraph+process")
    assert not is_served_default(None) and not is_served_default("fullgraph+settle4+process")


def test_the_served_row_depends_on_the_route_a_run_measured():
    # `alignatt serve` on CPU (hf_qk_fast, the bare default) drafts whole in the server's process: a
    # CPU load run's unlabelled configuration is what it serves, and the CUDA default's label is not
    assert is_served_default(None, "hf_qk_fast", "cpu")
    assert not is_served_default("fullgraph+settle2+process", "hf_qk_fast", "cpu")
    assert is_served_default("fullgraph+settle2+process", "vllm_capture", "cuda:1")
    # on CUDA only vllm_capture settles by default and has its engine in a process of its own
    assert is_served_default(None, "hf_qk_fast", "cuda") and not is_served_default(None, "vllm_capture", "cuda")


def test_whole_drafts_stay_one_option_away_and_cpu_routes_draft_whole():
    assert server_config(seam="vllm_capture", device="cuda", settle_buffer_tokens="none").settle_buffer_tokens is None
    assert server_config(seam="vllm_capture", device="cuda", settle_buffer_tokens="4").settle_buffer_tokens == 4
    assert server_config(seam="hf_eager", device="cpu").settle_buffer_tokens is None
    with pytest.raises(AlignattError, match="auto, none or a number"):
        server_config(settle_buffer_tokens="two")


def test_the_gpu_profile_measures_the_served_default_on_a_stream_of_two_minutes_or_more():
    from alignatt.core.options import validate_flat
    from alignatt.measure.capacity import LoadOptions

    load = load_params()["profiles"]["h200"]["load"]
    options = validate_flat(LoadOptions, {"device": "cuda", **load}, "profiles.h200.load option")
    assert options.runs()[0] == served_default() and len(options.runs()) >= 2
    assert options.runs()[1] == served_default().model_copy(update={"settle_buffer_tokens": None})
    assert load["streams"] == "long"
    from alignatt.measure.capacity import resolve_streams
    from alignatt.replay.stream import asr_events

    (_, stream), = resolve_streams(["long"])
    assert asr_events(stream)[-1].t >= 120  # seconds of speech: "steady" needs room to grow
