"""A slow engine is not a dead one (issue 42, Medium), on CPU with stand-in seams in child processes.

An engine process beats a heartbeat from a thread of its own, so it answers while its one engine
thread computes; a step is bounded by its work (`ReplicaConfig.step_token_s` per token of the
drafts running), not by one fixed deadline; a draft whose bound passes `max_step_s` is refused
before it runs. And when every engine is gone, every open session is told (`processing_failed`,
then 1012) within the failover bound, and `/health` says down.
"""

import os
import signal
import time
from contextlib import contextmanager

from websockets.exceptions import ConnectionClosed

from alignatt.core.draft import Draft, DraftRequest, Head
from alignatt.serve.config import ReplicaConfig
from alignatt.serve.server import ServerThread
from tests.fakes.replica_fakes import RecordingSeam, no_leaked_processes, process_of  # noqa: F401 - autouse
from tests.support.server_client import Client, fake_config, health

DEADLINE_S, HEARTBEAT_S = 1.0, 0.2
STEP_TOKEN_S = 0.3  # a final of two words may make 3 x 2 + 8 = 14 tokens: its step's bound is 1 + 4.2 s
SLOW_S = 2.5  # past the fixed deadline, within the work bound


class ComputingSeam(RecordingSeam):
    """Drafts a source holding `slow_word` by computing (a busy loop, holding the interpreter
    between switches, as a model's host code does) for `slow_s` seconds."""

    def __init__(self, heads: list[Head], slow_word: str = "SLOW", slow_s: float = 0.0, **options) -> None:
        super().__init__(heads, **options)
        self.slow_word, self.slow_s = slow_word, slow_s

    def draft(self, request: DraftRequest) -> Draft:
        if self.slow_word in request.source_words:
            end = time.monotonic() + self.slow_s
            while time.monotonic() < end:
                sum(range(2000))
        return super().draft(request)


def computing_factory(route, heads: list[Head]) -> ComputingSeam:
    return ComputingSeam(heads, **route.seam_options)


@contextmanager
def slow_server(tmp_path, engines=1, slow_s=SLOW_S, **replicas):
    record_dir = tmp_path / "drafts"
    record_dir.mkdir()
    config = fake_config(tmp_path, max_sessions=8)
    options = {"record_dir": str(record_dir), "slow_s": slow_s}
    config.directions = {d: r.model_copy(update={"seam_options": options}) for d, r in config.directions.items()}
    config.engines = engines
    config.replicas = ReplicaConfig(**{"step_deadline_s": DEADLINE_S, "heartbeat_s": HEARTBEAT_S,
                                       "step_token_s": STEP_TOKEN_S, "own_process": True, **replicas})
    with ServerThread(config, computing_factory) as srv:
        srv.record_dir = record_dir
        yield srv


def engine_states(srv) -> list[str]:
    return srv.call(lambda: [e.state for e in srv.server.registry.engines])


def test_a_slow_final_past_the_fixed_deadline_is_answered_and_its_engine_kept(tmp_path):
    with slow_server(tmp_path) as srv, Client(srv.url, timeout=30) as slow, Client(srv.url) as beside:
        assert slow.init()["type"] == "init_ok" and beside.init()["type"] == "init_ok"
        started = time.monotonic()
        reply = slow.ask(["SLOW", "word"], final=True)
        took = time.monotonic() - started
        assert reply["type"] == "translation" and reply["final"], reply
        assert took > DEADLINE_S + HEARTBEAT_S  # it did run past the fixed deadline
        assert engine_states(srv) == ["live"]
        # The session beside it was never told to reconnect, and goes on.
        assert beside.ask(["next", "words"], final=True)["type"] == "translation"
        assert srv.call(lambda: srv.server.stats.closes["engine_died"]) == 0


