"""Fuzzing the frame parser (hypothesis, strategies from the protocol models): it answers every
input with a frame or a `ProtocolError` whose error frame is sendable, nothing else."""

import json
import os

import pytest
from hypothesis import HealthCheck, given, settings

from alignatt.serve.protocol import InitFrame, InitOk, ProtocolError, Tail, UpdateFrame, override_policy_fields, parse_frame
from tests.support.fuzz_frames import FIELD_STRATEGIES, any_frame, expensive_frame

# Bounded time in CI: ALIGNATT_FUZZ_SCALE multiplies the example counts (default 1).
SCALE = float(os.environ.get("ALIGNATT_FUZZ_SCALE", "1"))
settings.register_profile(
    "alignatt-fuzz", deadline=None, derandomize=False, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)
FUZZ = settings.get_profile("alignatt-fuzz")


@pytest.mark.parametrize("model", [InitFrame, UpdateFrame, Tail])
def test_the_strategies_cover_every_field_of_the_protocol_models(model):
    assert set(FIELD_STRATEGIES[model]) == set(model.model_fields)


def _all_text(value):
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _all_text(k)
            yield from _all_text(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _all_text(v)


@settings(FUZZ, max_examples=int(1000 * SCALE))
@given(raw=any_frame)
def test_the_parser_answers_every_input(raw):
    try:
        frame = parse_frame(raw, 64 * 1024)
    except ProtocolError as e:
        text = e.frame().to_json()
        decoded = json.loads(text.encode("utf-8"))
        assert decoded["type"] == "error" and decoded["code"] and decoded["message"]
        return
    assert isinstance(frame, (InitFrame, UpdateFrame))
    for text in _all_text(frame.model_dump()):
        text.encode("utf-8")  # no lone surrogate survives parsing
    if isinstance(frame, UpdateFrame):
        for w in frame.words + frame.tail_words:
            assert not any(c.isspace() for c in w.strip())
    else:
        try:
            _, unknown = override_policy_fields(frame.overrides)
        except ProtocolError as e:
            e.frame().to_json().encode("utf-8")
            return
        ok = InitOk(direction=frame.direction, preset="balanced", model="m", unknown_overrides=unknown,
                    ignored_fields=frame.unknown_fields())
        json.loads(ok.to_json().encode("utf-8"))


@settings(FUZZ, max_examples=int(40 * SCALE))
@given(raw=expensive_frame)
def test_expensive_frames_are_refused_cheaply_with_a_short_message(raw):
    import time

    started = time.perf_counter()
    try:
        frame = parse_frame(raw, 256 * 1024)
    except ProtocolError as e:
        assert len(e.frame().to_json()) < 700
    else:  # the 250 kB prefix is a well-formed frame: the server's token bound refuses it (and,
        assert isinstance(frame, InitFrame)  # before init, the 64 KiB pre-init frame bound)
    # A bound loose enough for a loaded CI machine; the nested frames cost 90-140 ms before the value bound.
    assert time.perf_counter() - started < 0.05
    with pytest.raises(ProtocolError):
        parse_frame(raw, 64 * 1024)  # max_init_frame_bytes
