"""The Benchmarks document: golden render of a fixed tree, computed notes, staleness check."""

from __future__ import annotations

import json
import re
import os
from pathlib import Path

import jinja2
import pytest
from typer.testing import CliRunner

from alignatt.report import page as report
from alignatt.record.artifacts import ClientSummary, load_artifact, write_artifact
from alignatt.record.events import ReplayEvent
from alignatt.cli import app
from tests.support.report_fixtures import bench_artifact, build_tree, write_run

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "BENCHMARKS.fixture.md"


@pytest.fixture
def tree(tmp_path) -> Path:
    return build_tree(tmp_path / "project")


def test_golden_render(tree):
    text = report.render_report(tree)
    if os.environ.get("UPDATE_GOLDEN"):
        GOLDEN.write_text(text, encoding="utf-8")
    assert text == GOLDEN.read_text(encoding="utf-8"), (
        "the rendered document changed: review it, then UPDATE_GOLDEN=1 pytest tests/report/test_report.py")


def test_render_is_byte_stable(tree):
    assert report.render_report(tree) == report.render_report(tree)


def _row(rows, date, mode, historical=True):
    return next(r for r in rows if r.date == date and r.mode == mode and r.historical == historical)


def test_historical_rows_and_the_corrupt_graphed_run(tree):
    inputs = report.collect_inputs(tree, json.loads(json.dumps(report_params(tree))))
    rows = inputs.rows()
    eager = _row(rows, "2026-07-02", "eager")
    graphed = _row(rows, "2026-07-02", "cudagraph")
    raw_eager = json.loads((tree / "outputs/published/mt_capture_speed_benchmark_eager_20260702.json").read_text())
    raw_graph = json.loads((tree / "outputs/published/mt_capture_speed_benchmark_cudagraph_20260702.json").read_text())
    hf = raw_eager["seams"]["transformers_eager"]["median_per_generated_token_ms"]
    vllm_graph = raw_graph["seams"]["vllm_qk_fast"]["median_per_generated_token_ms"]
    # the graphed artifact has no HF seams: they come from the same day's eager run
    assert graphed.hf_eager == hf and graphed.vllm == vllm_graph
    assert graphed.speedup == pytest.approx(hf / vllm_graph)
    assert len(graphed.sources) == 2 and graphed.conflicts == []
    # corrupt payload, computed from the rows: acceptance texts that differ from the eager run
    expected = sum(
        a["acceptance_text"] != b["acceptance_text"]
        for a, b in zip(
            sorted(raw_graph["seams"]["vllm_qk_fast"]["rows"], key=lambda r: (r["id"], r["repeat_index"])),
            sorted(raw_eager["seams"]["vllm_qk_fast"]["rows"], key=lambda r: (r["id"], r["repeat_index"])),
        )
    )
    assert expected == 19  # the published finding
    assert graphed.corrupt and any(f"{expected} of 48" in n for n in graphed.notes)
    assert not eager.corrupt and eager.speedup == pytest.approx(
        hf / raw_eager["seams"]["vllm_qk_fast"]["median_per_generated_token_ms"])
    undated = _row(rows, "2026-04-20", "not recorded")
    assert undated.machine == "not recorded" and "without a config" in undated.notes[0]


def report_params(tree):
    from alignatt.pipeline.params import load_params

    return load_params(tree / "params.yaml")


def test_our_rows_cpu_skips_and_gpu_graph_agreement(tree):
    rows = report.collect_inputs(tree, report_params(tree)).rows()
    cpu = _row(rows, "2026-12-01", "eager", historical=False)
    assert cpu.machine.startswith("CPU:") and cpu.vllm_status == "skipped" and cpu.speedup is None
    assert cpu.qk_fast_speedup == pytest.approx(cpu.hf_eager / cpu.hf_qk_fast)
    assert any("vllm_capture skipped" in n for n in cpu.notes)
    cpu_graph = _row(rows, "2026-12-01", "cudagraph", historical=False)
    assert (cpu_graph.vllm_status, cpu_graph.hf_eager, len(cpu_graph.sources)) == ("skipped", None, 1)
    gpu = next(r for r in rows if r.machine == "NVIDIA H200" and r.mode == "cudagraph")
    assert gpu.synthetic and "synthetic weights" in gpu.model
    assert not gpu.corrupt and any("0 of 48 emitted texts differ" in n for n in gpu.notes)
    assert gpu.speedup == pytest.approx(gpu.hf_eager / gpu.vllm)


