"""`alignatt eval --concurrency N`: N in-process streams at once through one engine's draft scheduler."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
from typer.testing import CliRunner

pytest.importorskip("omnisteval")

from alignatt.cli import app  # noqa: E402
from alignatt.core.errors import AlignattError  # noqa: E402
from alignatt.evaluate.run import EvalOptions, run_eval  # noqa: E402
from alignatt.evaluate.shared_engine import batch_limit_options  # noqa: E402
from alignatt.record.artifacts import EvalArtifact, load_artifact  # noqa: E402
from tests.fakes.batch_fakes import StandInBatchSeam  # noqa: E402
from tests.fakes.mt_fakes import FakeSeam  # noqa: E402

# Sentences of different lengths (they finish out of order), both sentence tails that redraw
# nothing and noise, two talks, and the offline baseline: every kind of in-process stream.
OPTIONS = dict(limit=6, max_source_words=12, presets=["balanced"], tails=["gold", "noisy"], longform_talks=2,
               pairs_per_talk=2, bootstrap=10)
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
    assert {r.concurrency for r in sequential.rows} == {1} and sequential.config["concurrency"] == 1
    assert "concurrent_streams" not in sequential.config
    assert {r.concurrency for r in concurrent.rows} == {CONCURRENCY} and concurrent.config["concurrency"] == CONCURRENCY
    assert "4 in-process streams at once" in concurrent.config["concurrent_streams"]
    # artifacts written before the field was recorded still load (it is optional)
    data = json.loads((Path(__file__).resolve().parents[2] / "outputs" / "h200" / "eval.json").read_text())
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
    assert message.startswith("stream en-de:") and "RuntimeError: fake engine failure" in message, message
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


def test_a_profile_sets_the_concurrency_through_its_eval_options():
    from alignatt.pipeline.container import expand_placeholders

    args = expand_placeholders(["{eval}"], "h200", {"eval": {"limit": 4, "concurrency": 64}})
    assert args == ["--limit", "4", "--concurrency", "64"]
    assert "--concurrency" in CliRunner().invoke(app, ["eval", "--help"], terminal_width=200).output


def test_vllm_batch_limit_covers_the_streams_unless_set():
    assert batch_limit_options("vllm_capture", {"vllm_mode": "eager"}, 64) == {"max_num_seqs": 64, "vllm_mode": "eager"}
    assert batch_limit_options("vllm_capture", {"max_num_seqs": 8}, 64) == {"max_num_seqs": 8}
    assert batch_limit_options("vllm_capture", {}, 1) == {}
    assert batch_limit_options("hf_qk_fast", {}, 64) == {}