def test_a_step_past_its_work_bound_is_taken_out_though_its_heartbeat_beats(tmp_path):
    # 60 s of computing for 14 tokens of work: past 1 + 14 x 0.3 s, the engine is hung, heartbeat or not.
    with slow_server(tmp_path, slow_s=60.0) as srv, Client(srv.url, timeout=30) as c:
        assert c.init()["type"] == "init_ok"
        asked = time.monotonic()
        c.update(["SLOW", "word"], final=True)
        error = c.recv(timeout=15)
        assert error["type"] == "error" and error["code"] == "processing_failed", error
        assert "work" in error["message"] and "reconnect" in error["message"]
        assert time.monotonic() - asked < DEADLINE_S + 14 * STEP_TOKEN_S + HEARTBEAT_S + 3.0
        assert engine_states(srv) == ["hung"]


def test_a_stopped_engine_is_noticed_by_its_heartbeat_mid_step(tmp_path):
    # Stopped while it computes a draft whose work bound is long: the heartbeat stops, so the
    # fixed deadline applies, not the work bound.
    with slow_server(tmp_path, slow_s=30.0) as srv, Client(srv.url, timeout=30) as c:
        assert c.init()["type"] == "init_ok"
        assert c.ask(["first", "words"], final=True)["type"] == "translation"
        (pid,) = process_of(srv.record_dir, "first")
        c.update(["SLOW", "word"], final=True, utterance_id=1)
        time.sleep(0.3)
        stopped = time.monotonic()
        os.kill(pid, signal.SIGSTOP)
        error = c.recv(timeout=15)
        assert error["code"] == "processing_failed" and "heartbeat" in error["message"], error
        assert time.monotonic() - stopped < DEADLINE_S + HEARTBEAT_S + 2.0


def test_a_final_too_large_for_its_bound_is_refused_before_it_runs(tmp_path):
    # max_step_s 8: a final of 20 words (3 x 20 + 8 = 68 new tokens + 20 words: 1 + 26.4 s) cannot be
    # bounded in it; one of 2 words (14 + 2: 1 + 4.8 s) can.
    with slow_server(tmp_path, max_step_s=8.0) as srv, Client(srv.url) as c:
        assert c.init()["type"] == "init_ok"
        words = [f"w{i}" for i in range(20)]
        reply = c.ask(words, final=True)
        assert reply["type"] == "error" and reply["code"] == "bad_protocol", reply
        assert "too large" in reply["message"] and "max_step_s" in reply["message"]
        assert not process_of(srv.record_dir, "w0")  # it never reached the engine
        # The session goes on: a short final in the next utterance is answered.
        again = c.ask(["short", "one"], final=True, utterance_id=1)
        assert again["type"] == "translation", again
        assert engine_states(srv) == ["live"]


def test_when_every_engine_is_gone_every_open_session_is_told_and_health_says_down(tmp_path):
    with slow_server(tmp_path, engines=2) as srv:
        clients = [Client(srv.url) for _ in range(4)]
        try:
            for i, c in enumerate(clients):
                assert c.init()["type"] == "init_ok"
                assert c.ask([f"s{i}a", f"s{i}b"], final=True)["type"] == "translation"
            pids = srv.call(lambda: [e.stats()["pid"] for e in srv.server.registry.engines])
            assert len(set(pids)) == 2
            killed = time.monotonic()
            for pid in pids:
                os.kill(pid, signal.SIGKILL)
            bound = DEADLINE_S + HEARTBEAT_S + 2.0  # the failover's bound, plus room for a loaded CPU
            for c in clients:  # told without sending anything
                error = c.recv(timeout=bound + 5)
                assert error["code"] == "processing_failed" and "reconnect" in error["message"]
                try:
                    c.recv(timeout=5)
                    code = None
                except ConnectionClosed as e:
                    code = e.rcvd.code if e.rcvd else None
                assert code == 1012
            assert time.monotonic() - killed <= bound + 1.0
            status, body = health(srv)
            assert status == 503 and body["status"] == "down" and body["engines_alive"] == 0
            with Client(srv.url) as late:
                refused = late.init()
                assert refused["type"] == "error" and refused["code"] == "processing_failed"
        finally:
            for c in clients:
                c.close()