def test_a_graphed_row_measured_apart_from_the_eager_run_shows_no_hf_figures_and_no_speedup(tree):
    """A vLLM mode re-measured on another day than bench@eager: the HF seams (which ran there) are
    not set beside it, so no row mixes two runs; a note names the run they are in."""
    later = bench_artifact("h200", "cudagraph", {"vllm_capture": 0.25}, True, True, date="2026-12-05")
    write_run(tree, "h200", {"cudagraph": later})
    rows = report.collect_inputs(tree, report_params(tree)).rows()
    row = next(r for r in rows if r.machine == "NVIDIA H200" and r.mode == "cudagraph")
    assert row.hf_eager is None and row.speedup is None and not row.conflicts
    assert row.vllm is not None and any("HF seams not shown" in n and "date" in n for n in row.notes)
    assert "HF seams not shown" in report.render_report(tree)  # footnoted in the page


def test_graphed_run_that_diverges_is_marked_corrupt(tree):
    bad = bench_artifact("h200", "cudagraph", {"vllm_capture": 0.25}, True, True, diverge="vllm_capture")
    write_run(tree, "h200", {"cudagraph": bad})
    rows = report.collect_inputs(tree, report_params(tree)).rows()
    row = next(r for r in rows if r.machine == "NVIDIA H200" and r.mode == "cudagraph")
    assert row.corrupt and any("3 of 48" in n for n in row.notes)  # 1 prompt x 3 repeats
    assert "No `cudagraph` row with a measured vLLM figure yet" in report.render_report(tree)


def test_a_busy_machine_is_noted(tree):
    path = tree / "outputs" / "cpu" / "bench_eager.json"
    art = load_artifact(path)
    art.provenance.load_average = (7.4, 6.6, 6.4)  # 5-min 6.6 > 2 cores
    write_artifact(path, art)
    row = _row(report.collect_inputs(tree, report_params(tree)).rows(), "2026-12-01", "eager", historical=False)
    assert any("machine busy" in n and "6.4" in n for n in row.notes)


def test_smoke_section_reads_published_and_ours(tree):
    text = report.render_report(tree)
    assert "fast_path_events: 0" in text and "empty-source update" in text
    assert "| 2026-12-01 | CPU: Test CPU (2 cores) | gemma3-270m | hf_qk_fast | 42 | 6 | 0 | 180.50 | 420.25 | 3 (3) | 0.40 | 0 |" in text


def test_smoke_section_shows_the_buffer_and_its_flicker(tree):
    """From the recorded events of an artifact older than the summary's fields (whole drafts then),
    else from the summary; which drafts a figure is for, and that the other setting was not replayed."""
    assert "No smoke artifact here recorded the buffers it showed." in report.render_report(tree)
    smoke = tree / "outputs" / "cpu" / "server_smoke.json"
    art = load_artifact(smoke)
    events = [  # 2 words erased ("ist", "schön") over 4 + 1 final words; buffers 3, 2, 2, 1 words
        ReplayEvent(client="native", utterance_id=0, final=False, committed_text="", buffer_text=" Das Haus ist"),
        ReplayEvent(client="native", utterance_id=0, final=False, committed_text="Das", buffer_text=" Haus war"),
        ReplayEvent(client="native", utterance_id=0, final=False, committed_text="Das Haus", buffer_text=" war schön"),
        ReplayEvent(client="native", utterance_id=0, final=True, committed_text="Das Haus war gut.", buffer_text=""),
        ReplayEvent(client="native", utterance_id=1, final=False, committed_text="", buffer_text=" Ja"),
        ReplayEvent(client="native", utterance_id=1, final=True, committed_text="Ja.", buffer_text=""),
    ]
    write_artifact(smoke, art.model_copy(update={"events": events, "config": art.config.model_copy(
        update={"headline_client": "native"})}))
    text = report.render_report(tree)
    assert "| 2026-12-01 | CPU: Test CPU (2 cores) | gemma3-270m | whole drafts | 2.00 | 0.40 |" in text
    assert "gemma3-270m on CPU: Test CPU (2 cores): whole drafts only; settled drafts were not replayed" in text
    summary = ClientSummary(
        client="native", updates=4, finals=2, errors=0, disconnects=0, retractions=0, shown_buffer_words_mean=1.25,
        normalized_erasure=0.125, partial_drafts=4, partial_draft_rtt_ms_p50=1.0, partial_draft_rtt_ms_p95=2.0,
        fast_path_events=0, fast_path_releases=0, fast_path_server_ms_p50=None, fast_path_server_ms_p95=None,
        fast_path_engine_calls=0, engine_calls=4, paths={}, wall_s=1.0, max_lag_s=0.0)
    write_artifact(smoke, art.model_copy(update={"events": events, "config": art.config.model_copy(update={
        "headline_client": "native", "settle_buffer_tokens": 2, "summaries": [summary]})}))
    text = report.render_report(tree)
    assert "| gemma3-270m | settled, 2 tokens past the first held | 1.25 | 0.12 |" in text


