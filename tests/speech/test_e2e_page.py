"""The page's end-to-end rows: one per `speech_e2e` artifact, saying how fast the audio was fed and,
below 1x, that the caption delay is on the audio's clock; a page with none says so."""

from __future__ import annotations

from pathlib import Path

from alignatt.record.artifacts import load_artifact, write_artifact
from alignatt.report import page
from alignatt.report.inputs import collect_inputs
from alignatt.report.speech import e2e_rows

FIXTURE = Path(__file__).resolve().parents[1] / "golden" / "speech_e2e.json"  # a CPU run: beckett at 0.5x


def test_an_e2e_artifact_makes_a_row_with_its_speed_and_clock(tmp_path):
    a = load_artifact(FIXTURE)
    write_artifact(tmp_path / "outputs" / "cpu" / "speech" / "e2e.json", a)
    fast = a.model_copy(update={"config": a.config.model_copy(update={"speed": 1.0}), "wer_committed": 0.083,
                                "words_never_covered": 2})
    write_artifact(tmp_path / "outputs" / "h200" / "speech" / "e2e.json", fast)
    rows = {r["source"]: r for r in e2e_rows(collect_inputs(tmp_path, {"profile": "cpu"}))}
    slow, real = rows["outputs/cpu/speech/e2e.json"], rows["outputs/h200/speech/e2e.json"]
    assert slow["speed"] == 0.5 and "audio's clock" in slow["clock"] and "not what a live viewer" in slow["clock"]
    assert "audio's clock" not in real["clock"] and "live viewer waits" in real["clock"]
    assert slow["covered"] == f"{a.committed_words} / {a.committed_words}"
    assert real["covered"] == f"{a.committed_words - 2} / {a.committed_words}"
    assert slow["wer"] == a.wer_reason and real["wer"] == "8.3 %"
    assert slow["delay_p50"] == f"{a.caption_delay_s_p50:.2f} s" and slow["translations"] == a.replies_with_committed_text
    assert slow["wlk"] == a.whisperlivekit and slow["clip"] == a.clip.name


def test_the_section_renders_with_and_without_an_e2e_run(tmp_path):
    from tests.support.report_fixtures import build_tree

    tree = build_tree(tmp_path / "project", h200=False)
    text = page.render_report(tree)
    assert "No end-to-end run here (`alignatt speech-e2e`" in text
    write_artifact(tree / "outputs" / "cpu" / "speech" / "e2e.json", load_artifact(FIXTURE))
    text = page.render_report(tree)
    assert "No end-to-end run here" not in text
    assert "| `beckett` (" in text and "fed at 0.5x: the delay is on the audio's clock" in text
