"""The committed instance logs re-score to the committed figures with the field's own tools: each
folder's index records the `simuleval --score-only` and `omnisteval longform` command lines that score
an entry, and running them (on a copy: SimulEval rewrites config.yaml) gives the figures the index and
the eval artifact (and so the page) print. Every sentence entry is also scored by OmniSTEval's loader
and scorers in-process; the command lines run for the headline's rows of each folder."""

from __future__ import annotations

import json
import shlex
import shutil
from pathlib import Path

import pytest

pytest.importorskip("omnisteval")

from alignatt.evaluate.instance_log import INDEX  # noqa: E402
from alignatt.record.artifacts import load_artifact  # noqa: E402
from tests.support.scorers import omnisteval_scores, run_scorer, simuleval_printed  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = sorted(p.parent.relative_to(ROOT).as_posix() for p in (ROOT / "outputs").glob(f"*/eval*_instances/{INDEX}"))
TOLERANCE = 2e-3  # the index keeps 4 decimals, SimulEval prints 3


def _index(folder: str) -> list[dict]:
    return [json.loads(line) for line in (ROOT / folder / INDEX).read_text().splitlines()]


def _headline_entries(index: list[dict]) -> list[dict]:
    """The entries of the balanced rows at the transcript the headline reads (ASR-like errors at the
    highest WER where present, else the gold tail): one per kind of log."""
    rows = [e["row"] for e in index if e["row"]["preset"] == "balanced"]
    wers = [r["committed_wer"] for r in rows if r["tail"] == "asr"]
    want = ("asr", max(wers)) if wers else ("gold", None)
    picked: dict[str, dict] = {}
    for e in index:
        r = e["row"]
        if r["preset"] == "balanced" and (r["tail"], r["committed_wer"]) == want and "under_load" not in e["path"]:
            picked.setdefault(e["path"].rsplit("/", 1)[1], e)
    return list(picked.values())


def _headline_logs(folder: str, form: str, tmp_path: Path):
    """(entry, the artifact's row, a directory holding a copy of its logs) for the headline entries of
    one form: the recorded relative paths resolve from that directory."""
    artifact = load_artifact(ROOT / (folder.removesuffix("_instances") + ".json"))
    for entry in _headline_entries(_index(folder)):
        if entry["row"]["form"] != form:
            continue
        cwd = tmp_path / entry["path"].replace("/", "_")
        shutil.copytree(ROOT / folder / entry["path"], cwd / Path(folder).name / entry["path"])
        yield entry, _row(artifact, entry), cwd


def _row(artifact, entry: dict):
    """The artifact's quality row an index entry logs."""
    keys = ("form", "preset", "tail", "committed_wer", "segmentation")
    return next(r for r in artifact.rows if r.role == "quality" and r.driver == entry["row"]["driver"]
                and tuple(getattr(r, k) for k in keys) == tuple(entry["row"][k] for k in keys))


@pytest.mark.parametrize("folder", FOLDERS)
def test_every_sentence_log_scores_to_its_figures_in_omnisteval(folder):
    from omnisteval.io import load_shortform_instances
    from omnisteval.scoring import ALScorer, LAALScorer

    checked = 0
    for entry in _index(folder):
        if entry["row"]["form"] != "sentence":
            continue
        d = ROOT / folder / entry["path"]
        refs = d / "references.txt"
        if len(refs.read_text().splitlines()) != len((d / "instances.log").read_text().splitlines()):
            # written before the fix of 2026-12-06: an under-load row's folder had every sentence's
            # reference; each line carries its own, which the loader reads without the file
            assert "under_load" in entry["row"], entry["path"]
            refs = None
        instances = load_shortform_instances(str(d / "instances.log"), refs and str(refs), "delays", "elapsed",
                                             char_level=entry["unit"] == "char")
        f = entry["figures"]
        assert ALScorer()(instances) == pytest.approx(f["AL"], abs=TOLERANCE), entry["path"]
        assert LAALScorer()(instances) == pytest.approx(f["LAAL"], abs=TOLERANCE), entry["path"]
        if "LAAL_CA" in f:
            assert LAALScorer(computation_aware=True)(instances) == pytest.approx(f["LAAL_CA"], abs=TOLERANCE)
        checked += 1
    assert checked >= 4


@pytest.mark.parametrize("folder", FOLDERS)
def test_the_recorded_simuleval_commands_give_the_printed_figures(folder, tmp_path):
    pytest.importorskip("simuleval", reason="pip install --no-deps simuleval==1.1.4 (and pandas, textgrid, "
                                            "tornado, soundfile)")
    checked = 0
    for entry, row, cwd in _headline_logs(folder, "sentence", tmp_path):
        assert entry["figures"]["BLEU"] == pytest.approx(row.bleu, abs=1e-3)  # the page prints the row
        for key, names in (("simuleval", ("AL", "LAAL", "BLEU")), ("simuleval_ca", ("AL_CA", "LAAL_CA"))):
            if key not in entry:
                continue
            got = simuleval_printed(run_scorer(shlex.split(entry[key]), cwd))  # the recorded command, as recorded
            for name in names:
                assert got[name] == pytest.approx(entry["figures"][name], abs=TOLERANCE), (entry["path"], name)
            checked += 1
    assert checked >= 2


@pytest.mark.parametrize("folder", [f for f in FOLDERS if any(e["row"]["form"] == "longform" for e in _index(f))])
def test_the_recorded_omnisteval_commands_give_the_printed_talk_figures(folder, tmp_path):
    checked = 0
    for entry, row, cwd in _headline_logs(folder, "longform", tmp_path):
        f = entry["figures"]
        for key in ("omnisteval", "omnisteval_simuleval_ca"):
            if key not in entry:
                continue
            out = cwd / f"scores_{key}"
            run_scorer([*shlex.split(entry[key]), "--output_folder", str(out)], cwd)
            scores = {k: float(v) for k, v in omnisteval_scores(out).items()}

            def metric(prefix: str, ca: bool) -> float:
                return next(v for k, v in scores.items() if k.startswith(prefix) and ("CA" in k) == ca)

            if entry["path"].endswith("/stream_laal"):  # OmniSTEval's resegmented log: StreamLAAL
                if key == "omnisteval":
                    assert metric("LongLAAL", False) == pytest.approx(f["StreamLAAL"], abs=1e-2)
                    assert metric("LongLAAL", True) == pytest.approx(f["StreamLAAL_CA"], abs=1e-2)
                else:
                    assert metric("LongLAAL", True) == pytest.approx(f["StreamLAAL_CA_simuleval"], abs=1e-2)
            else:
                assert metric("LongYAAL", False) == pytest.approx(f["LongYAAL"], abs=1e-2), entry["path"]
                assert metric("LongYAAL", True) == pytest.approx(f["LongYAAL_CA"], abs=1e-2), entry["path"]
            checked += 1
        # the page prints the artifact's row: the index carries the same figures
        if entry["path"].endswith("/stream_laal"):
            assert (f["StreamLAAL"], f["StreamLAAL_CA"]) == pytest.approx(
                (row.latency["stream_laal"], row.latency["ca_stream_laal"]), abs=1e-3)
    assert checked >= 3