def test_check_detects_a_stale_document(tree):
    runner = CliRunner()
    assert runner.invoke(app, ["report", "--root", str(tree)]).exit_code == 0
    ok = runner.invoke(app, ["report", "--check", "--root", str(tree)])
    assert ok.exit_code == 0, ok.output
    smoke = tree / "outputs" / "cpu" / "server_smoke.json"
    art = load_artifact(smoke)
    write_artifact(smoke, art.model_copy(update={"retractions": 1}))
    stale = runner.invoke(app, ["report", "--check", "--root", str(tree)])
    assert stale.exit_code == 1 and "is stale" in stale.output


def test_templates_are_strict(tree):
    template = tree / "reports" / "BENCHMARKS.md.j2"
    template.write_text(template.read_text() + "{{ not_a_variable }}\n")
    with pytest.raises(jinja2.UndefinedError):
        report.render_report(tree)


def test_the_committed_document_is_up_to_date():
    assert report.stale_report(ROOT) is None


# ---- figures ---------------------------------------------------------------------------------


def test_figures_are_byte_stable_undated_and_on_the_page(tree):
    text, figures = report.render_all(tree)
    again = report.render_all(tree)[1]
    assert [f.name for f in figures] == ["latency_by_prompt_length_cpu", "latency_by_prompt_length_h200",
                                         "headline_ratio_history"]
    assert [f.svg for f in figures] == [f.svg for f in again]
    for f in figures:
        assert f.svg.startswith("<?xml") and "<dc:date>" not in f.svg and "Matplotlib v" not in f.svg
        assert f"![{f.title}]({f.path})" in text
    # the fixture's h200 run: three seams in eager and one in cudagraph, one line each
    h200 = figures[1].svg
    for label in ("hf_eager (eager)", "hf_qk_fast (eager)", "vllm_capture (eager)", "vllm_capture (cudagraph)"):
        assert label in h200
    assert "hf_eager (eager)" in figures[0].svg and "vllm_capture" not in figures[0].svg  # skipped on CPU
    # the history: the published ratios and ours, each labelled with its value
    history = figures[2].svg
    rows = [r for r in report.collect_inputs(tree, report_params(tree)).rows() if r.speedup is not None]
    assert {r.historical for r in rows} == {True, False} and len(rows) == 5
    for r in rows:
        assert f">{r.speedup:.2f}×" in history, r
    assert ">5.35× cudagraph<" in history  # the published headline, marked corrupt


def test_check_finds_stale_missing_and_orphan_figures(tree):
    report.write_report(tree)
    assert report.stale_report(tree) is None
    folder = tree / "reports" / "figures"
    svg = folder / "headline_ratio_history.svg"
    svg.write_text(svg.read_text().replace("5.35×", "5.36×"))
    assert "headline_ratio_history.svg is stale" in report.stale_report(tree)
    svg.unlink()
    assert "headline_ratio_history.svg does not exist" in report.stale_report(tree)
    report.write_report(tree)
    (folder / "old_figure.svg").write_text("<svg/>")
    assert "old_figure.svg" in report.stale_report(tree)
    report.write_report(tree)  # removes what no function draws any more
    assert not (folder / "old_figure.svg").exists() and report.stale_report(tree) is None
    # new data is a new figure: re-measuring makes the committed figure stale
    write_run(tree, "h200", {"cudagraph": bench_artifact("h200", "cudagraph", {"vllm_capture": 0.5}, True, True)})
    assert "stale" in report.stale_report(tree)


