"""Scored = served: the load benchmark's served-default configuration is what `alignatt serve` builds."""

from __future__ import annotations

import pytest

from alignatt.core.errors import AlignattError
from alignatt.measure.load_configurations import (OWN_PROCESS_FLAG, configuration_settle, label_flags,
                                                  parse_configuration, served_default_label)
from alignatt.pipeline.params import load_params
from alignatt.serve.config import server_config
from alignatt.serve.pool import served_route


def test_the_served_default_label_is_what_serve_builds_on_cuda():
    cfg = server_config(seam="vllm_capture", device="cuda", model="gemma4-e4b-synthetic")
    route = served_route(cfg.directions["en-de"])
    label = served_default_label()
    mode, _ = parse_configuration(label)
    assert mode == route.seam_options["vllm_mode"]
    assert configuration_settle(label) == cfg.settle_buffer_tokens == 2
    assert (OWN_PROCESS_FLAG in label_flags(label)) == cfg.replicas.own_process is True


def test_whole_drafts_stay_one_option_away_and_cpu_routes_draft_whole():
    assert server_config(seam="vllm_capture", device="cuda", settle_buffer_tokens="none").settle_buffer_tokens is None
    assert server_config(seam="vllm_capture", device="cuda", settle_buffer_tokens="4").settle_buffer_tokens == 4
    assert server_config(seam="hf_eager", device="cpu").settle_buffer_tokens is None
    with pytest.raises(AlignattError, match="auto, none or a number"):
        server_config(settle_buffer_tokens="two")


def test_the_gpu_profile_measures_the_served_default_on_a_stream_of_two_minutes_or_more():
    load = load_params()["profiles"]["h200"]["load"]
    labels = [label.strip() for label in load["vllm_mode"].split(",")]
    assert served_default_label() in labels and len(labels) >= 2
    assert load["streams"] == "long"
    from alignatt.measure.capacity import resolve_streams
    from alignatt.replay.stream import asr_events

    (_, stream), = resolve_streams(["long"])
    assert asr_events(stream)[-1].t >= 120  # seconds of speech: "steady" needs room to grow
