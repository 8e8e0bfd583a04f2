"""The capacity section finds the served default's rows by configuration: a label is read back into
the configuration it names (measure/load_configurations.py), so any label that names the served
default marks its rows, and one that differs in any field does not."""

from __future__ import annotations

from pathlib import Path

from alignatt.record.artifacts import load_artifact
from alignatt.report.inputs import ReportInputs

ROOT = Path(__file__).resolve().parents[2]
TARGETS = {"report": {"capacity_targets": [{"speakers": 1, "rtt_p50_ms": 40}, {"speakers": 128, "rtt_p95_ms": 600}]}}


def relabelled(old: str, new: str):
    """The H200 load stage's run of 33f3b17 (kept unchanged, run on params.yaml as it was) with one
    configuration's label written otherwise."""
    load = load_artifact(ROOT / "outputs" / "h200" / "load_h200_33f3b17.json")
    levels = [lv.model_copy(update={"vllm_mode": new if lv.vllm_mode == old else lv.vllm_mode}) for lv in load.levels]
    return load.model_copy(update={"levels": levels})


def inputs_of(load) -> ReportInputs:
    return ReportInputs(root=ROOT, params=TARGETS, published=[], runs={}, smokes=[], envs=[], measurements=[],
                        by_kind={"load": [("outputs/h200/load.json", load)]})


def served_rows(load) -> set[str]:
    from alignatt.report.capacity import capacity_targets

    return {r["configuration"].split(", ")[0].split(" ")[-1] for r in capacity_targets(inputs_of(load)) if r["served"]}


def test_the_committed_run_marks_the_served_default_and_not_whole_drafts():
    assert served_rows(relabelled("", "")) == {"fullgraph+settle2+process"}


def test_a_label_naming_the_served_default_otherwise_still_marks_its_rows():
    from alignatt.report.capacity import rtt_against_speakers
    from alignatt.report.headline import headline

    load = relabelled("fullgraph+settle2+process", "fullgraph+process+settle2")  # its flags in another order
    assert served_rows(load) == {"fullgraph+process+settle2"}
    (figure,) = rtt_against_speakers(inputs_of(load))
    assert "served default: vLLM capture, full CUDA graphs, settled 2 tokens after a hold, own engine process" in figure.svg
    items = {i["what"]: i["result"] for i in headline(inputs_of(load))}
    assert items["Served configuration"].endswith("(`fullgraph+settle2+process`)")
    assert "partial-draft RTT p50" in items["One speaker's round trip"]


def test_a_label_that_differs_in_one_field_is_not_the_served_default():
    from alignatt.report.headline import headline

    load = relabelled("fullgraph+settle2+process", "fullgraph+settle4+process")
    assert served_rows(load) == set()
    items = {i["what"]: i["result"] for i in headline(inputs_of(load))}
    assert items["Served configuration"] == ("the served default (`fullgraph+settle2+process`), not measured in "
                                             "`outputs/h200/load.json`")


def test_a_row_run_with_changed_parameters_says_so():
    """`dvc exp run -S` beyond the profile measures what params.yaml does not ask for: the row names it."""
    from alignatt.report.capacity import capacity_rows

    load = relabelled("", "")
    assert not any("run with `-S" in r["configuration"] for r in capacity_rows(inputs_of(load)))
    changed = load.provenance.model_copy(update={"params_changed": {"profile": "h200",
                                                                    "profiles.h200.load.speakers": "128"}})
    rows = capacity_rows(inputs_of(load.model_copy(update={"provenance": changed})))
    assert rows and all(r["configuration"].endswith(
        "run with `-S profiles.h200.load.speakers=128` (not params.yaml's)") for r in rows)


def test_a_later_configuration_is_judged_only_where_it_ran_and_the_first_everywhere():
    from alignatt.report.capacity import capacity_targets

    load = relabelled("", "")
    inputs = ReportInputs(root=ROOT, params={"report": {"capacity_targets": [{"speakers": 96, "rtt_p95_ms": 300},
                                                                             {"speakers": 128, "rtt_p95_ms": 300}]}},
                          published=[], runs={}, smokes=[], envs=[], measurements=[],
                          by_kind={"load": [("outputs/h200/load.json", load)]})
    rows = [(r["speakers"], r["served"], r["verdict"]) for r in capacity_targets(inputs)]
    assert rows == [(96, True, "—"), (128, True, "missed"), (128, False, "missed")]