def test_another_stage_adds_its_figures_to_the_page_list(tree, monkeypatch):
    """How the load and eval stages add theirs: a function in `page.FIGURES`, keyed by their artifact kind."""
    from alignatt.report import figures

    def rtt(inputs):
        smokes = inputs.of_kind("server_smoke")
        fig, ax = figures.new_figure()
        ax.bar([rel for rel, _ in smokes], [a.rtt_ms_p95 for _, a in smokes])
        return [figures.Figure("smoke_rtt", "server_smoke", "Smoke RTT p95", "p95 by artifact",
                               figures.svg_text(fig))]

    monkeypatch.setattr(report, "FIGURES", report.FIGURES + (rtt,))  # undone after the test
    text, made = report.render_all(tree)
    assert "smoke_rtt" in [f.name for f in made]
    assert "## Figures: server_smoke" in text and "![Smoke RTT p95](figures/smoke_rtt.svg)" in text
    report.write_report(tree)
    assert (tree / "reports" / "figures" / "smoke_rtt.svg").exists()


def test_the_configuration_note_reports_each_graphed_modes_bit_for_bit_check(tree):
    """`check-vllm exact` and `exact_fullgraph` artifacts become one line per mode in the note,
    with the counts they recorded; a failed fullgraph check says why it is served, not scored."""
    from alignatt.record.artifacts import Check, MeasurementArtifact, write_artifact
    from tests.support.report_fixtures import provenance

    def checks_artifact(name: str, mode: str, identical: int) -> MeasurementArtifact:
        cmp = {"rows": 48, "identical_drafts": identical, "identical_decisions": identical,
               "bit_identical_rows": identical}
        return MeasurementArtifact(
            kind="measurement", schema_version=1,
            provenance=provenance(True, "alignatt:data/models/gemma-4-E4B-it/config.json", "random weights"),
            name="vllm_checks", description=name, config={},
            results={"checks": {name: {f"{mode}_vs_eager": cmp, "passed": identical == 48}}},
            checks=[Check(name=name, passed=identical == 48, detail="passed" if identical == 48 else "failed")],
            synthetic_weights=True)

    text = report.render_report(tree)
    assert "`fullgraph` has not had the bit-for-bit check yet" in text
    write_artifact(tree / "outputs" / "h200" / "vllm_checks_exact.json", checks_artifact("exact", "cudagraph", 48))
    write_artifact(tree / "outputs" / "h200" / "vllm_checks_exact_fullgraph.json",
                   checks_artifact("exact_fullgraph", "fullgraph", 42))
    text = report.render_report(tree)
    assert "- `cudagraph` (" in text and "`outputs/h200/vllm_checks_exact.json`): 48 of 48 drafts bit-identical, passed" in text
    assert "`outputs/h200/vllm_checks_exact_fullgraph.json`): 42 of 48 drafts bit-identical, failed" in text
    assert "served for its capacity, not scored" in text and "has not had the bit-for-bit check" not in text
    assert "✗ exact_fullgraph: failed; fullgraph vs eager: 42/48 bit-identical" in text  # Other measurements


# ---- one page section per artifact kind ------------------------------------------------------

# kind -> (a committed artifact of that kind, the page section that must show it). env and
# fingerprint have no section of their own: they are listed under Artifacts.
KIND_SECTIONS = {
    "env": ("outputs/h200/env.json", "## Artifacts"),
    "fingerprint": ("outputs/cpu/fingerprint.json", "## Artifacts"),
    "bench": ("outputs/cpu/bench_eager.json", "## Results"),
    "server_smoke": ("outputs/cpu/server_smoke.json", "## Server smoke"),
    "measurement": ("outputs/h200/vllm_checks_exact.json", "## Other measurements"),
    "load": ("outputs/cpu/load.json", "## Capacity"),
    "eval": ("outputs/cpu/eval.json", "## Translation quality"),
    "soak": ("outputs/cpu/soak.json", "## Other measurements"),
    "gpu_tests": ("tests/golden/gpu_tests.json",  # a CPU run of `alignatt test-gpu -- -k budget`: every test skips
                  "## The GPU suite these figures stand on"),
    "failover": ("outputs/cpu/failover.json", "## Other measurements"),
    "replicas": ("outputs/cpu/replicas.json", "## Other measurements"),
    "speech_e2e": ("tests/golden/speech_e2e.json",  # a CPU run of `alignatt speech-e2e --profile cpu`
                   "## Real speech"),
}
UNIQUE_DATE = "2031-07-19"  # no fixture artifact is of this day: where it appears, the added one is shown


def test_every_artifact_kind_has_a_page_test():
    from typing import get_args

    from alignatt.record.artifacts import AnyArtifact

    kinds = {get_args(m.model_fields["kind"].annotation)[0] for m in get_args(AnyArtifact)}
    assert kinds == set(KIND_SECTIONS), "a new artifact kind needs its page section (and a line in KIND_SECTIONS)"


