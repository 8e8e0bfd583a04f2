"""The page opens with its results: each rendered from its artifact, stamped, and linked."""

from __future__ import annotations

from pathlib import Path

from alignatt.record.artifacts import load_artifact
from alignatt.report.headline import anchor, headline
from alignatt.report.inputs import ReportInputs

ROOT = Path(__file__).resolve().parents[2]
TARGETS = {"report": {"capacity_targets": [{"speakers": 1, "rtt_p50_ms": 40},
                                           {"speakers": 64, "rtt_p95_ms": 300, "lag_max_s": 1.0, "lag_steady": True},
                                           {"speakers": 128, "rtt_p95_ms": 600, "lag_steady": True}]}}


H200_LOAD = ROOT / "outputs/h200/load_h200_33f3b17.json"  # the H200 load stage's run of 33f3b17, kept unchanged


def _inputs(load=None, evaluation=None) -> ReportInputs:
    load = load or load_artifact(H200_LOAD)
    evaluation = evaluation or load_artifact(ROOT / "outputs/h200/eval.json")
    return ReportInputs(root=ROOT, params=TARGETS, published=[], runs={}, smokes=[], envs=[], measurements=[],
                        by_kind={"load": [("outputs/h200/load.json", load)], "eval": [("outputs/h200/eval.json", evaluation)]})


def test_each_headline_comes_from_its_artifact_with_date_commit_and_gpu():
    load = load_artifact(H200_LOAD)
    items = {i["what"].split(",")[0]: i for i in headline(_inputs(load))}
    assert set(items) == {"Served configuration", "Speakers per H200 at the targets", "One speaker's round trip",
                          "Capture cost (captured ÷ uncaptured draft wall)", "Quality"}
    stamp = f"{load.provenance.date}, `{load.provenance.git_commit[:7]}`, NVIDIA H200"
    assert items["One speaker's round trip"]["stamp"] == stamp
    # a moved measurement moves the headline
    levels = [lv.model_copy(update={"partial_rtt_ms_p50": 12.4}) if lv.speakers == 1 else lv for lv in load.levels]
    moved = {i["what"]: i for i in headline(_inputs(load.model_copy(update={"levels": levels})))}
    assert "p50 12 ms" in moved["One speaker's round trip"]["result"]


def test_a_load_run_without_capture_cost_takes_it_from_the_newest_run_beside_it_or_says_none_did():
    measured = load_artifact(H200_LOAD)
    skipped = measured.model_copy(update={"capture_cost": []})
    evaluation = load_artifact(ROOT / "outputs/h200/eval.json")

    def cost_line(loads):
        inputs = ReportInputs(root=ROOT, params=TARGETS, published=[], runs={}, smokes=[], envs=[], measurements=[],
                              by_kind={"load": loads, "eval": [("outputs/h200/eval.json", evaluation)]})
        return next(i for i in headline(inputs) if i["what"].startswith("Capture cost"))

    older = measured.model_copy(update={"provenance": measured.provenance.model_copy(
        update={"timestamp_utc": "2026-11-30T00:00:00Z"})})
    line = cost_line([("outputs/h200/load.json", skipped), ("outputs/h200/load_old.json", older),
                      ("outputs/h200/load_kept.json", measured), ("outputs/h100/load_kept.json", measured)])
    assert line["what"].endswith("from `outputs/h200/load_kept.json`")  # the newest in the same folder
    assert line["stamp"].startswith(f"{measured.provenance.date}, `{measured.provenance.git_commit[:7]}`")
    assert "at batch 1" in line["result"]
    line = cost_line([("outputs/h200/load.json", skipped), ("outputs/h100/load_kept.json", measured)])
    assert line["result"] == "not measured in `outputs/h200/load.json`"  # another folder's run is not taken


