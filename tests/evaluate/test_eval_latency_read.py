"""Latency in source words *read* (committed + tail shown, SimulEval's delays), against hand-computed cases."""

from __future__ import annotations

import pytest

pytest.importorskip("omnisteval")

from alignatt.evaluate import scoring  # noqa: E402
from alignatt.evaluate.emissions import stream_output  # noqa: E402
from alignatt.evaluate.replay import Reply, Schedule, replay  # noqa: E402
from alignatt.evaluate.tails import TailModel  # noqa: E402


class EchoDriver:
    """Shows, upper-cased, every source word it was sent (committed + tail): a translator that
    writes a target word as soon as it reads the source word."""

    name = "echo"

    def __init__(self) -> None:
        self.sent: list[tuple[list[str], list[str]]] = []

    def open(self) -> None:
        pass

    def update(self, committed, tail, is_final, utterance_id) -> Reply:
        self.sent.append((list(committed), list(tail)))
        text = " ".join(w.upper() for w in [*committed, *tail])
        return Reply(utterance_id, is_final, text, "", "draft", 1, 1.0, 1.0)

    def close(self) -> None:
        pass


# 1 word/s, commit 2 s after arrival; a word reaches the tail at its onset (the older convention):
# arrive a@0, b@1, c@2 (after commit a@2), commit b@3, c@4.
SCHEDULE = Schedule(words_per_second=1.0, commit_lag_seconds=2.0, visible_at="onset")


def _score(tail: str):
    driver = EchoDriver()
    out = stream_output(replay(["a", "b", "c"], driver, SCHEDULE, tail_model=TailModel(tail), stream_id="s"), "de")
    item = scoring.SentenceLatencyInput("A B C", 3, SCHEDULE.source_ms(3), out.emissions)
    latency, negative = scoring.sentence_latency([item], "de")
    return driver, out, latency, negative


def test_words_read_count_the_gold_tail():
    _, out, latency, negative = _score("gold")
    # A at 0 s (a in the tail), B at 1 s (a b in the tail), C at 2 s (a committed, b c in the tail)
    assert [(e.text, e.committed_words, e.read_words, e.cu_ms) for e in out.emissions] == [
        ("A", 0, 1, 0.0), ("B", 0, 2, 1000.0), ("C", 1, 3, 2000.0)]
    # read: gamma = 3/3; (1 - 0) + (2 - 1) + (3 - 2), stop at d = |src|: 3 / 3
    assert latency["al_words_read"] == pytest.approx(1.0) and latency["laal_words_read"] == pytest.approx(1.0)
    # committed: (0 - 0) + (0 - 1) + (1 - 2) over 3 = -2/3: the lookahead makes it negative
    assert latency["al_words_committed"] == pytest.approx(-2 / 3, abs=1e-4)
    # ms: (0 - 0) + (1000 - 1000) + (2000 - 2000) = 0
    assert latency["al_ms"] == pytest.approx(0.0)
    notes = {n["metric"]: n for n in negative}
    assert set(notes) == {"al_words_committed", "laal_words_committed"}
    assert notes["al_words_committed"]["instances"] == 1 and notes["al_words_committed"]["scored"] == 1
    assert notes["al_words_committed"]["min"] == pytest.approx(-2 / 3, abs=1e-4)
    assert "lookahead" in notes["al_words_committed"]["why"]


def test_no_lookahead_reads_committed_words_only_and_sends_no_arrival():
    driver, out, latency, negative = _score("none")
    assert all(tail == [] for _, tail in driver.sent) and len(driver.sent) == 3  # one update per commit
    assert [(e.text, e.committed_words, e.read_words, e.cu_ms) for e in out.emissions] == [
        ("A", 1, 1, 2000.0), ("B", 2, 2, 3000.0), ("C", 3, 3, 4000.0)]
    assert latency["al_words_read"] == latency["al_words_committed"] == pytest.approx(1.0)
    assert latency["al_ms"] == pytest.approx(2000.0) and negative == []


def test_a_dropped_tail_word_is_not_read():
    from alignatt.evaluate.tails import TailNoise

    drop_all = TailModel("noisy", TailNoise(p_drop=1.0, p_wrong=0.0, p_split=0.0), ["x", "y"])
    assert drop_all.show(["b", "c"], "s", 0).covered == 0
    out = stream_output(replay(["a", "b", "c"], EchoDriver(), SCHEDULE, tail_model=drop_all, stream_id="s"), "de")
    # every tail word dropped: the translator read what was committed, as without lookahead
    assert [(e.committed_words, e.read_words) for e in out.emissions] == [(1, 1), (2, 2), (3, 3)]


def test_a_tail_word_is_visible_at_the_end_of_its_speech():
    # a is spoken during [0, 1) s: the recogniser shows it at 1 s, commits it at 3 s
    at_end = Schedule(words_per_second=1.0, commit_lag_seconds=2.0)
    assert at_end.visible_s(0) == 1.0 and SCHEDULE.visible_s(0) == 0.0
    out = stream_output(replay(["a", "b", "c"], EchoDriver(), at_end, tail_model=TailModel("gold"),
                               stream_id="s"), "de")
    assert [(e.text, e.read_words, e.cu_ms) for e in out.emissions] == [
        ("A", 1, 1000.0), ("B", 2, 2000.0), ("C", 3, 3000.0)]
    item = scoring.SentenceLatencyInput("A B C", 3, at_end.source_ms(3), out.emissions)
    latency, _ = scoring.sentence_latency([item], "de")
    # every unit written one word's duration after its word began: AL 1000 ms, no longer 0
    assert latency["al_ms"] == pytest.approx(1000.0)


class SlowEchoDriver(EchoDriver):
    """EchoDriver whose every update takes 700 ms: longer than a word's 1000 ms gap minus nothing."""

    def update(self, committed, tail, is_final, utterance_id) -> Reply:
        r = super().update(committed, tail, is_final, utterance_id)
        return Reply(r.utterance_id, r.final, r.committed_text, "", "draft", 1, 700.0, 700.0)


def test_two_computation_aware_conventions():
    out = stream_output(replay(["a", "b", "c"], SlowEchoDriver(), SCHEDULE, tail_model=TailModel("gold"),
                               stream_id="s"), "de")
    # updates at 0 (arrive a), 1 (arrive b), 2 (commit a) and 2 s (arrive c): C is written by the 4th.
    # The real-time queue: an update starts at its event or when the previous one is done, 700 ms each
    assert [e.ca_ms for e in out.emissions] == [700.0, 1700.0, 3400.0]
    # SimulEval: stream time plus all compute since the stream began (700, 1400, 2100, 2800 ms)
    assert [e.sim_ca_ms for e in out.emissions] == [700.0, 2400.0, 4800.0]
    item = scoring.SentenceLatencyInput("A B C", 3, SCHEDULE.source_ms(3), out.emissions)
    latency, _ = scoring.sentence_latency([item], "de")
    # AL over d - (i - 1) * 1000 ms, every unit counted (the last one is written after the source ends)
    assert latency["ca_al_ms"] == pytest.approx((700 + 700 + 1400) / 3, abs=1e-3)
    assert latency["sim_ca_al_ms"] == pytest.approx((700 + 1400 + 2800) / 3, abs=1e-3)