def _section(text: str, heading: str) -> str:
    start = text.index(heading + "\n") if heading + "\n" in text else text.index(heading)
    following = text.find("\n## ", start + len(heading))
    return text[start:following if following != -1 else len(text)]


@pytest.mark.parametrize("kind", sorted(KIND_SECTIONS))
def test_each_artifact_kind_reaches_its_page_section(tree, kind):
    """One committed artifact of the kind, redated and put in a folder of its own, shows in its section."""
    source, heading = KIND_SECTIONS[kind]
    artifact = load_artifact(ROOT / source)
    assert artifact.kind == kind
    if kind != "fingerprint":  # undated by design
        artifact = artifact.model_copy(update={"provenance": artifact.provenance.model_copy(update={"timestamp_utc": UNIQUE_DATE + "T12:00:00Z"})})
    rel = f"outputs/kindcheck/{Path(source).name}"
    write_artifact(tree / rel, artifact)
    section = _section(report.render_report(tree), heading)
    assert (rel if kind in ("env", "fingerprint") else UNIQUE_DATE) in section, (
        f"the {kind} artifact does not reach {heading!r}")


def test_an_eval_section_says_once_why_a_lag_falls_below_zero_and_counts_each_figure():
    from alignatt.evaluate.outputs import report_section
    from alignatt.evaluate.units import NEGATIVE_WHY, NEGATIVE_WHY_BY_UNIT
    from alignatt.record.artifacts import EvalNegativeLatency

    base = load_artifact(ROOT / "outputs" / "cpu" / "eval.json")
    old = "an older artifact's own reason, lookahead first"  # the page words it from the metric, not this
    rows = [r.model_copy(update={"negative_latency": []}) for r in base.rows]
    first, second = [i for i, r in enumerate(rows) if r.role == "quality"][:2]
    rows[first] = rows[first].model_copy(update={"negative_latency": [
        EvalNegativeLatency(metric="al_words_read", instances=3, scored=7, min=-1.5, mean=2.0, why=old),
        EvalNegativeLatency(metric="al_ms", instances=1, scored=7, min=-20.0, mean=900.0, why=old)]})
    rows[second] = rows[second].model_copy(update={"negative_latency": [
        EvalNegativeLatency(metric="long_yaal", instances=2, scored=5, min=-4.0, mean=800.0, why=old)]})
    artifact = base.model_copy(update={"rows": rows})

    (section,) = report_section(ROOT, [("outputs/cpu/eval.json", artifact)])
    by_unit = NEGATIVE_WHY_BY_UNIT
    assert section["negative_whys"] == [NEGATIVE_WHY, by_unit["read"], by_unit["ms"], by_unit["longform"]]
    # in words read the lookahead is counted: a negative there is never put down to it (issue 39)
    assert "already counted" in by_unit["read"] and "a gold tail is the answer" not in by_unit["read"]
    marked = [r["negatives"] for table in dict(section["presets"]).values() for r in table if r["negatives"]]
    assert sorted(marked) == ["al_words_read 3/7 (min -1.50), al_ms 1/7 (min -20.00)", "long_yaal 2/5 (min -4.00)"]


LAG_CELLS = ("al_read", "laal_read", "laal_committed", "laal_ms", "ca_laal_ms", "long_yaal", "ca_long_yaal",
             "stream_laal", "ca_stream_laal")
POINT_LAGS = ("laal_words_read", "laal_words_committed", "laal_ms", "ca_laal_ms")


def _lag_cells(section):
    for table in dict(section["presets"]).values():
        for r in table:
            yield from (r[k] for k in LAG_CELLS)
    for p in section["points"]:
        yield from (p[k] for k in POINT_LAGS)
    for r in section["under_load"]:
        yield from (r[k] for k in ("laal_read", "laal_ms", "ca_laal_ms"))


def _unmarked_negative(cell: str) -> bool:
    """A negative figure in the cell without its † (a cell may hold two: "-3† queue, 5842 SimulEval")."""
    return any(not mark for mark in re.findall(r"(?<![\w.])-\d[\d.]*(†?)", cell))