def test_the_step_bandwidth_target_is_judged_with_what_keeps_the_step_from_it():
    import pytest

    from alignatt.core.errors import AlignattError
    from alignatt.report.step_anatomy import IDLE, bandwidth_verdicts

    anatomy = load_artifact(ROOT / "outputs" / "h200" / "load_step_anatomy.json")

    def verdicts(target):
        return bandwidth_verdicts(ReportInputs(
            root=ROOT, params={"report": {"step_bandwidth_target": target}}, published=[], runs={}, smokes=[],
            envs=[], measurements=[], by_kind={"load": [("outputs/h200/load_step_anatomy.json", anatomy)]}))

    (line,) = verdicts({"speakers": 128, "share": 0.5})
    s = next(iter(next(lv for lv in anatomy.levels if lv.speakers == 128).step_anatomy.values()))
    assert "**missed**" in line and f"{s.bandwidth_share:.1%} of the peak" in line
    assert f"may take {s.weight_read_floor_ms / 0.5:.2f} ms" in line
    assert line.split("idle time: ")[1].startswith(f"{IDLE} {s.idle_ms:.2f}")  # the largest part first
    assert (f"worked {s.host_ms:.2f} ms a step on the host and waited {s.gpu_wait_ms:.2f} ms on the GPU: the host "
            "sets the step" in line) and "event loop used" in line
    (met,) = verdicts({"speakers": 128, "share": 0.1})
    assert "**met**" in met
    assert verdicts({"speakers": 64, "share": 0.5}) == []  # no level profiled there
    with pytest.raises(AlignattError, match="step_bandwidth_target"):
        verdicts({"speakers": 128, "share": 50})


def test_an_untraced_level_is_judged_on_its_own_steps_with_its_traced_twins_weights():
    """Untraced steps run at full speed: the target is judged on them too, with the weights a traced
    level of the same model and configuration recorded; a configuration with no traced twin (FP8
    weights stream other bytes) and a card the peak table lacks get no line."""
    from alignatt.report.step_anatomy import bandwidth_verdicts

    anatomy = load_artifact(ROOT / "outputs" / "h200" / "load_step_anatomy.json")
    untraced = load_artifact(ROOT / "outputs" / "h200" / "load_128_8427e92.json")
    served = next(lv for lv in untraced.levels if lv.vllm_mode == "fullgraph+settle2+process")
    weights = next(iter(anatomy.levels[0].step_anatomy.values())).weight_bytes

    def verdicts(*loads):
        return bandwidth_verdicts(ReportInputs(
            root=ROOT, params={"report": {"step_bandwidth_target": {"speakers": 128, "share": 0.3}}}, published=[],
            runs={}, smokes=[], envs=[], measurements=[],
            by_kind={"load": [(f"outputs/h200/{i}.json", a) for i, a in enumerate(loads)]}))

    lines = verdicts(anatomy, untraced)
    (line,) = [x for x in lines if "untraced" in x]
    step = served.engines[0].step_ms_mean
    assert "fullgraph+settle2+process, 128 speakers" in line and f"a step took {step:.2f} ms" in line
    assert f"**met**, {weights / step / 1e6 / 3350:.1%} of the peak" in line  # the H100's 3350 GB/s
    assert not any("untraced" in x for x in verdicts(untraced))  # no traced twin: no weights to count
    elsewhere = untraced.provenance.model_copy(update={"gpus": [untraced.provenance.gpus[0].model_copy(
        update={"name": "NVIDIA A10"})]})
    assert not any("untraced" in x for x in verdicts(anatomy, untraced.model_copy(update={"provenance": elsewhere})))


