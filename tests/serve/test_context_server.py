"""Context, history and several targets over a real WebSocket (protocol v1 and its opt-in extension)."""

import json
from contextlib import contextmanager

from alignatt.core.prompt import ContextConfig
from alignatt.serve.server import ServerThread
from tests.support.server_client import Client, FakeFactory, fake_config

SRC = "the causal encoder processes each block once.".split()
HISTORY = [[f"source {i}.", f"Ziel {i}."] for i in range(12)]


@contextmanager
def server(tmp_path, directions=("en-de",), **context):
    cfg = fake_config(tmp_path, directions)
    cfg.context = ContextConfig(**context)
    factory = FakeFactory()
    with ServerThread(cfg, factory) as handle:
        handle.factory = factory
        yield handle


def test_init_ok_lists_the_effective_config(tmp_path):
    with server(tmp_path, history_pairs=2) as srv, Client(srv.url) as c:
        ok = c.init(preset="quality", overrides={"translation_alignatt_min_emit_target_units": 2, "beam": 3},
                    context_text="  Glossary: encoder = Kodierer  ", history=HISTORY[:1])
        assert ok["direction"] == "en-de" and ok["source_lang"] == "en" and ok["target_lang"] == "de"
        assert ok["preset"] == "high_latency" and ok["unknown_overrides"] == ["beam"]
        session = ok["session"]
        assert session["policy"] == ok["policy"] and session["policy"]["min_emit_words"] == 2
        assert session["policy"]["border_words"] == 2 and session["policy"]["hold_back_words"] == 1  # preset values
        assert session["max_new_tokens"] == 16 and session["context"]["history_pairs"] == 2
        assert session["policy"]["max_context_share"] == 0.5
        assert ok["head_set"].endswith("en-de.json") and ok["heads"] == [[0, 0], [0, 1]]
        assert ok["context_chars"] == len("Glossary: encoder = Kodierer")
        assert (ok["history_received"], ok["history_used"], ok["history_trimmed"]) == (1, 1, 0)
        assert "targets" not in ok


def test_history_longer_than_the_bound_is_trimmed_and_the_trim_reported(tmp_path):
    with server(tmp_path, history_pairs=3) as srv, Client(srv.url) as c:
        ok = c.init(history=HISTORY)
        assert (ok["history_received"], ok["history_used"], ok["history_trimmed"]) == (12, 3, 9)
        c.ask(SRC[:2], SRC[2:3])
        request = srv.factory.seams[0].requests[-1]
        assert request.history == [tuple(p) for p in HISTORY[-3:]]  # the newest turns, oldest first
    with server(tmp_path, history_pairs=0) as srv, Client(srv.url) as c:
        ok = c.init(history=HISTORY[:2])
        assert (ok["history_used"], ok["history_trimmed"]) == (0, 2)
        c.ask(SRC[:2])
        assert srv.factory.seams[0].requests[-1].history == []


def test_context_and_history_past_their_bounds_get_bad_protocol(tmp_path):
    with server(tmp_path, max_context_chars=20, max_history_entry_chars=10) as srv, Client(srv.url) as c:
        err = c.init(context_text="x" * 21)
        assert err["type"] == "error" and err["code"] == "bad_protocol"
        assert "context_text of 21 characters exceeds the 20-character bound" in err["message"]
        err = c.init(history=[["ok", "ok"], ["fine", "y" * 11]])
        assert err["code"] == "bad_protocol" and "history[1]" in err["message"]
        assert c.init(context_text="x" * 20)["type"] == "init_ok"  # nothing was lost: init still works


def test_context_and_history_reach_every_draft_and_the_final_closes_into_history(tmp_path):
    with server(tmp_path) as srv, Client(srv.url) as c:
        c.init(context_text="Names: Dr. Kowalczyk.", history=HISTORY[:1])
        c.ask(SRC[:3], SRC[3:5])
        c.ask(SRC, final=True)
        c.ask(["next"], utterance_id=1)
        first, final, nxt = srv.factory.seams[0].requests
        assert first.context_text == final.context_text == nxt.context_text == "Names: Dr. Kowalczyk."
        assert first.history == final.history == [tuple(HISTORY[0])]
        assert nxt.history[-1][0] == " ".join(SRC) and nxt.history[-1][1].endswith("W6:once.")