def test_every_table_marks_every_negative_lag():
    """A lag below 0, or with negative instances inside its mean, carries † in every table that prints
    it: the preset tables, the quality-latency points and quality under load (issue 39: the points
    printed low_latency / none LAAL 0.43 bare)."""
    from alignatt.evaluate.outputs import report_section

    from alignatt.evaluate.outputs import tail_key

    a = load_artifact(ROOT / "outputs/h200/eval.json")
    (section,) = report_section(ROOT, [("outputs/h200/eval.json", a)])
    # a point above 0 with negative instances inside its mean (the committed run has one: no lookahead)
    row = next(r for r in a.rows if r.form == "sentence" and r.role == "quality" and r.driver == "inprocess"
               and r.latency["laal_words_read"] >= 0 and "laal_words_read" in {n.metric for n in r.negative_latency})
    point = next(p for p in section["points"] if (p["preset"], p["tail"]) == (row.preset, tail_key(row)))
    assert point["laal_words_read"] == f"{row.latency['laal_words_read']:.2f}†"
    cells = list(_lag_cells(section))
    assert not any(_unmarked_negative(c) for c in cells) and any(c.startswith("-") for c in cells)

    # a negative figure is marked even where no instance note says so
    base = load_artifact(ROOT / "outputs" / "cpu" / "eval.json")
    rows = [r.model_copy(update={"negative_latency": [], "latency": {**r.latency, "laal_words_read": -0.5,
                                                                      "ca_laal_ms": -3.0}})
            for r in base.rows]
    (section,) = report_section(ROOT, [("outputs/cpu/eval.json", base.model_copy(update={"rows": rows}))])
    quality = [r for table in dict(section["presets"]).values() for r in table]
    # a CA cell may add SimulEval's convention after the queue's ("-3† queue, 5842 SimulEval")
    assert {r["laal_read"] for r in quality} == {"-0.50†"} and {r["ca_laal_ms"].split()[0] for r in quality} == {"-3†"}
    assert {p["laal_words_read"] for p in section["points"]} == {"-0.50†"}
    assert not any(_unmarked_negative(c) for c in _lag_cells(section))


def test_the_page_calls_offline_a_reference_and_corrects_its_p_by_holm():
    from alignatt.evaluate.outputs import report_section

    page = (ROOT / "reports" / "BENCHMARKS.md").read_text(encoding="utf-8")
    assert "ceiling" not in page.lower()
    offline = next(line for line in page.splitlines() if line.startswith("update (same model and prompt)"))
    assert "a reference" in offline
    assert "brevity penalty" in page and "Holm" in page

    def verdicts(name, tail=None):
        (section,) = report_section(ROOT, [(name, load_artifact(ROOT / name))])
        return {r["p_offline"].rsplit(": ", 1)[1] for table in dict(section["presets"]).values() for r in table
                if r["p_offline"] != "—" and (tail is None or r["tail"] == tail)}

    # every committed eval's verdicts as Holm gives them from the recorded raw p, computed here: one
    # family per artifact (each row's BLEU and chrF test), significant only where both adjusted p are
    # below 0.05 and the test could resolve it (N large enough), above or below by BLEU against offline
    for name in sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "outputs").glob("*/eval*.json")
                       if not p.name.endswith("_metrics.json")):
        a = load_artifact(ROOT / name)
        tested = [r for r in a.rows if r.significance is not None and r.significance.bleu_p is not None]
        if not tested:
            continue
        raw = sorted((p, i, m) for i, r in enumerate(tested) for m, p in (("bleu", r.significance.bleu_p),
                                                                          ("chrf", r.significance.chrf_p)))
        adjusted, running = {}, 0.0
        for k, (p, i, m) in enumerate(raw):
            running = max(running, min(1.0, (len(raw) - k) * p))
            adjusted[i, m] = running
        offline = next(r for r in a.rows if r.role == "quality" and r.driver == "offline")
        expected = {"not significant" if max(adjusted[i, "bleu"], adjusted[i, "chrf"]) >= 0.05
                    or r.significance.resolvable is False
                    else "**above offline**" if r.bleu > offline.bleu else "**below offline**"
                    for i, r in enumerate(tested)}
        assert verdicts(name) == expected, name
    assert verdicts("outputs/h200/eval_cs-en.json", "gold") == {"**above offline**"}  # streaming can beat it


@pytest.mark.parametrize("direction, unit, tokenizer", [("en-zh", "characters", "zh"), ("en-de", "words", "13a"),
                                                        ("cs-en", "words", "13a")])
