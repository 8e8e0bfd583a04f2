"""The ASR-like transcript (alignatt.evaluate.asr_errors) and where a replay closes utterances."""

from __future__ import annotations

import pytest

from alignatt.evaluate.asr_errors import AsrErrors, AsrTranscriber, word_error_rate
from alignatt.evaluate.replay import Reply, Schedule, replay
from alignatt.evaluate.tails import TailModel, vocabulary
from alignatt.evaluate.talks import whole_talks
from alignatt.evaluate.testsets import load_test_set

TS = load_test_set("en-de")
VOCAB = vocabulary([p.source for p in TS.pairs])
SCHEDULE = Schedule(words_per_second=2.4, commit_lag_seconds=2.0)


class RecordingDriver:
    """Writes nothing; records every update (committed, tail, final). `force_after`: the session
    forces a final once an utterance holds more committed words than that."""

    name = "recording"

    def __init__(self, force_after: int | None = None) -> None:
        self.sent: list[tuple[list[str], list[str], bool]] = []
        self.force_after = force_after

    def open(self) -> None:
        pass

    def update(self, committed, tail, is_final, utterance_id) -> Reply:
        self.sent.append((list(committed), list(tail), is_final))
        forced = self.force_after is not None and len(committed) > self.force_after
        return Reply(utterance_id, is_final or forced, "", "", "draft", 0, 0.0, 0.0)

    def close(self) -> None:
        pass


@pytest.mark.parametrize("wer", [0.05, 0.15])
def test_committed_words_carry_errors_at_the_set_rate(wer):
    asr = AsrTranscriber(AsrErrors(committed_wer=wer), VOCAB, 2.0)
    errors = words = 0
    for p in TS.pairs:
        got = asr.transcript(p.source_words, p.id).committed(0, len(p.source_words))
        errors += word_error_rate(p.source_words, got) * len(p.source_words)
        words += len(p.source_words)
    assert wer * 0.85 <= errors / words <= wer * 1.15


def test_a_replay_commits_errors_while_the_model_is_on():
    talk = whole_talks(TS.pairs)[1][:6]
    words = [w for p in talk for w in p.source_words]
    driver = RecordingDriver()
    replay(words, driver, SCHEDULE, close_on_punctuation=True,
           tail_model=TailModel("asr", vocab=VOCAB, asr=AsrErrors(committed_wer=0.15)), stream_id="t")
    committed = [w for c, _, final in driver.sent if final for w in c]
    assert committed != words and word_error_rate(words, committed) > 0.05
    gold = RecordingDriver()
    replay(words, gold, SCHEDULE, close_on_punctuation=True, tail_model=TailModel("gold"), stream_id="t")
    assert [w for c, _, final in gold.sent if final for w in c] == words


def test_the_error_types_an_asr_makes_all_occur():
    asr = AsrTranscriber(AsrErrors(committed_wer=0.3, p_punct_drop=0.5, p_casing=0.1), VOCAB, 2.0)
    words = [w for t in whole_talks(TS.pairs)[:3] for p in t for w in p.source_words]
    t = asr.transcript(words, "types")
    kinds = set()
    for i, (w, f) in enumerate(zip(words, t.final)):
        if not f:
            nxt = t.final[i + 1] if i + 1 < len(words) else ()
            core = w.strip('"().,').lower()
            merged = len(nxt) == 1 and nxt[0].lower().startswith(core) and len(nxt[0]) > len(words[i + 1])
            kinds.add("merge" if merged else "delete")
        elif len(f) == 2:
            kinds.add("split")
        elif f[0] != w and not (i > 0 and not t.final[i - 1]):
            if f[0].lower() == w.lower():
                kinds.add("casing")
            elif f[0].rstrip(".!?") == w.rstrip(".!?"):
                kinds.add("punctuation")
            else:
                kinds.add("substitute")
    assert {"merge", "delete", "split", "casing", "punctuation", "substitute"} <= kinds


def test_the_transcript_is_seeded_and_the_same_for_every_preset():
    a = AsrTranscriber(AsrErrors(committed_wer=0.15), VOCAB, 2.0)
    b = AsrTranscriber(AsrErrors(committed_wer=0.15), VOCAB, 2.0)
    words = TS.pairs[0].source_words
    assert a.transcript(words, "x") == b.transcript(words, "x")
    c = AsrTranscriber(AsrErrors(committed_wer=0.15, seed=1), VOCAB, 2.0)
    long = [w for p in TS.pairs[:20] for w in p.source_words]
    assert a.transcript(long, "x") != c.transcript(long, "x")


