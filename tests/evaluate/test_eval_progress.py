"""`alignatt eval` says how far along it is on stderr (plain lines when stderr is not a terminal);
stdout and the artifact are what they were."""

from __future__ import annotations

import pytest

pytest.importorskip("omnisteval")

from alignatt.evaluate.run import EvalOptions, run_eval  # noqa: E402
from tests.fakes.mt_fakes import FakeSeam  # noqa: E402


def test_eval_counts_every_replayed_source_word_on_stderr(capsys):
    options = EvalOptions(limit=2, max_source_words=8, presets=["balanced"], tails=["gold", "none"],
                          drivers=["inprocess"], load_levels=[1], load_sentences=2)
    artifact = run_eval(options, None, seam_factory=lambda route, heads: FakeSeam(), progress=lambda m: None)
    captured = capsys.readouterr()
    # 1 preset x 2 tails x 2 sentences, the offline baseline's 2, one load level's 2: 8 streams
    from alignatt.evaluate.testsets import load_test_set, select

    words = sum(len(p.source_words) for p in select(load_test_set(options.test_set, options.direction), 2, 8))
    assert f"eval hf_qk_fast: 0/{4 * words} source word (0%)" in captured.err
    assert f"eval hf_qk_fast: {4 * words}/{4 * words} source word (100%)" in captured.err
    assert "about" in captured.err and "left" in captured.err  # a time left while under way
    assert "\r" not in captured.err and captured.out == ""
    assert len(artifact.rows) == 4


def test_the_word_count_holds_talks_only_where_the_inprocess_driver_replays_them():
    """Whole talks are in-process jobs: a variant replayed only over WebSocket counts its sentences'
    words (per preset and tail) and none of the talks it does not replay; a talk counts all its words."""
    from alignatt.evaluate.replay import Schedule
    from alignatt.evaluate.rows import talks_of
    from alignatt.evaluate.testsets import load_test_set, select
    from alignatt.evaluate.variant import Variant

    def count(drivers: list[str]) -> tuple[int, int, int]:
        options = EvalOptions(limit=3, max_source_words=8, presets=["balanced"], tails=["gold", "none"],
                              drivers=drivers, longform_talks=1, longform_max_pairs=2, longform_tails=["gold"],
                              offline_baseline=False,
                              load_levels=[1], load_sentences=2)
        ts = load_test_set(options.test_set, options.direction)
        talks = talks_of(ts.pairs, 1, 2)
        assert len(talks) == 1
        v = Variant(options, "hf_qk_fast", ts, select(ts, 3, 8), talks, ["balanced"], ["balanced"],
                    Schedule(options.words_per_second, options.commit_lag_seconds, options.tail_visible_at),
                    "scored", {}, lambda m: None)
        words = lambda pairs: sum(len(p.source_words) for p in pairs)  # noqa: E731
        return v.words(), words(v.pairs), words(talks[0]), words(v.pairs[:2])

    # 2 tails x 3 sentences + the load level's 2; in process, also 1 talk per long-form row (gold punctuation)
    total, sentences, talk, load = count(["websocket"])
    assert talk > 0 and total == 2 * sentences + load
    assert count(["inprocess"])[0] == 2 * sentences + talk + load
    assert count(["inprocess", "websocket"])[0] == 2 * 2 * sentences + talk + load
