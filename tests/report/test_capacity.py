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
    """The committed H200 load stage artifact with one configuration's label written otherwise."""
    load = load_artifact(ROOT / "outputs" / "h200" / "load.json")
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