def test_the_prefix_cache_table_gives_per_draft_tokens_by_region_and_dashes_for_older_runs():
    from alignatt.report.capacity import prefix_cache_rows

    anatomy = load_artifact(ROOT / "outputs" / "h200" / "load_step_anatomy.json")

    def described_as(**fields):
        d = {k: v for k, v in anatomy.config.seam_describe.items()
             if k not in ("prompt_drafts", "kv_cache_tokens", "uncached_prompt_tokens")} | fields
        return anatomy.model_copy(update={"config": anatomy.config.model_copy(update={"seam_describe": d})})

    newer = described_as(prompt_tokens=1000, cached_prompt_tokens=800, prompt_drafts=4,
                         kv_cache_tokens={"0": 70000, "1": 65536},
                         uncached_prompt_tokens={"before the source": 0, "source": 60, "after the source": 40,
                                                 "target prefix": 100})

    def rows(artifact):
        return prefix_cache_rows(ReportInputs(root=ROOT, params={}, published=[], runs={}, smokes=[], envs=[],
                                              measurements=[],
                                              by_kind={"load": [("outputs/h200/load_step_anatomy.json", artifact)]}))

    (row,) = rows(newer)
    assert (row["drafts"], row["prompt"], row["served"], row["computed"]) == (4, "250.0", "80.0%", "50.0")
    assert row["regions"] == "0.0 / 15.0 / 10.0 / 25.0" and row["kv_tokens"] == "65,536"
    (older,) = rows(described_as(prompt_tokens=1000, cached_prompt_tokens=878))  # recorded before the split
    assert older["served"] == "87.8%" and older["computed"] == older["regions"] == older["kv_tokens"] == "—"


def test_the_figure_labels_each_bound_once_and_marks_every_target_even_where_not_measured():
    from alignatt.report.capacity import rtt_against_speakers

    targets = [{"speakers": 1, "rtt_p50_ms": 15}] + [{"speakers": n, "rtt_p95_ms": 300} for n in (64, 96, 128, 256)]
    inputs = ReportInputs(root=ROOT, params={"report": {"capacity_targets": targets}}, published=[], runs={},
                          smokes=[], envs=[], measurements=[],
                          by_kind={"load": [("outputs/h200/load.json", relabelled("", ""))]})
    import re

    (figure,) = rtt_against_speakers(inputs)
    texts = re.findall(r"<text[^>]*>([^<]*)</text>", figure.svg)
    assert texts.count("target ≤ 300 ms") == 1 and texts.count("target ≤ 15 ms") == 1
    p95 = texts[texts.index("partial-draft RTT p50 (ms)") + 1:]  # the second panel's texts
    assert [t for t in p95 if t in {"1", "64", "96", "128", "256"}][:5] == ["1", "64", "96", "128", "256"]


def test_the_figure_draws_no_solid_line_across_an_unmeasured_target_level():
    from alignatt.report.capacity import solid_pieces

    targets = {1, 64, 96, 128, 192, 256}
    assert solid_pieces([1, 256], targets) == []  # 64 .. 192 lie between, unmeasured
    assert solid_pieces([1, 64, 96, 128, 256], targets) == [(0, 3)]  # 192 breaks the last piece
    assert solid_pieces([1, 2, 4], set()) == [(0, 2)]  # no targets: one line
    assert solid_pieces([128], targets) == []


def test_steps_traced_without_a_gpu_are_drawn_apart_from_the_gpu_steps():
    """A CPU-traced step is hundreds of times a GPU step: on one axis the GPU bars would not show."""
    from alignatt.report.step_anatomy import step_anatomy_figure

    on_gpu = load_artifact(ROOT / "outputs" / "h200" / "load_step_anatomy.json")
    on_cpu = load_artifact(ROOT / "outputs" / "cpu" / "load_step_anatomy.json")
    inputs = ReportInputs(root=ROOT, params={}, published=[], runs={}, smokes=[], envs=[], measurements=[],
                          by_kind={"load": [("outputs/cpu/load_step_anatomy.json", on_cpu),
                                            ("outputs/h200/load_step_anatomy.json", on_gpu)]})
    gpu, cpu = step_anatomy_figure(inputs)
    assert (gpu.name, cpu.name) == ("step_anatomy", "step_anatomy_cpu")
    assert "128 speakers" in gpu.svg and "default+process" not in gpu.svg
    traced_on = {s.device for lv in on_gpu.levels for s in (lv.step_anatomy or {}).values()}
    assert traced_on and all(f"{device.removeprefix('NVIDIA ')}, fullgraph" in gpu.svg
                                   for device in traced_on)  # the card in the label
    assert "default+process, 1 speaker, engine 0: engine thread" in cpu.svg and "fullgraph" not in cpu.svg
    assert "GPU idle" not in cpu.svg  # no GPU bar where there was no GPU


