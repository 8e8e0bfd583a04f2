"""`alignatt eval --concurrency N`: N in-process streams at once through one engine's draft scheduler."""

from __future__ import annotations

import json
import re
import threading
from pathlib import Path

import pytest
from typer.testing import CliRunner

pytest.importorskip("omnisteval")

from alignatt.cli import app  # noqa: E402
from alignatt.core.errors import AlignattError  # noqa: E402
from alignatt.evaluate.run import EvalOptions, run_eval  # noqa: E402
from alignatt.record.artifacts import EvalArtifact, load_artifact  # noqa: E402
from tests.fakes.batch_fakes import StandInBatchSeam  # noqa: E402
from tests.fakes.mt_fakes import FakeSeam  # noqa: E402

# Sentences of different lengths (they finish out of order), a gold tail and an ASR-like
# transcript, two talks, and the offline baseline: every kind of in-process stream.
OPTIONS = dict(limit=6, max_source_words=12, presets=["balanced"], tails=["gold", "asr"], asr_wers=[0.15],
               longform_talks=2, longform_tails=["gold"], longform_max_pairs=2, bootstrap=10)
CONCURRENCY = 4


def _batching_seam(**kwargs) -> StandInBatchSeam:
    # A draft takes one engine step per source word, so long sentences finish after short ones;
    # a short sleep per step lets the other streams' drafts join the batch.
    return StandInBatchSeam(max_batch=8, steps_for=lambda r: len(r.source_words), step_s=0.002, **kwargs)


def _eval(concurrency: int, seam, out=None) -> EvalArtifact:
    return run_eval(EvalOptions(**OPTIONS, concurrency=concurrency), out, seam_factory=lambda route, heads: seam,
                    progress=lambda m: None)


def _replayed(row):
    """What a replay decides, without its timings: text, ASR states at each emission, stream times."""
    return (row.preset, row.tail, row.form, row.driver, row.hypotheses, row.streams, row.read_words,
            [[e[:3] for e in stream] for stream in row.emissions], row.updates, row.engine_calls, row.paths, row.bleu)


@pytest.fixture(scope="module")
def runs():
    """The same eval one stream at a time (FakeSeam) and 4 at once (the batching stand-in, whose
    drafts are FakeSeam's: batch-invariant)."""
    batching = _batching_seam()
    return _eval(1, FakeSeam()), _eval(CONCURRENCY, batching), batching


def test_concurrent_streams_replay_exactly_what_sequential_ones_do(runs):
    sequential, concurrent, _ = runs
    assert len(concurrent.rows) == len(sequential.rows) == 4  # 2 sentence tails, 1 long form, offline
    assert [_replayed(r) for r in concurrent.rows] == [_replayed(r) for r in sequential.rows]
    assert concurrent.test_set == sequential.test_set


def test_the_engine_batched_drafts_of_several_streams(runs):
    _, concurrent, seam = runs
    assert max(len(b) for b in seam.batches) > 1, "every engine step held one draft: the streams ran one by one"
    # one engine thread drove the seam (the scheduler's), and the variant closed it
    assert seam.threads == {"engine-eval"} and seam.closed_on is not None
    assert not any(t.name == "engine-eval" for t in threading.enumerate())


def test_rows_and_config_record_the_concurrency(runs, tmp_path):
    sequential, concurrent, _ = runs
    assert {r.concurrency for r in sequential.rows} == {1} and sequential.config.concurrency == 1
    assert sequential.config.concurrent_streams is None
    assert {r.concurrency for r in concurrent.rows} == {CONCURRENCY} and concurrent.config.concurrency == CONCURRENCY
    assert "4 in-process streams at once" in concurrent.config.concurrent_streams
    # artifacts written before the field was recorded still load (it is optional)
    data = json.loads((Path(__file__).resolve().parents[2] / "outputs" / "h200" / "eval_e4b_synthetic.json").read_text())
    for row in data["rows"]:
        row.pop("concurrency", None)
    (tmp_path / "old_eval.json").write_text(json.dumps(data))
    assert all(r.concurrency is None for r in load_artifact(tmp_path / "old_eval.json").rows)


def test_a_failing_draft_fails_the_eval_in_one_line_and_writes_nothing(tmp_path):
    victim = "classifier"  # a word of one sentence of the subset (en-de:225): its drafts fail
    seam = _batching_seam()
    seam.inner.fail_when = lambda r: victim in r.source_words
    out = tmp_path / "eval.json"
    with pytest.raises(AlignattError) as failed:
        _eval(CONCURRENCY, seam, out)
    message = str(failed.value)
    # the stream named by its row (preset/tail[/segmentation]) and its sentence or talk ids
    assert re.match(r"stream balanced/\S*en-de:\d+\S* failed", message), message
    assert "RuntimeError: fake engine failure" in message, message
    assert "\n" not in message
    assert not out.exists() and list(tmp_path.iterdir()) == []
    assert seam.closed_on is not None and not any(t.name == "engine-eval" for t in threading.enumerate())


