"""A session that stops drafts once the policy's answer is known (`settle_buffer_tokens`) commits
exactly what a session drafting whole drafts commits, update by update; only the shown buffer is
shorter. A commit-only update that would re-judge a settled draft past its end drafts again; the
server hands its option to every session."""

import pytest

from alignatt.capture.hf.qk_fast import HFQKFastSeam
from alignatt.core.draft import Head
from alignatt.core.policy import POLICY_PRESETS
from alignatt.core.settle import SETTLED
from alignatt.serve.server import ServerThread
from alignatt.serve.session import DRAFT, FAST_PATH, Session, SessionConfig
from tests.fakes.mt_fakes import FakeSeam
from tests.support.server_client import Client, FakeFactory, fake_config

WORDS = "the causal encoder processes each block once and then it stops .".split()


def stream(words):
    """A growing utterance: one word committed per update, three words of tail, commit-only
    updates between (the tail became committed), then the final."""
    updates = []
    for c in range(1, len(words) - 2, 2):
        updates.append((words[:c], words[c:c + 3], False))
        updates.append((words[:c + 2], words[c + 2:c + 3], False))  # commits the first two tail words
    updates.append((words, [], True))
    return updates


def run(seam, buffer, preset="balanced", words=WORDS, **config):
    s = Session(seam, SessionConfig(policy=POLICY_PRESETS[preset], settle_buffer_tokens=buffer, **config))
    return s, [s.update(*u) for u in stream(words)]


@pytest.mark.parametrize("preset", sorted(POLICY_PRESETS))
@pytest.mark.parametrize("buffer", [0, 2])
def test_a_settling_session_commits_what_a_whole_draft_session_commits(preset, buffer):
    whole_session, whole = run(FakeSeam(), None, preset)
    settled_session, settled = run(FakeSeam(), buffer, preset)
    assert [s.committed_text for s in settled] == [s.committed_text for s in whole]
    for a, b in zip(settled, whole):
        assert b.buffer_text.startswith(a.buffer_text)  # the buffer is the whole draft's, cut
    drafts = [s.policy for s in settled if s.path == DRAFT]
    assert drafts and all(len(p.decisions) - p.emit_count <= buffer + 1 + 1 for p in drafts)
    assert settled_session.last_draft is None or settled_session.last_draft.stop_reason != "max_new_tokens"


def test_a_commit_only_update_past_a_settled_drafts_end_drafts_again():
    seam = FakeSeam()
    s = Session(seam, SessionConfig(policy=POLICY_PRESETS["balanced"], settle_buffer_tokens=0))
    first = s.update(WORDS[:2], WORDS[2:8], False)  # held at word 1: the draft is cut to 2 tokens
    assert first.path == DRAFT and s.last_draft.stop_reason == SETTLED and len(s.last_draft.tokens) == 2
    again = s.update(WORDS[:5], WORDS[5:8], False)  # every kept token passes now: the whole draft went on
    assert again.path == DRAFT and seam.calls == 2
    assert again.committed_text == "W0:the W1:causal W2:encoder W3:processes"


def test_a_commit_only_update_within_a_settled_draft_is_re_judged_without_the_engine():
    seam = FakeSeam()
    s = Session(seam, SessionConfig(policy=POLICY_PRESETS["balanced"], settle_buffer_tokens=2))
    s.update(WORDS[:2], WORDS[2:8], False)  # held at word 1, two tokens of buffer: 4 tokens
    assert len(s.last_draft.tokens) == 4
    moved = s.update(WORDS[:3], WORDS[3:8], False)  # word 2 is the border now: held inside the draft
    assert moved.path == FAST_PATH and seam.calls == 1 and moved.committed_text == "W0:the W1:causal"


def test_a_real_model_session_commits_the_same_text_with_settled_drafts(tiny_gemma4):
    shown = {}
    for buffer in (None, 1):
        seam = HFQKFastSeam(tiny_gemma4, [Head(4, 0), Head(1, 1)], decode="dynamic")
        _, steps = run(seam, buffer, words="the quick brown fox jumps over the lazy dog .".split(),
                       max_new_tokens=6)
        shown[buffer] = steps
    assert [s.committed_text for s in shown[1]] == [s.committed_text for s in shown[None]]
    assert any(len(a.buffer_text) < len(b.buffer_text) for a, b in zip(shown[1], shown[None]))


def test_the_server_gives_every_session_its_settle_option(tmp_path):
    factory = FakeFactory()
    config = fake_config(tmp_path).model_copy(update={"settle_buffer_tokens": 1})
    with ServerThread(config, factory) as srv, Client(srv.url) as c:
        c.init(preset="balanced")
        c.ask(WORDS[:3], WORDS[3:6])
        final = c.ask(WORDS[:6], final=True)
        assert final["final"] is True
    first, last = factory.seams[0].requests[0], factory.seams[0].requests[-1]
    assert first.settle is not None and first.settle.buffer_tokens == 1 and first.settle.border_words == 1
    assert last.final and last.settle is None  # a final runs to its end


def test_the_cli_options_reach_the_server_config_and_a_negative_buffer_is_refused():
    from alignatt.core.errors import AlignattError
    from alignatt.serve.config import server_config

    assert server_config(settle_buffer_tokens=3).settle_buffer_tokens == 3
    assert server_config().settle_buffer_tokens is None
    with pytest.raises(AlignattError, match="settle_buffer_tokens"):
        server_config(settle_buffer_tokens=-1)
