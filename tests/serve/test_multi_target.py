"""One speaker, several targets: each target append-only on its own, drafts batched together."""

from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from alignatt.core.draft import Head
from alignatt.core.policy import PolicyConfig
from alignatt.serve.multi_target import Targets
from alignatt.serve.pool import HeadRows
from alignatt.serve.session import (
    FAST_PATH, FINAL_CACHED, UNCHANGED, Session, SessionConfig, SessionLimits, SourceUpdate,
)
from tests.fakes.mt_fakes import FakeSeam
from tests.support.source_ops import SourceOps

UNION = [Head(0, 0), Head(0, 1), Head(3, 2)]
HEADS = {"de": [Head(0, 0), Head(0, 1)], "fr": [Head(3, 2), Head(0, 0)]}


class LangSeam(FakeSeam):
    """The fake engine, translating into the request's target language ("DE3:word")."""

    def draft(self, request):
        d = super().draft(request)
        tag = request.target_lang.upper()
        d.tokens = [replace(t, piece=t.piece.replace("W", tag, 1)) for t in d.tokens]
        return d


class BatchingEngine:
    def __init__(self, seam) -> None:
        self.seam = seam
        self.batches: list[list[str]] = []

    def draft_together(self, pairs):
        self.batches.append([t for t, _ in pairs])
        assert [t for t, _ in pairs] == [r.target_lang for _, r in pairs]
        return [self.seam.draft(r) for _, r in pairs]


class Multi:
    """The targets driven the synchronous way (plan, one batch, apply), for these tests."""

    def __init__(self, targets: Targets, engine: BatchingEngine) -> None:
        self.targets_, self.engine = targets, engine
        self.sessions, self.targets = targets.sessions, targets.targets

    def update(self, words, tail, final, uid=None):
        update = SourceUpdate.of(words, tail, final, uid)
        wanted = self.targets_.fit(self.targets_.plan(update))  # as the server: plan and fit all, one batch, apply all
        drafts = dict(zip((t for t, _ in wanted), self.engine.draft_together(wanted))) if wanted else {}
        return self.targets_.apply(update, drafts)


def multi(config: SessionConfig, fail_when=None, look_ahead=0, leak=""):
    seam = LangSeam(heads=UNION, fail_when=fail_when, look_ahead=look_ahead, leak=leak)
    engine = BatchingEngine(seam)
    sessions = {t: Session(HeadRows(seam, UNION, HEADS[t]), config, target_lang=t) for t in HEADS}
    return seam, engine, Multi(Targets(sessions), engine)


def test_targets_draft_in_one_batch_with_their_own_heads_and_text():
    seam, engine, m = multi(SessionConfig(policy=PolicyConfig(border_words=0)))
    steps = dict(m.update("the causal".split(), ["encoder"], False, 0))
    assert engine.batches == [["de", "fr"]] and seam.calls == 2
    assert steps["de"].committed_text == "DE0:the DE1:causal"
    assert steps["fr"].committed_text == "FR0:the FR1:causal"
    de, fr = (m.sessions[t].last_draft for t in ("de", "fr"))
    assert de.heads == HEADS["de"] and fr.heads == HEADS["fr"]
    assert de.tokens[0].rows.shape[0] == 2 and fr.tokens[0].rows.shape[0] == 2
    # fr's first head is the union's third: its rows are that head's rows
    raw = seam.draft(fr.request)
    assert (fr.tokens[0].rows[0] == raw.tokens[0].rows[2]).all()
    # a commit-only update: both targets take the fast path, no batch, no engine call
    steps = dict(m.update("the causal encoder".split(), [], False, 0))
    assert [s.path for s in steps.values()] == [FAST_PATH, FAST_PATH] and len(engine.batches) == 1


def test_each_target_behaves_as_its_own_single_target_session():
    cfg = SessionConfig(policy=PolicyConfig(border_words=1), max_new_tokens=3)
    _, _, m = multi(cfg)
    single = {t: Session(HeadRows(LangSeam(heads=UNION), UNION, HEADS[t]), cfg, target_lang=t) for t in HEADS}
    stream = [(["a"], ["b", "c"], False), (["a", "b"], ["c"], False), (["a", "b", "c"], ["d."], False),
              (["a", "b", "c", "d."], [], True), (["e"], ["f"], False)]
    for words, tail, final in stream:
        for t, step in m.update(words, tail, final):
            alone = single[t].update(words, tail, final)
            assert (step.committed_text, step.path, step.buffer_text) == \
                (alone.committed_text, alone.path, alone.buffer_text)


OPS = st.sampled_from(["arrive", "commit", "commit_all", "final", "rewrite", "skip", "skip_with_words",
                        "drop_tail", "fail"])


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    ops=st.lists(st.tuples(OPS, st.integers(1, 3)), min_size=1, max_size=30),
    border=st.integers(0, 2),
    hold_back=st.integers(0, 1),
    look_ahead=st.integers(0, 1),
    max_new=st.integers(1, 8),
    leak=st.booleans(),
)
def test_two_target_session_never_retracts_on_either_target(ops, border, hold_back, look_ahead, max_new, leak):
    fail = {"now": False}
    cfg = SessionConfig(policy=PolicyConfig(border_words=border, hold_back_words=hold_back),
                        max_new_tokens=max_new, limits=SessionLimits(max_utterance_words=12))
    seam, engine, m = multi(cfg, fail_when=lambda r: fail["now"], look_ahead=look_ahead,
                            leak="Mehr. Text" if leak else "")
    source = SourceOps()
    shown = {t: "" for t in m.targets}
    for op, n in ops:
        is_final = source.apply(op, n)
        if op in ("skip", "skip_with_words"):
            shown = {t: "" for t in m.targets}
        calls, batches = seam.calls, len(engine.batches)
        fail["now"] = op == "fail"
        try:
            steps = m.update(source.committed, source.tail, is_final, source.uid)
        except RuntimeError:
            assert op == "fail" and all(m.sessions[t].committed_text == shown[t] for t in m.targets)
            continue
        assert len(engine.batches) - batches <= 1  # the targets' drafts went together
        assert sum(s.engine_calls for _, s in steps) == seam.calls - calls
        assert [t for t, _ in steps] == ["de", "fr"]
        for t, step in steps:
            assert step.engine_calls <= 1
            if step.path in (FAST_PATH, UNCHANGED, FINAL_CACHED):
                assert step.engine_calls == 0
            assert step.committed_text.startswith(shown[t]), (t, shown[t], step.committed_text)
            assert step.committed_text == shown[t] + step.committed_delta
            assert "W" not in step.committed_text and (not step.committed_text or t.upper() in step.committed_text)
        if steps[0][1].final:
            source.new_utterance(steps[0][1].utterance_id + 1)
            shown = {t: "" for t in m.targets}
        else:
            shown = {t: s.committed_text for t, s in steps}


def test_an_update_a_target_refuses_is_refused_before_any_draft():
    from alignatt.serve.limits import UpdateRejected

    seam, engine, m = multi(SessionConfig())
    m.update("the causal".split(), ["encoder"], False, 0)
    m.update(["next"], [], False, 1)  # the client moved on to utterance 1
    calls, batches = seam.calls, len(engine.batches)
    import pytest

    with pytest.raises(UpdateRejected, match="utterance_id 0 is behind the open utterance 1"):
        m.update("the causal encoder".split(), ["again"], False, 0)
    assert (seam.calls, len(engine.batches)) == (calls, batches)  # no target drafted
    with pytest.raises(UpdateRejected):
        m.targets_.plan(SourceUpdate.of(["x"], [], False, 0))