@pytest.mark.parametrize("value", ["0", "-3"])
def test_a_concurrency_below_one_is_refused_in_one_line(tmp_path, value):
    out = tmp_path / "eval.json"
    r = CliRunner().invoke(app, ["eval", "--concurrency", value, "--limit", "1", "--out", str(out)])
    assert r.exit_code == 2, r.output
    assert "concurrency" in r.output and "greater than or equal to 1" in r.output
    assert len(r.output.strip().splitlines()) == 1 and not out.exists()


def test_a_profile_sets_the_concurrency_through_its_eval_options(tmp_path):
    import yaml

    from alignatt.evaluate.tails import fold_tail_noise
    from alignatt.pipeline.params import stage_options

    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump({"profiles": {"h200": {"model": "gemma3-270m",
                                                            "eval": {"limit": 4, "concurrency": 64}}}}))
    options = stage_options(EvalOptions, "eval", {}, params, "h200", fold=fold_tail_noise)
    assert (options.limit, options.concurrency) == (4, 64)
    assert "--concurrency" in CliRunner().invoke(app, ["eval", "--help"], terminal_width=200).output


@pytest.fixture(scope="module")
def under_load(tmp_path_factory):
    """An eval with quality-under-load levels 1 and 4 on the first 3 of its 6 sentences."""
    out = tmp_path_factory.mktemp("under_load") / "eval_x.json"
    options = EvalOptions(**{**OPTIONS, "longform_talks": 0}, concurrency=CONCURRENCY, load_levels=[4, 1],
                          load_sentences=3)
    seam = _batching_seam()
    artifact = run_eval(options, out, seam_factory=lambda route, heads: seam, progress=lambda m: None)
    return artifact, out, seam


def test_quality_under_load_is_a_row_per_level_on_the_first_sentences(under_load):
    artifact, _, seam = under_load
    rows = [r for r in artifact.rows if r.role == "under_load"]
    assert [(r.concurrency, r.preset, r.tail, r.instances) for r in rows] == [(1, "balanced", "gold", 3),
                                                                              (4, "balanced", "gold", 3)]
    quality = next(r for r in artifact.rows if r.role == "quality" and r.tail == "gold" and r.driver == "inprocess")
    # the stand-in is batch-invariant: each level replays the first sentences as the whole run did
    assert [r.hypotheses for r in rows] == [quality.hypotheses[:3]] * 2
    assert "first 3 sentences" in artifact.config.under_load and "[1, 4]" in artifact.config.under_load
    # under-load rows are no preset rows: no paired test, no point on the quality-latency curve
    assert all(r.significance is None for r in rows)
    assert quality.significance is not None and quality.significance.n == 6


def test_under_load_rows_have_their_own_metrics_logs_and_page_rows(under_load):
    from alignatt.evaluate.outputs import eval_metrics, plot_path, quality_latency_points, under_load_rows

    artifact, out, _ = under_load
    assert set(eval_metrics(artifact)["hf_qk_fast"]["under_load"]) == {"1", "4"}
    assert eval_metrics(artifact)["hf_qk_fast"]["inprocess"]["sentence"]["gold"]["balanced"]["n"] == 6
    assert {p["n"] for p in quality_latency_points(artifact)} == {6}
    logs = {json.loads(line)["path"].split("/")[0] for line in (out.parent / "eval_x_instances" / "index.jsonl").open()}
    assert {"hf_qk_fast.inprocess.balanced.gold.under_load_1", "hf_qk_fast.inprocess.balanced.gold.under_load_4",
            "hf_qk_fast.inprocess.balanced.gold"} <= logs
    page = under_load_rows(artifact)
    assert [(r["level"], r["n"], r["differ"]) for r in page] == [("1", "3", "—"), ("4", "3", "0/3 (vs 1 at once)")]
    assert plot_path(out).name == "quality_latency_x.csv" and plot_path(out.with_name("eval.json")).name == "quality_latency.csv"


