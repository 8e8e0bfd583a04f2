"""The SimulEval instance logs beside the eval artifact, re-scored without our code: SimulEval's
`--score-only` (`make install` puts simuleval 1.1.4 in without its pins: it pins tqdm==4.64.1 and
alignatt needs tqdm>=4.66) and OmniSTEval's loader and scorers."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("omnisteval")

from alignatt.evaluate.instance_log import INDEX  # noqa: E402
from alignatt.evaluate.run import EvalOptions, run_eval  # noqa: E402
from tests.fakes.mt_fakes import FakeSeam  # noqa: E402
from tests.support.scorers import omnisteval_longform, simuleval_score  # noqa: E402


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory):
    out = tmp_path_factory.mktemp("eval") / "eval.json"
    options = EvalOptions(limit=3, max_source_words=10, presets=["low_latency", "balanced"], longform_talks=1,
                          longform_max_pairs=2, bootstrap=100)
    artifact = run_eval(options, out, seam_factory=lambda route, heads: FakeSeam(look_ahead=1),
                        progress=lambda m: None)
    folder = out.with_name("eval_instances")
    index = [json.loads(line) for line in (folder / INDEX).read_text().splitlines()]
    return artifact, folder, index


def test_every_row_has_its_logs(evaluated):
    artifact, folder, index = evaluated
    sentence = [r for r in artifact.rows if r.form == "sentence"]
    # four logs per sentence row (words read, words committed, ms on the real-time queue, ms as SimulEval
    # computes CA); per long-form row its stream under each convention and StreamLAAL's resegmentation
    assert len(index) == 4 * len(sentence) + 3 * sum(r.form == "longform" for r in artifact.rows)
    for entry in index:
        if entry["path"].endswith("stream_laal"):
            continue  # OmniSTEval's resegmented JSONL: its own test below
        log = folder / entry["path"] / "instances.log"
        lines = [json.loads(x) for x in log.read_text().splitlines()]
        assert lines and all({"index", "prediction", "delays", "elapsed", "source_length"} <= set(x) for x in lines)
        if entry["row"]["form"] == "sentence":
            assert all({"reference", "prediction_length", "source"} <= set(x) for x in lines)


def test_a_quality_under_load_log_has_the_references_of_its_own_sentences(tmp_path):
    """An under-load row replays the first `load_sentences` sentences: its references.txt has as many
    lines as its instances.log, or SimulEval and OmniSTEval refuse the folder (at 6a8fd9d its logs
    carried all 703 references for 100 streams)."""
    out = tmp_path / "eval.json"
    options = EvalOptions(limit=3, max_source_words=10, presets=["balanced"], tails=["gold"], offline_baseline=False,
                          load_levels=[1], load_sentences=2, bootstrap=10)
    run_eval(options, out, seam_factory=lambda route, heads: FakeSeam(), progress=lambda m: None)
    folder = out.with_name("eval_instances")
    index = [json.loads(line) for line in (folder / INDEX).read_text().splitlines()]
    loaded = [e for e in index if "under_load" in e["row"]]
    assert loaded
    for entry in index:
        d = folder / entry["path"]
        lines = len((d / "instances.log").read_text().splitlines())
        assert len((d / "references.txt").read_text().splitlines()) == lines, entry["path"]
        assert lines == (2 if "under_load" in entry["row"] else 3)


def test_omnistevals_loader_and_scorers_give_our_figures(evaluated):
    from omnisteval.io import load_shortform_instances
    from omnisteval.scoring import ALScorer, LAALScorer

    _, folder, index = evaluated
    checked = 0
    for entry in index:
        if entry["row"]["form"] != "sentence":
            continue
        d = folder / entry["path"]
        instances = load_shortform_instances(str(d / "instances.log"), str(d / "references.txt"), "delays", "elapsed")
        assert "--word_level" in entry["omnisteval"] and entry["simuleval"].startswith("simuleval --score-only")
        figures = entry["figures"]
        assert ALScorer()(instances) == pytest.approx(figures["AL"], abs=1e-3), entry["path"]
        assert LAALScorer()(instances) == pytest.approx(figures["LAAL"], abs=1e-3), entry["path"]
        if entry["delays"].startswith("ms"):  # ms: the real-time queue; ms_simuleval: SimulEval's CA
            assert LAALScorer(computation_aware=True)(instances) == pytest.approx(figures["LAAL_CA"], abs=1e-3)
        checked += 1
    assert checked >= 9


@pytest.mark.parametrize("sub", ["longform", "longform_simuleval"])
def test_omnistevals_longform_cli_gives_our_long_yaal(evaluated, tmp_path, sub):
    artifact, folder, index = evaluated
    entry = next(e for e in index if e["row"]["form"] == "longform" and e["path"].endswith("/" + sub))
    d = folder / entry["path"]
    scores = omnisteval_longform(tmp_path / "omni", "--speech_segmentation", str(d / "segmentation.yaml"),
                         "--ref_sentences_file", str(d / "references.txt"), "--hypothesis_file",
                         str(d / "instances.log"), "--word_level", "--lang", "de")
    yaal = next(v for k, v in scores.items() if "YAAL" in k and "CA" not in k)
    assert float(yaal) == pytest.approx(entry["figures"]["LongYAAL"], abs=1e-2)
    ca = next(v for k, v in scores.items() if "YAAL" in k and "CA" in k)
    assert float(ca) == pytest.approx(entry["figures"]["LongYAAL_CA"], abs=1e-2)


def test_omnistevals_resegmented_log_gives_our_stream_laal_under_both_conventions(evaluated, tmp_path):
    artifact, folder, index = evaluated
    entry = next(e for e in index if e["path"].endswith("/stream_laal"))
    log = str(folder / entry["path"] / "instances.resegmented.jsonl")
    queue = omnisteval_longform(tmp_path / "queue", "--resegmented_hypothesis", log, "--word_level", "--no_quality")
    sim = omnisteval_longform(tmp_path / "sim", "--resegmented_hypothesis", log, "--word_level", "--no_quality",
                      "--emission_ca_key", "elapsed_simuleval")
    f = entry["figures"]

    def laal(scores, ca):
        return float(next(v for k, v in scores.items() if k.startswith("LongLAAL") and ("CA" in k) == ca))

    assert laal(queue, False) == pytest.approx(f["StreamLAAL"], abs=1e-2)
    assert laal(queue, True) == pytest.approx(f["StreamLAAL_CA"], abs=1e-2)
    assert laal(sim, True) == pytest.approx(f["StreamLAAL_CA_simuleval"], abs=1e-2)
    # SimulEval's convention adds every compute since the stream began: never earlier than the queue's
    assert f["StreamLAAL_CA_simuleval"] >= f["StreamLAAL_CA"]


def test_simuleval_score_only_gives_our_figures(evaluated, tmp_path):
    pytest.importorskip("simuleval", reason="pip install --no-deps simuleval==1.1.4 (and pandas, textgrid, "
                                            "tornado, soundfile)")
    import shutil

    artifact, folder, index = evaluated
    copy = tmp_path / "logs"
    shutil.copytree(folder, copy)  # SimulEval rewrites config.yaml in the folder it scores
    checked = 0
    for entry in index:
        if entry["row"]["form"] != "sentence" or entry["row"]["preset"] not in ("balanced", "offline"):
            continue
        got = simuleval_score(copy / entry["path"])
        f = entry["figures"]
        # SimulEval prints 3 decimals
        assert got["AL"] == pytest.approx(f["AL"], abs=1e-3) and got["LAAL"] == pytest.approx(f["LAAL"], abs=1e-3)
        assert got["BLEU"] == pytest.approx(f["BLEU"], abs=1e-3)
        if entry["delays"].startswith("ms"):  # with the flag, SimulEval scores every column on `elapsed`
            ca = simuleval_score(copy / entry["path"], "--computation-aware")
            assert ca["AL_CA"] == pytest.approx(f["AL_CA"], abs=1e-3)
            assert ca["LAAL_CA"] == pytest.approx(f["LAAL_CA"], abs=1e-3)
        checked += 1
    assert checked >= 6