def test_an_eval_section_says_how_its_target_side_is_counted(direction, unit, tokenizer):
    from alignatt.evaluate.units import counting_note

    assert counting_note(direction) == f"delays count target {unit}; BLEU tokenised by sacrebleu's {tokenizer}"


def test_the_capacity_table_shows_how_busy_the_gpu_was_where_it_was_sampled():
    from alignatt.report.capacity import capacity_rows
    from alignatt.report.inputs import ReportInputs

    load = load_artifact(ROOT / "outputs" / "h200" / "load.json")
    first, *rest = load.levels
    sampled = load.model_copy(update={"levels": [first.model_copy(update={"gpu_busy_share": 0.634}),
                                                 *(lv.model_copy(update={"gpu_busy_share": None}) for lv in rest)]})
    inputs = ReportInputs(root=ROOT, params={}, published=[], runs={}, smokes=[], envs=[], measurements=[],
                          by_kind={"load": [("outputs/h200/load.json", sampled)]})
    rows = capacity_rows(inputs)
    assert [r["gpu_busy"] for r in rows] == ["63%"] + ["—"] * len(rest)


def test_a_changed_plotted_value_makes_its_figure_stale(tree):
    """The check compares what a figure shows: one plotted value moved, with the page text kept as
    it was rendered from the new data, is still caught by the figure's comparison."""
    report.write_report(tree)
    write_run(tree, "h200", {"cudagraph": bench_artifact("h200", "cudagraph", {"vllm_capture": 0.26}, True, True)})
    fresh_text, fresh_figures = report.render_all(tree)
    (tree / "reports" / "BENCHMARKS.md").write_text(fresh_text, encoding="utf-8")  # the page is current
    assert report.stale_report(tree) == "reports/figures/latency_by_prompt_length_h200.svg is stale: run `alignatt report`"
    result = CliRunner().invoke(app, ["report", "--check", "--root", str(tree)])
    assert result.exit_code == 1 and "latency_by_prompt_length_h200.svg is stale" in result.output


def _capacity_inputs(*extra: str):
    from alignatt.report.inputs import ReportInputs

    params = {"report": {"capacity_targets": [{"speakers": 1, "rtt_p50_ms": 40},
                                              {"speakers": 64, "rtt_p95_ms": 300}, {"speakers": 128, "rtt_p95_ms": 600}]}}
    loads = [(rel, load_artifact(ROOT / rel)) for rel in ("outputs/h200/load.json", *extra)]
    return ReportInputs(root=ROOT, params=params, published=[], runs={}, smokes=[], envs=[], measurements=[],
                        by_kind={"load": loads})


def test_the_capacity_figure_marks_the_served_default_and_each_target_in_words():
    import re

    from alignatt.report.capacity import rtt_against_speakers

    (figure,) = rtt_against_speakers(_capacity_inputs("outputs/h200/load_verify.json"))
    svg = figure.svg
    # the served default, named in words from its recorded configuration
    assert "served default: vLLM capture, full CUDA graphs, settled 2 tokens after a hold, own engine process" in svg
    for bound in (40, 300, 600):
        assert f"target ≤ {bound} ms" in svg
    # labels in words, not file names; the exploratory run (load_verify) is in the table, not drawn
    assert "load_" not in svg and "fullgraph+" not in svg and "verified re-drafts" not in svg
    legend_lines = re.findall(r">(?:served default: )?vLLM capture[^<]*</text>", svg)
    assert len(legend_lines) == 2  # the stage run's two configurations (at most 6 per panel)
    # Okabe-Ito colours and black: no colour of matplotlib's default cycle
    assert "#1f77b4" not in svg.lower() and "#ff7f0e" not in svg.lower()


def test_a_stray_artifact_in_outputs_does_not_change_the_page(tree):
    """What `alignatt smoke` used to leave in outputs/ by default changed the page and failed the
    audit. With a dvc.yaml the page reads only what it (or a run record) declares."""
    import shutil

    shutil.copy(ROOT / "dvc.yaml", tree / "dvc.yaml")
    before = report.render_all(tree)
    stray = load_artifact(tree / "outputs" / "cpu" / "server_smoke.json").model_copy(update={"retractions": 7})
    for rel in ("outputs/server_smoke.json", "outputs/cpu/server_smoke_try.json", "outputs/h200/load_by_hand.json"):
        write_artifact(tree / rel, stray)
    after = report.render_all(tree)
    assert after[0] == before[0] and [f.svg for f in after[1]] == [f.svg for f in before[1]]
    # a declared stage output still reaches it
    write_artifact(tree / "outputs" / "cpu" / "server_smoke.json", stray)
    assert report.render_report(tree) != before[0]


