"""Each artifact records its command's options as a typed model (plus what the run measured): a
recorded config of the wrong shape fails to load in one line, the committed artifacts (written
before some fields were recorded) still load, and every knob of a command's options is recorded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from alignatt.core.errors import AlignattError
from alignatt.record.artifacts import (EvalKnobs, EvalRecord, FailoverOptions, LoadKnobs, LoadRecord, ReplicasOptions,
                                       SmokeRecord, SoakRecord, load_artifact, parse_artifact)
from alignatt.record.artifacts.options import SmokeOptions, SoakOptions

ROOT = Path(__file__).resolve().parents[2]
RECORDED = {"server_smoke": SmokeRecord, "soak": SoakRecord, "failover": FailoverOptions,
            "replicas": ReplicasOptions, "load": LoadRecord, "eval": EvalRecord}


def _committed(kind: str) -> list[Path]:
    return [p for p in sorted((ROOT / "outputs").glob("*/*.json"))
            if not p.name.endswith("_metrics.json") and json.loads(p.read_text()).get("kind") == kind]


@pytest.mark.parametrize("kind", sorted(RECORDED))
def test_the_committed_artifacts_load_with_a_typed_config(kind):
    paths = _committed(kind)
    assert paths, f"no committed {kind} artifact to read"
    for path in paths:
        assert type(load_artifact(path).config) is RECORDED[kind], path


@pytest.mark.parametrize("committed, key, value", [
    (lambda: _committed("server_smoke")[0], "replay_speed", "fast"),
    (lambda: ROOT / "outputs" / "cpu" / "eval.json", "bootstrap", "many"),
], ids=["server_smoke", "eval"])
def test_a_recorded_config_of_the_wrong_type_fails_to_load_in_one_line(tmp_path, committed, key, value):
    data = json.loads(committed().read_text())
    data["config"][key] = value
    bad = tmp_path / f"{data['kind']}.json"
    bad.write_text(json.dumps(data))
    with pytest.raises(AlignattError) as e:
        load_artifact(bad)
    assert "\n" not in str(e.value) and f"{data['kind']}.config.{key}" in str(e.value)


def test_an_unknown_recorded_key_fails_too(tmp_path):
    data = json.loads(_committed("failover")[0].read_text())
    data["config"]["speakerz"] = 4  # a typo is not kept silently
    with pytest.raises(Exception, match="speakerz"):
        parse_artifact(data)


def test_a_smoke_recorded_before_its_options_were_kept_whole_loads():
    """Before: the engine's heads under `heads`, `wlk_latency` None when its client did not run,
    and no `speed`, `client` or `vllm_mode`: the heads move to `engine_heads`, the rest read as defaults."""
    data = json.loads(_committed("server_smoke")[0].read_text())
    old = {k: v for k, v in data["config"].items() if k not in ("speed", "client", "vllm_mode")}
    old.update(heads=[[11, 3], [6, 5]], wlk_latency=None)
    record = SmokeRecord.model_validate(old)
    assert record.engine_heads == [(11, 3), (6, 5)] and record.heads is None
    assert record.wlk_latency == "balanced" and record.speed is None and record.client == "auto"


def test_a_load_recorded_before_its_knobs_were_kept_whole_loads():
    """Before: the engine's heads under `heads`, per-configuration engine facts under `engines`, the
    labels joined under `vllm_mode`, the model's preset under `preset`."""
    # the H200 load stage's run of 33f3b17, kept unchanged: written before (the CPU one is re-measured
    # with each change)
    data = json.loads((ROOT / "outputs" / "h200" / "load_h200_33f3b17.json").read_text())
    record = LoadRecord.model_validate(data["config"])
    assert isinstance(data["config"]["heads"], list) and record.heads is None
    assert record.engine_heads == [tuple(h) for h in data["config"]["heads"]]
    assert isinstance(data["config"]["preset"], dict) and record.preset == "balanced"
    assert record.configurations_label == (",".join(m for m in data["config"]["vllm_modes"] if m) or None)


def test_the_load_options_add_only_their_configurations_to_what_is_recorded():
    """LoadOptions (measure/) = LoadKnobs (recorded) + the typed configurations, which a load artifact
    records by label (`vllm_modes`)."""
    from alignatt.measure.capacity import LoadOptions

    assert issubclass(LoadOptions, LoadKnobs) and issubclass(LoadRecord, LoadKnobs)
    assert set(LoadOptions.model_fields) - set(LoadRecord.model_fields) == {"configurations"}


def test_an_eval_recorded_before_its_knobs_were_kept_whole_loads():
    """Before: the resolved settle under `settle_buffer_tokens`, the option under
    `settle_buffer_tokens_option`, each row tail's model under `tails` (the H200 eval of 69972d8);
    neither settle nor tails in the oldest (every draft whole, the gold tail alone)."""
    data = json.loads((ROOT / "tests" / "golden" / "eval_before_whole_talks.json").read_text())["config"]
    record = EvalRecord.model_validate(data)
    assert (record.settle_buffer_tokens, record.scored_settle_buffer_tokens) == (
        data["settle_buffer_tokens_option"], data["settle_buffer_tokens"])
    assert list(record.tail_descriptions) == list(data["tails"]) and record.tails == list(data["tails"])
    assert record.tail_descriptions["noisy"].tail_noise.p_wrong == data["tails"]["noisy"]["tail_noise"]["p_wrong"]
    # the long form of then, in chunks of pairs: read as the artifact says
    assert (record.pairs_per_talk, record.longform_talks) == (data["pairs_per_talk"], data["longform_talks"])
    oldest = json.loads((ROOT / "outputs" / "h200" / "eval_e4b_synthetic.json").read_text())["config"]
    assert not {"tails", "settle_buffer_tokens"} & set(oldest)
    record = EvalRecord.model_validate(oldest)
    assert record.tails == ["gold"] and record.tail_descriptions is None
    assert record.settle_buffer_tokens == "none" and record.settle_of(record.variants[0]) is None


def test_the_eval_options_declare_no_knob_the_record_lacks():
    """EvalOptions (evaluate/) = EvalKnobs (recorded) + checks that need serve/ and evaluate/."""
    from alignatt.evaluate.run import EvalOptions

    assert issubclass(EvalOptions, EvalKnobs) and issubclass(EvalRecord, EvalKnobs)
    assert set(EvalOptions.model_fields) - set(EvalRecord.model_fields) == set()
    assert set(EvalOptions.model_fields) == set(EvalKnobs.model_fields)


@pytest.mark.parametrize("options, record", [(SmokeOptions, SmokeRecord), (SoakOptions, SoakRecord),
                                             (LoadKnobs, LoadRecord), (EvalKnobs, EvalRecord)])
def test_every_knob_of_a_command_is_recorded(options, record):
    """The record model derives from the options model: a knob added there is recorded, typed alike."""
    assert issubclass(record, options)
    for name, field in options.model_fields.items():
        assert record.model_fields[name].annotation == field.annotation, name