def test_a_chunked_history_grows_by_whole_utterances_and_is_cut_back_to_the_bound(tmp_path):
    """history_window chunked: the closed utterances accumulate (the prompt only grows at its end, so
    the engine's prefix cache serves the earlier turns) up to 2 x history_pairs - 1, then the newest
    history_pairs stay."""
    with server(tmp_path, history_pairs=2, history_window="chunked") as srv, Client(srv.url) as c:
        c.init()
        for utterance in range(5):
            c.ask([f"w{utterance}", "end."], final=True, utterance_id=utterance)
        turns = [len(r.history) for r in srv.factory.seams[0].requests]
        assert turns == [0, 1, 2, 3, 2]
        last = srv.factory.seams[0].requests[-1].history
        assert [t[0] for t in last] == ["w2 end.", "w3 end."]


# ---- several targets (opt-in) ----

def test_plain_v1_client_sees_no_target_fields(tmp_path):
    with server(tmp_path, directions=("en-de", "en-fr")) as srv, Client(srv.url) as c:
        ok = c.init()
        assert "targets" not in ok
        c.update(SRC[:3], SRC[3:5])
        reply = c.recv()
        assert reply["type"] == "translation" and "target_lang" not in reply
        assert set(reply) == {"type", "seq", "utterance_id", "final", "forced_final", "committed_text",
                              "committed_delta", "buffer_text", "covered_source_units", "stop_reason", "path",
                              "engine_calls", "compute_ms", "server_ms"}


def test_two_target_session_answers_each_update_per_target(tmp_path):
    with server(tmp_path, directions=("en-de", "en-fr")) as srv, Client(srv.url) as c:
        ok = c.init(target_langs=["de", "fr"])
        assert [t["target_lang"] for t in ok["targets"]] == ["de", "fr"]
        assert [t["heads"] for t in ok["targets"]] == [[[0, 0], [0, 1]], [[1, 0], [1, 1]]]
        c.update(SRC[:3], SRC[3:5])
        a, b = c.recv(), c.recv()
        assert (a["target_lang"], b["target_lang"]) == ("de", "fr") and a["seq"] == b["seq"] == 1
        assert a["path"] == b["path"] == "draft"
        c.update(SRC[:4], SRC[4:5])  # commit only: both fast paths
        a, b = c.recv(), c.recv()
        assert a["path"] == b["path"] == "fast_path" and a["engine_calls"] == b["engine_calls"] == 0
        (seam,) = srv.factory.seams
        assert [r.target_lang for r in seam.requests] == ["de", "fr"]


def test_target_langs_must_be_served_and_include_target_lang(tmp_path):
    with server(tmp_path, directions=("en-de", "en-fr")) as srv, Client(srv.url) as c:
        err = c.init(target_langs=["de", "zh"])
        assert err["code"] == "unsupported_direction" and err["supported"] == ["en-de", "en-fr"]
        err = c.init(target_lang="de", target_langs=["fr"])
        assert err["code"] == "bad_protocol" and "not one of target_langs" in err["message"]
        assert c.init(target_langs=["de", "fr"])["type"] == "init_ok"


def test_two_targets_draft_in_one_engine_batch_through_the_scheduler(tmp_path):
    from tests.fakes.batch_fakes import StandInBatchSeam
    from tests.fakes.mt_fakes import FakeSeam

    seams = []

    def factory(route, heads):
        seam = StandInBatchSeam(steps_for=lambda r: 3)
        seam.inner = FakeSeam(heads=heads)
        seams.append(seam)
        return seam

    with ServerThread(fake_config(tmp_path, ("en-de", "en-fr")), factory) as srv, Client(srv.url) as c:
        c.init(target_langs=["de", "fr"])
        c.update(SRC[:3], SRC[3:5])
        a, b = c.recv(), c.recv()
        assert (a["target_lang"], b["target_lang"]) == ("de", "fr") and a["engine_calls"] == b["engine_calls"] == 1
        (seam,) = seams
        assert [r.target_lang for _, r in seam.submitted] == ["de", "fr"]
        assert max(len(batch) for batch in seam.batches) == 2  # both targets' drafts in the engine at once
        assert a["committed_text"] == "W0:the W1:causal" == b["committed_text"]


