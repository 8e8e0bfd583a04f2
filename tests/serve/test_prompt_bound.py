"""The whole prompt within max_prompt_tokens, served: template, context_text, history (the client's
and the session's own closed utterances), source and prefix are counted before any engine work.

Through stand-in engines that tokenize like the real seams and record the prompt length each draft
received (tests/fakes/prompt_fakes.py): an over-long prompt gets `bad_protocol` naming the limit, at init
or at the update, and never reaches the engine.
"""

import pytest

from alignatt.serve.server import ServerThread
from tests.fakes.prompt_fakes import TokenizerSeam, stand_in_vllm_class
from tests.support.server_client import Client, fake_config

DIGITS_CONTEXT = "1" * 2000  # the reproduction: one token per digit
DIGITS_HISTORY = [["2" * 1000, "3" * 1000]]
WORDS = "the model reads each block once and then it writes what it read".split()


@pytest.fixture
def served(tmp_path, tiny_gemma4):
    """A server over one stand-in engine; yields (server, its seams)."""

    def start(kind="hf", max_model_len=4096, **limits):
        seams = []

        def factory(route, heads):
            if kind == "hf":
                seam = TokenizerSeam(tiny_gemma4, heads)
            else:
                seam = stand_in_vllm_class()(tiny_gemma4.tokenizer, heads, max_model_len)
            seams.append(seam)
            return seam

        cfg = fake_config(tmp_path, **limits)
        cfg.context.max_context_chars = 4000
        cfg.context.max_history_entry_chars = 2000
        return ServerThread(cfg, factory), seams

    return start


def test_context_and_history_past_the_prompt_bound_are_refused_at_init(served):
    handle, seams = served()
    with handle as srv, Client(srv.url) as c:
        err = c.init(context_text=DIGITS_CONTEXT, history=DIGITS_HISTORY)
        assert err["type"] == "error" and err["code"] == "bad_protocol", err
        assert "max_prompt_tokens=1792" in err["message"]  # tiny-gemma4's 2048 positions less a final's 256
        ok = c.init(context_text="1" * 500, history=[["2" * 300, "3" * 300]])  # nothing lost: init again
        assert ok["type"] == "init_ok"
        reply = c.ask(WORDS[:4], WORDS[4:6])
        assert reply["type"] == "translation"
    (seam,) = seams
    assert seam.received and max(seam.received) <= 1792


def test_the_sessions_own_history_never_takes_a_prompt_past_the_bound(served):
    handle, seams = served(max_prompt_tokens=600)  # tiny-gemma4's template alone is 183 tokens
    with handle as srv, Client(srv.url) as c:
        assert c.init(context_text="1" * 100)["type"] == "init_ok"
        long = [f"{i}" * 10 + "." for i in range(1, 8)]  # about 11 tokens a word
        for uid in range(4):  # each closed utterance joins the history of the next prompts
            assert c.ask(long[:3], long[3:5], utterance_id=uid)["type"] == "translation"
            assert c.ask(long, final=True, utterance_id=uid)["type"] == "translation"
        err = c.ask([f"{i}" * 60 for i in range(8)], utterance_id=4)  # the source alone is too long
        assert err["type"] == "error" and err["code"] == "bad_protocol" and "max_prompt_tokens=600" in err["message"]
        assert c.ask(["next"], utterance_id=4)["type"] == "translation"  # the session goes on
    (seam,) = seams
    assert len(seam.received) >= 8 and max(seam.received) <= 600
    assert max(seam.received) > 450  # the history did grow the prompts up to the bound


def test_a_vllm_engines_max_model_len_bounds_the_prompt_at_admission(served):
    handle, seams = served(kind="vllm", max_model_len=1024)
    with handle as srv, Client(srv.url) as c:
        err = c.init(context_text=DIGITS_CONTEXT[:900])
        assert err["code"] == "bad_protocol" and "max_prompt_tokens=768" in err["message"]
        assert "1024 positions" in err["message"]
        assert c.init()["type"] == "init_ok"
        err = c.ask([f"w{i}" + "q" * 30 for i in range(60)], final=True)
        assert err["type"] == "error" and err["code"] == "bad_protocol" and "max_prompt_tokens=768" in err["message"]
        assert c.ask(WORDS, final=True)["type"] == "translation"
    (seam,) = seams
    assert seam.received and max(seam.received) <= 768