def test_the_committed_page_opens_with_its_headline_and_every_link_resolves():
    page = (ROOT / "reports" / "BENCHMARKS.md").read_text(encoding="utf-8")
    first = page.splitlines()[:25]
    assert "## Results at a glance" in first
    bullets = [line for line in first if line.startswith("- **")]
    assert len(bullets) >= 5
    anchors = {anchor(line.lstrip("#")) for line in page.splitlines() if line.startswith("#")}
    for line in bullets:
        link = line.rsplit("](", 1)[1].rstrip(")")
        assert link in anchors, (link, line)


def test_anchor_is_githubs():
    assert anchor("Capacity (many speakers on one engine)") == "#capacity-many-speakers-on-one-engine"
    assert anchor("en-de: gemma3-270m on NVIDIA H200, 2026-12-03") == "#en-de-gemma3-270m-on-nvidia-h200-2026-12-03"


def _quality_line(evaluation) -> dict[str, str]:
    return next(i for i in headline(_inputs(evaluation=evaluation)) if i["what"].startswith("Quality"))


def test_the_quality_headline_is_whole_talks_with_asr_errors_in_a_band_or_says_none_is():
    evaluation = load_artifact(ROOT / "outputs/h200/eval.json")

    def with_talk_laal(ms: float):
        """The committed eval with every ASR-like talk row at 15 % given this computation-aware StreamLAAL,
        the balanced one 1 ms less (the nearest)."""
        rows = [r.model_copy(update={"latency": {**r.latency, "ca_stream_laal": ms - (r.preset == "balanced")}})
                if r.form == "longform" and r.tail == "asr" and r.committed_wer == 0.15 else r for r in evaluation.rows]
        return evaluation.model_copy(update={"rows": rows})

    line = _quality_line(with_talk_laal(9000.0))
    assert "whole talks, no oracle segmentation, ASR-like transcript at 15 % committed WER" in line["what"]
    # none within 4 s: the nearest is named under both conventions, with why the queue is long (the
    # eval replayed its streams at once)
    assert "no row within the IWSLT bands" in line["result"] and "`balanced` BLEU" in line["result"]
    assert "at StreamLAAL 9.00 s (" in line["result"] and "computation-unaware" in line["result"]
    concurrency = next(r.concurrency for r in evaluation.rows if r.form == "longform" and r.tail == "asr")
    assert f"{concurrency} streams at once" in line["result"] and "for one stream alone" in line["result"]
    assert "sentences, `balanced` BLEU" in line["result"] and "; ;" not in line["result"]
    # rows in the high band only: the best BLEU of them is the headline, and the low band says it has none
    fits = with_talk_laal(3501.0)
    best = max((r for r in fits.rows if r.form == "longform" and r.tail == "asr" and r.committed_wer == 0.15
                and r.segmentation == "punctuation"), key=lambda r: r.bleu)
    line = _quality_line(fits)
    assert line["result"].startswith(f"IWSLT low band: no row; IWSLT high band: `{best.preset}` BLEU "
                                     f"**{best.bleu:.1f}**")
    assert f"at StreamLAAL {best.latency['ca_stream_laal'] / 1000:.2f} s" in line["result"]
    assert "no row within" not in line["result"]


def test_the_headline_puts_a_talk_row_below_zero_in_no_band():
    """The page's first lines must not call a negative StreamLAAL the low band (the H100 run at afad72f
    had one: `high_latency`, -1.13 s)."""
    evaluation = load_artifact(ROOT / "outputs/h200/eval.json")
    talks = [r for r in evaluation.rows if r.form == "longform" and r.tail == "asr" and r.segmentation == "punctuation"]
    row = next(r for r in talks if r.committed_wer == max(t.committed_wer for t in talks))
    rows = [r.model_copy(update={"latency": {**r.latency, "ca_stream_laal": -500.0 if r is row else 9000.0}})
            if any(r is t for t in talks) else r for r in evaluation.rows]  # one below zero, the rest above the bands
    line = _quality_line(evaluation.model_copy(update={"rows": rows}))["result"]
    assert f"in no band: `{row.preset}` (StreamLAAL -0.50 s" in line
    assert "IWSLT low band" not in line and "nearest" in line and "-0.50 s (computation-aware" not in line