# ---- what init may seed, and what it refuses (issue 25) ----

def test_the_prefix_and_history_seed_target_lang_not_the_first_of_target_langs(tmp_path):
    with server(tmp_path, directions=("en-de", "en-it")) as srv, Client(srv.url) as c:
        ok = c.init(target_lang="de", target_langs=["it", "de"], accepted_target_prefix="Das Wetter ist",
                    history=HISTORY[:1])
        assert ok["target_lang"] == "de" and ok["direction"] == "en-de" and ok["head_set"].endswith("en-de.json")
        assert [t["target_lang"] for t in ok["targets"]] == ["it", "de"]
        assert ok["history_used"] == 1
        c.update(SRC[:3], SRC[3:5])
        replies = {r["target_lang"]: r for r in (c.recv(), c.recv())}
        assert replies["de"]["committed_text"].startswith("Das Wetter ist")
        assert "Das Wetter" not in replies["it"]["committed_text"]
        by_target = {r.target_lang: r for r in srv.factory.seams[0].requests}
        assert by_target["de"].target_prefix == "Das Wetter ist" and by_target["it"].target_prefix == ""
        assert by_target["de"].history == [tuple(HISTORY[0])] and by_target["it"].history == []


def test_the_prompt_builders_source_marker_in_context_or_history_is_refused_at_init(tmp_path):
    from alignatt.core.prompt import SOURCE_MARK

    with server(tmp_path) as srv, Client(srv.url) as c:
        for fields in ({"context_text": SOURCE_MARK}, {"context_text": f"Glossar {SOURCE_MARK} Ende"},
                       {"history": [["a", "b"], ["c", SOURCE_MARK]]}):
            err = c.init(**fields)
            assert err["type"] == "error" and err["code"] == "bad_protocol" and "source marker" in err["message"]
        assert c.init(context_text="\ue000 alone is text")["type"] == "init_ok"
        assert c.ask(SRC[:2])["type"] == "translation"


def test_a_refused_update_of_a_four_target_session_runs_no_draft(tmp_path):
    targets = ("de", "fr", "it", "cs")
    with server(tmp_path, directions=tuple(f"en-{t}" for t in targets)) as srv, Client(srv.url) as c:
        assert c.init(target_langs=list(targets))["type"] == "init_ok"
        c.update(SRC[:2], utterance_id=1)
        assert [c.recv()["target_lang"] for _ in targets] == list(targets)
        (seam,) = srv.factory.seams
        calls = seam.calls
        c.update(SRC[:3], SRC[3:4], utterance_id=0)  # going back
        err = c.recv()
        assert err["type"] == "error" and err["code"] == "bad_protocol" and "behind" in err["message"]
        assert seam.calls == calls


def test_error_frames_about_targets_never_echo_a_huge_input(tmp_path):
    with server(tmp_path, directions=("en-de", "en-fr")) as srv, Client(srv.url) as c:
        for langs in (["de", "x" * 60_000], ["de"] + [f"q{i}" for i in range(15)], ["de", "fr", "w" * 32]):
            c.send({"type": "init", "protocol_version": 1, "source_lang": "en", "target_lang": "de",
                    "target_langs": langs})
            err = c.recv()
            assert err["type"] == "error" and len(json.dumps(err)) < 1200, len(json.dumps(err))
        err = c.init(source_lang="y" * 32, target_lang="z" * 32)
        assert err["code"] == "unsupported_direction" and len(err["message"]) <= 500
        c.send({"type": "init", "protocol_version": 1, "source_lang": "en", "target_lang": "de",
                "target_langs": ["de", "x" * 240_000]})  # past the frame bound before init: then the close
        err = c.recv()
        assert err["code"] == "bad_protocol" and len(json.dumps(err)) < 300
