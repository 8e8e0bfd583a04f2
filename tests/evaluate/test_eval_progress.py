"""`alignatt eval` says how far along it is on stderr (plain lines when stderr is not a terminal);
stdout and the artifact are what they were."""

from __future__ import annotations

import pytest

pytest.importorskip("omnisteval")

from alignatt.evaluate.run import EvalOptions, run_eval  # noqa: E402
from tests.fakes.mt_fakes import FakeSeam  # noqa: E402


def test_eval_counts_every_replayed_stream_on_stderr(capsys):
    options = EvalOptions(limit=2, max_source_words=8, presets=["balanced"], tails=["gold", "none"],
                          drivers=["inprocess"], load_levels=[1], load_sentences=2)
    artifact = run_eval(options, None, seam_factory=lambda route, heads: FakeSeam(), progress=lambda m: None)
    captured = capsys.readouterr()
    # 1 preset x 2 tails x 2 sentences, the offline baseline's 2, one load level's 2: 8 streams
    assert "eval hf_qk_fast: 0/8 stream (0%)" in captured.err
    assert "eval hf_qk_fast: 8/8 stream (100%)" in captured.err
    assert "about" in captured.err and "left" in captured.err  # a time left while under way
    assert "\r" not in captured.err and captured.out == ""
    assert len(artifact.rows) == 4