def test_the_tail_revises_consistently_towards_the_committed_words():
    talk = whole_talks(TS.pairs)[2]
    words = [w for p in talk for w in p.source_words]
    errors = AsrErrors(committed_wer=0.15)
    t = AsrTranscriber(errors, VOCAB, SCHEDULE.commit_lag_seconds).transcript(words, "talk")
    driver = RecordingDriver()
    replay(words, driver, SCHEDULE, close_on_punctuation=True, tail_model=TailModel("asr", vocab=VOCAB, asr=errors),
           stream_id="talk")
    # a tail word goes through its fixed early forms, in order, then its committed one: never redrawn
    for i in range(len(words)):
        ages = [k * 0.05 for k in range(60)]
        seen = [t.form(i, a) for a in ages]
        changes = [f for k, f in enumerate(seen) if k == 0 or f != seen[k - 1]]
        assert changes[-1] == t.final[i] and len(changes) <= errors.tail_stages + 1
        assert all(f in (*t.early[i], t.final[i]) for f in changes)
    assert revision_share(t, words) == pytest.approx(revision_share(t, words))  # seeded
    assert 0.35 <= revision_share(t, words) <= 0.75  # issue 46's recogniser: 38-75 % of the steps


def revision_share(t, words) -> float:
    """Of the ASR events whose tail shares gold positions with the previous event's, the share that
    show one of those positions in another form (the tail revised itself)."""
    committed = arrived = 0
    prev: dict[int, tuple[str, ...]] = {}
    revised = compared = 0
    for ev in SCHEDULE.events(words):
        if ev.kind == "arrive":
            arrived = ev.index + 1
        else:
            committed = ev.index + 1
        now = {i: t.form(i, ev.t - SCHEDULE.visible_s(i)) for i in range(committed, arrived)}
        both = set(now) & set(prev)
        if both:
            compared += 1
            revised += any(now[i] != prev[i] for i in both)
        prev = now
    return revised / compared


def test_a_replay_closes_only_where_the_client_could_know():
    talk = whole_talks(TS.pairs)[1][:8]
    words = [w for p in talk for w in p.source_words]
    boundaries = set()
    n = 0
    for p in talk:
        n += len(p.source_words)
        boundaries.add(n)
    # every sentence mark lost by the recogniser, none added: the client cannot see a sentence end
    deaf = AsrErrors(committed_wer=0.05, p_punct_drop=1.0, p_punct_insert=0.0)
    driver = RecordingDriver()
    steps = replay(words, driver, SCHEDULE, close_on_punctuation=True,
                   tail_model=TailModel("asr", vocab=VOCAB, asr=deaf), stream_id="t")
    closes = [s.committed_words for s in steps if s.is_final]
    assert closes == [len(words)]  # only the end of the talk: no reference boundary leaked
    assert len(boundaries) == 8 and not set(closes) & (boundaries - {len(words)})
    # the session's forced finals are the client's to follow
    forced = replay(words, RecordingDriver(force_after=20), SCHEDULE, close_on_punctuation=True,
                    tail_model=TailModel("asr", vocab=VOCAB, asr=deaf), stream_id="t")
    assert {s.close for s in forced if s.is_final} == {"server", "end"}
    # with errors, every close is at a mark the client read, a forced final, or the end
    noisy = TailModel("asr", vocab=VOCAB, asr=AsrErrors(committed_wer=0.15))
    view = noisy.view(words, "t")
    for s in replay(words, RecordingDriver(), SCHEDULE, close_on_punctuation=True, tail_model=noisy, stream_id="t"):
        if s.is_final:
            assert s.close in ("punctuation", "end", "server")
            if s.close == "punctuation":
                assert view.ends_sentence(s.committed_words)
    # the oracle comparison closes at the reference boundaries, and says so
    oracle = replay(words, RecordingDriver(), SCHEDULE, tail_model=TailModel("asr", vocab=VOCAB, asr=deaf),
                    stream_id="t", oracle_ends=sorted(boundaries))
    assert {s.committed_words for s in oracle if s.is_final} == boundaries
    assert {s.close for s in oracle if s.is_final} == {"oracle", "end"}