@pytest.mark.parametrize("variant, mode", [("vllm_capture", "fullgraph"), ("vllm_capture:eager", "eager")])
def test_the_engines_build_the_route_the_server_builds_and_the_artifact_says_so(variant, mode):
    from alignatt.evaluate.outputs import engine_words

    seen = []

    def factory(route, heads):
        seen.append(route.seam_options)
        return FakeSeam()

    options = EvalOptions(**{**OPTIONS, "limit": 1, "tails": ["gold"], "longform_talks": 0}, variants=[variant],
                          offline_baseline=False, concurrency=2, load_levels=[1, 8], load_sentences=1)
    artifact = run_eval(options, None, seam_factory=factory, progress=lambda m: None)
    served = {"enable_prefix_caching": True, "max_num_seqs": 128, "vllm_mode": mode}
    assert seen and all(s == served for s in seen)  # the rows' engine and the under-load rows' alike
    assert artifact.config.engine_options == {variant: served}
    assert engine_words(artifact.config) == (f"`{variant}`: enable_prefix_caching True, max_num_seqs 128, "
                                             f"vllm_mode {mode} (the server's)")
    before = artifact.config.model_copy(update={"engine_options": None})  # an artifact from before the record
    assert "ran without prefix caching" in engine_words(before)
    assert engine_words(artifact.config.model_copy(update={"variants": ["hf_qk_fast"]})) is None


def test_beside_a_protocol_driver_the_engines_run_without_prefix_caching_and_the_page_says_why():
    from alignatt.evaluate.outputs import engine_words
    from alignatt.evaluate.variant import eval_route

    options = EvalOptions(**OPTIONS, variants=["vllm_capture"], drivers=["inprocess", "websocket"])
    off = {"enable_prefix_caching": False, "max_num_seqs": 128, "vllm_mode": "fullgraph"}
    assert eval_route(options, "vllm_capture", {}).seam_options == off
    assert eval_route(options, "hf_qk_fast", {}).seam_options == {}
    inprocess = EvalOptions(**{**OPTIONS, "limit": 1, "tails": ["gold"], "longform_talks": 0},
                            variants=["vllm_capture"], offline_baseline=False)
    artifact = run_eval(inprocess, None, seam_factory=lambda route, heads: FakeSeam(), progress=lambda m: None)
    cfg = artifact.config.model_copy(update={"engine_options": {"vllm_capture": off}})
    assert "(**not the server's enable_prefix_caching**: the protocol drivers'" in engine_words(cfg)


@pytest.mark.parametrize("levels", [[0], [4, 4]])
def test_load_levels_must_be_distinct_positive_concurrencies(levels):
    with pytest.raises(ValueError, match="distinct positive"):
        EvalOptions(load_levels=levels)


def test_under_load_rows_need_no_gold_row_of_their_own():
    seam = _batching_seam()
    options = EvalOptions(**{**OPTIONS, "limit": 2, "tails": ["none"], "longform_talks": 0}, concurrency=2,
                          load_levels=[2], load_sentences=2)
    artifact = run_eval(options, None, seam_factory=lambda route, heads: seam, progress=lambda m: None)
    assert [(r.role, r.tail) for r in artifact.rows] == [("quality", "none"), ("quality", "none"),
                                                         ("under_load", "gold")]
    assert not any(t.name == "engine-eval" for t in threading.enumerate())  # every scheduler ended


def test_every_in_process_stream_of_a_variant_is_in_flight_together(monkeypatch):
    """A talk is one long sequential stream: the rows' streams (preset x tail x sentence or talk) go
    through one map, talks first, so `concurrency` of them draft at once, not one row's; the rows are
    what one stream at a time gives."""
    from alignatt.evaluate.shared_engine import ConcurrentStreams

    maps = []
    real_map = ConcurrentStreams.map

    def recording_map(self, replay_one, items, names):
        maps.append(list(names))
        return real_map(self, replay_one, items, names)

    monkeypatch.setattr(ConcurrentStreams, "map", recording_map)
    options = {**OPTIONS, "presets": ["low_latency", "balanced"], "tails": ["gold"], "longform_tails": ["gold", "asr"],
               "offline_baseline": False}
    concurrent = run_eval(EvalOptions(**options, concurrency=8), None, seam_factory=lambda r, h: _batching_seam(),
                          progress=lambda m: None)
    rows_map = [m for m in maps if any(n.count("/") == 3 for n in m)]
    assert len(rows_map) == 1, maps
    talks, sentences = [n for n in rows_map[0] if n.count("/") == 3], [n for n in rows_map[0] if n.count("/") == 2]
    assert len(talks) == 2 * 2 * 2  # 2 presets x 2 long-form tails x 2 talks
    assert len(sentences) == 2 * OPTIONS["limit"]  # 2 presets x the gold tail x every sentence
    assert rows_map[0][:len(talks)] == talks  # the longest streams first
    sequential = run_eval(EvalOptions(**options, concurrency=1), None, seam_factory=lambda r, h: FakeSeam(),
                          progress=lambda m: None)
    assert [_replayed(r) for r in concurrent.rows] == [_replayed(r) for r in sequential.rows]
    assert sum(r.form == "longform" for r in concurrent.rows) == 4