def test_a_level_the_stage_run_lacks_is_judged_on_a_sibling_run_of_the_same_commit_and_card_only():
    from alignatt.report.capacity import capacity_targets

    load = relabelled("", "")
    served = next(lv.vllm_mode for lv in load.levels if lv.speakers == 128)
    stage = load.model_copy(update={"levels": [lv for lv in load.levels if lv.speakers != 128]})
    sibling = load.model_copy(update={"levels": [lv for lv in load.levels if lv.speakers == 128 and lv.vllm_mode == served]})
    other_commit = sibling.model_copy(update={"provenance": sibling.provenance.model_copy(update={"git_commit": "0" * 40})})

    def verdicts(*beside):
        inputs = ReportInputs(root=ROOT, params={"report": {"capacity_targets": [{"speakers": 128, "rtt_p95_ms": 300}]}},
                              published=[], runs={}, smokes=[], envs=[], measurements=[],
                              by_kind={"load": [("outputs/h200/load.json", stage), *beside]})
        return [(r["verdict"], r["measured"].split(";")[0]) for r in capacity_targets(inputs) if r["served"]]

    assert verdicts() == [("—", "not measured")]
    assert verdicts(("outputs/h200/load_128.json", sibling)) == [("missed", "in `outputs/h200/load_128.json`")]
    assert verdicts(("outputs/h200/load_128.json", other_commit)) == [("—", "not measured")]
    assert verdicts(("outputs/cpu/load_128.json", sibling)) == [("—", "not measured")]  # another folder


def test_the_one_speaker_target_is_set_against_the_weights_read_floor_of_a_mean_draft():
    """A mean draft's forward steps × one read of the traced twin's weights at the card's peak: above
    a p50 bound, the line says so; a run with no traced twin, or not the load stage's, says nothing."""
    from alignatt.report.step_anatomy import drafting_floors

    anatomy = load_artifact(ROOT / "outputs" / "h200" / "load_step_anatomy.json")
    stage = load_artifact(ROOT / "outputs" / "h200" / "load.json")
    [alone] = [lv for lv in stage.levels if lv.speakers == 1]
    weights = next(iter(anatomy.levels[0].step_anatomy.values())).weight_bytes

    def floors(bound, loads):
        return drafting_floors(ReportInputs(
            root=ROOT, params={"report": {"capacity_targets": [{"speakers": 1, "rtt_p50_ms": bound},
                                                               {"speakers": 256, "rtt_p95_ms": 300}]}},
            published=[], runs={}, smokes=[], envs=[], measurements=[], by_kind={"load": loads}))

    floor = alone.verification.forward_steps_per_draft * weights / 3350 / 1e6  # the H100's 3350 GB/s
    [line] = floors(15, [("outputs/h200/load.json", stage), ("outputs/h200/anatomy.json", anatomy)])
    assert f"at least **{floor:.1f} ms**, **above** the target's p50 of 15 ms" in line
    assert f"on an H200, {floor * 3350 / 4800:.1f} ms" in line
    [line] = floors(40, [("outputs/h200/load.json", stage), ("outputs/h200/anatomy.json", anatomy)])
    assert "within the target's p50 of 40 ms" in line
    assert floors(15, [("outputs/h200/load.json", stage)]) == []  # no traced twin: no weights to count
    assert floors(15, [("outputs/h200/load_1.json", stage), ("outputs/h200/anatomy.json", anatomy)]) == []