def test_without_a_dvc_yaml_every_artifact_is_read(tree):
    from alignatt.report.declared import declared_paths, is_declared

    assert declared_paths(tree, report_params(tree)) is None and is_declared("outputs/x.json", None)
    declared = declared_paths(ROOT, report_params(ROOT))
    for rel in ("outputs/cpu/server_smoke.json", "outputs/h200/bench_fullgraph.json", "outputs/cpu/eval_en-zh.json",
                "outputs/h200/load_verify.json"):  # a stage output per profile and foreach item; a recorded import
        assert is_declared(rel, declared), rel
    assert not is_declared("outputs/server_smoke.json", declared)


def test_the_artifacts_table_names_the_image_an_artifact_ran_in(tree):
    """An artifact measured inside a container says which image (digest, id) on the page; one
    measured on the host says host (issue 38: the committed CPU artifacts name their image)."""
    ran_in = sorted((tree / "outputs").glob("*/bench_eager.json"))[0]
    data = json.loads(ran_in.read_text())
    data["provenance"].update(container_image="localhost/alignatt:cpu", container_digest="sha256:" + "ab" * 32,
                              container_image_id="sha256:" + "cd" * 32)
    ran_in.write_text(json.dumps(data))
    rel = ran_in.relative_to(tree).as_posix()
    lines = {line.split(" | ")[0].strip("| `"): line for line in report.render_report(tree).splitlines()
             if line.startswith("| `outputs/")}
    assert "| `localhost/alignatt:cpu` sha256:abababababab, id sha256:cdcdcdcdcdcd |" in lines[rel]
    assert any("| host |" in line for path, line in lines.items() if path != rel)


def test_the_methodology_is_what_the_bench_artifacts_recorded_not_todays_params(tree):
    """params.yaml edited after the runs (more tokens, another profile note's settings) does not
    change the methodology; a bench run that recorded other settings does, per value."""
    import yaml

    params = yaml.safe_load((tree / "params.yaml").read_text())
    params["bench"].update(max_new_tokens=99, heads_k=3, warmup=5)
    (tree / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    text = report.render_report(tree)
    assert "at most 20 new tokens, top-8" in text and "per seam 1 unmeasured warm-up" in text
    path = tree / "outputs" / "h200" / "bench_cudagraph.json"
    art = load_artifact(path)
    write_artifact(path, art.model_copy(update={"config": art.config.model_copy(update={"max_new_tokens": 12})}))
    assert "at most 20 / 12 new tokens" in report.render_report(tree)


def test_the_bench_figure_marks_the_engine_serve_drafts_with():
    from alignatt.report.figures import _served_engine

    gpu = [("hf_eager", "eager"), ("vllm_capture", "eager"), ("vllm_capture", "fullgraph")]
    assert _served_engine(gpu) == ("vllm_capture", "fullgraph")
    assert _served_engine(gpu[:2]) is None  # vLLM ran, but not in the served mode: nothing is marked
    assert _served_engine([("hf_eager", "eager"), ("hf_qk_fast", "eager")]) == ("hf_qk_fast", "eager")


def test_prompts_of_one_length_share_one_point_in_the_latency_figure():
    from alignatt.record.artifacts.bench import BenchRow, PromptSummary, SeamResult
    from alignatt.report.figures import points_by_length

    def row(pid: str, tokens: int) -> BenchRow:
        return BenchRow(id=pid, repeat=0, length_bin="short", prompt_tokens=tokens, generated_tokens=1,
                        draft_text="", emitted_text="", emit_count=0, draft_stop_reason="eos",
                        policy_stop_reason="draft_end", aligned_words=[], prefill_ms=1, decode_ms=1,
                        capture_ms=0, reconstruct_ms=0, total_ms=2, per_token_ms=2)

    def summary(ms: float) -> PromptSummary:
        return PromptSummary(rows=1, median_per_token_ms=ms, median_total_ms=ms, draft_text="",
                             emitted_text="", unstable_repeats=0)

    seam = SeamResult(seam="hf_eager", status="ok", rows=[row("a", 90), row("b", 90), row("c", 40)],
                      by_prompt={"a": summary(10.0), "b": summary(14.0), "c": summary(5.0)})
    assert points_by_length(seam) == [(40, 5.0), (90, 12.0)]
