"""Several server processes on one port sharing one engine process (`ServerConfig.front_ends`), on
CPU with stand-in seams: one engine step serves every front end's waiting drafts, a front end that
leaves takes only its drafts with it, connections on the one port reach both processes and draft in
the one engine, sessions count once against max_sessions, and the stats add up."""

import os
import signal
import threading
import time

import pytest
from websockets.exceptions import ConnectionClosed

from alignatt.core.draft import DraftRequest
from alignatt.core.errors import AlignattError
from alignatt.measure.capacity_levels import engine_level, merge_front_ends
from alignatt.serve.config import DirectionRoute, ServerConfig
from alignatt.serve.engine_client import ProcessBatchSeam
from alignatt.serve.engine_process import EngineSpec
from alignatt.serve.scheduler import EngineDied
from alignatt.serve.server import ServerThread
from tests.fakes.mt_fakes import target_word
from tests.fakes.replica_fakes import (drafts_by_process, no_leaked_processes, preparing_factory,  # noqa: F401
                                      recording_factory)
from tests.support.server_client import Client, fake_config, http_get


def request(*words: str) -> DraftRequest:
    return DraftRequest(source_words=list(words), committed_words=len(words))


def translated(words) -> str:
    return " ".join(target_word(j, w) for j, w in enumerate(words))


def test_one_engine_step_serves_the_drafts_every_front_end_has_waiting():
    route = DirectionRoute(model="fake", seam="fake", heads=None, seam_options={"steps": 2})
    first = ProcessBatchSeam(EngineSpec(preparing_factory, route, []), "shared", front_ends=2)
    second = ProcessBatchSeam.attached(first.handoffs[0])
    try:
        assert second.pid == first.pid and second.name == first.name  # one child, `Ready` to each
        a, b = first.submit(request("a", "x")), second.submit(request("b", "y"))
        # Both steps reach the child while it is stopped: it reads them together and steps once for both.
        os.kill(first.pid, signal.SIGSTOP)
        replies: dict = {}
        threads = [threading.Thread(target=lambda s=s: replies.setdefault(s, s.step())) for s in (first, second)]
        for t in threads:
            t.start()
        time.sleep(0.3)
        os.kill(first.pid, signal.SIGCONT)
        for t in threads:
            t.join(30)
        assert replies[first] == [] and replies[second] == []  # each draft takes two steps
        # the same step, counted and timed once, with both front ends' drafts in its batch
        assert first.child == second.child and first.child.steps == 1 and first.child.drafts == 2
        assert first.child.wall_s > 0
        assert first.has_unfinished() and second.has_unfinished()
        done = {s: dict(s.step()) for s in (first, second)}
        assert done[first][a].text == translated(["a", "x"]) and done[second][b].text == translated(["b", "y"])
        assert not first.step() and not second.step()  # the steps each sent ahead come back empty
        # A front end that leaves takes its running draft with it; the engine serves the other on.
        second.submit(request("c"))
        d = first.submit(request("d"))
        second.step()
        second.close()
        assert first.alive
        finished = {}
        while first.has_unfinished():
            finished.update(first.step())
        assert set(finished) == {d} and finished[d].text == translated(["d"])  # c's draft left with `second`
    finally:
        first.close()
        second.close()


def test_an_engine_outlives_no_server_and_its_other_front_ends_see_it_gone():
    route = DirectionRoute(model="fake", seam="fake", heads=None)
    first = ProcessBatchSeam(EngineSpec(preparing_factory, route, []), "owned", front_ends=2)
    second = ProcessBatchSeam.attached(first.handoffs[0])
    try:
        first.close()
        assert second.wait_exited(10) and not second.alive
        with pytest.raises(EngineDied, match=r"process \d+\) stopped: exited"):
            second.submit(request("a"))
            second.step()
    finally:
        second.close()


def served(tmp_path, front_ends: int = 2, max_sessions: int = 32, drain_s: float = 30.0) -> ServerThread:
    record_dir = tmp_path / "drafts"
    record_dir.mkdir()
    config = fake_config(tmp_path, max_sessions=max_sessions)
    config.directions = {d: r.model_copy(update={"seam_options": {"record_dir": str(record_dir), "delay_s": 0.002}})
                         for d, r in config.directions.items()}
    config.front_ends, config.drain_s = front_ends, drain_s
    srv = ServerThread(config, recording_factory)
    srv.record_dir = record_dir
    return srv


def per_front_end(srv) -> list[int]:
    """Sessions each front end holds, the first one's first."""
    snapshot = srv.call(srv.server.snapshot)
    return [snapshot["sessions_active"]] + [s["sessions_active"] if s else 0 for s in snapshot["front_ends"]]


def spread(srv, at_most: int = 32) -> list[Client]:
    """Sessions opened until every front end holds one (the kernel deals the connections by a hash of
    their addresses: 32 all dealt to one of two is a chance of 2^-31)."""
    clients: list[Client] = []
    while min(per_front_end(srv)) == 0 and len(clients) < at_most:
        clients.append(Client(srv.url))
        assert clients[-1].init()["type"] == "init_ok"
    assert min(per_front_end(srv)) >= 1, per_front_end(srv)
    return clients


def closed_with(c: Client) -> int | None:
    """The close code the client reads once the server closes its connection (replies before it read)."""
    while True:
        try:
            c.recv()
        except ConnectionClosed as e:
            return e.rcvd.code if e.rcvd else None


def test_front_ends_share_the_port_the_engine_and_the_session_count(tmp_path):
    limit = 32
    with served(tmp_path, max_sessions=limit) as srv:
        clients = spread(srv, limit)
        try:
            while len(clients) < limit:
                clients.append(Client(srv.url))
                assert clients[-1].init()["type"] == "init_ok"
            # One count against max_sessions, whichever process holds the sessions.
            refused = Client(srv.url)
            assert refused.init()["code"] == "busy"
            refused.close()
            status, health = http_get(srv, "/health")
            assert status == 503 and health["status"] == "full" and health["sessions_active"] == limit
            for i, c in enumerate(clients):
                words = [f"s{i}w{j}" for j in range(4)]
                for k in range(1, len(words)):
                    c.ask(words[:k], words[k:])
                final = c.ask(words, final=True)
                assert final["committed_text"] == translated(words)
            # Every draft of every front end ran in the one engine process, none in a server.
            drafted = drafts_by_process(srv.record_dir)
            engine_pid = srv.server.registry.engines[0].seam.pid
            assert set(drafted) == {engine_pid} and os.getpid() != engine_pid
            assert {w.split("w")[0] for w in drafted[engine_pid]} == {f"s{i}" for i in range(limit)}
            # Per engine, the front ends' figures add up to every session and every final.
            snapshot = srv.call(srv.server.snapshot)  # the first front end's /stats names each process
            assert snapshot["front_end"] == 0 and [s["front_end"] for s in snapshot["front_ends"]] == [1]
            merged = merge_front_ends(srv.call(srv.server.engine_stats))
            assert len(merged) == 1 and merged[0]["admitted"] == limit and merged[0]["failed"] == 0
            assert merged[0]["finished"] >= limit and sum(merged[0]["batch_sizes"].values()) == merged[0]["steps"]
            # The engine's own steps, once each, reach the level beside the front ends' (summed) steps.
            level = engine_level({}, merged[0])
            assert level["child_steps"] > 0 and level["child_batch_mean"] >= 1
        finally:
            for c in clients:
                c.close()
    assert not srv._thread.is_alive()


def test_a_drain_reaches_every_front_end(tmp_path):
    with served(tmp_path, drain_s=0.5) as srv:
        clients = spread(srv)
        try:
            srv.drain()
            assert [closed_with(c) for c in clients] == [1012] * len(clients)  # told to reconnect, every one
            assert srv.call(lambda: srv.server.slots.count) == 0
        finally:
            for c in clients:
                c.close()


def test_a_front_end_that_dies_takes_only_its_sessions_and_gives_back_their_slots(tmp_path):
    with served(tmp_path) as srv:
        clients = spread(srv)
        try:
            mine = srv.call(lambda: srv.server.stats.sessions_active)
            os.kill(srv.server.front_ends._processes[0].pid, signal.SIGKILL)
            deadline = time.monotonic() + 10
            while not srv.server.front_ends.lost and time.monotonic() < deadline:
                time.sleep(0.05)
            assert srv.server.front_ends.lost == {1} and srv.call(lambda: srv.server.slots.count) == mine
            status, health = http_get(srv, "/health")  # only the first front end listens now
            assert status == 200 and health["status"] == "degraded" and health["front_ends_lost"] == 1
            survived = 0
            for i, c in enumerate(clients):
                words = [f"s{i}w{j}" for j in range(3)]
                try:
                    reply = c.ask(words, final=True)
                except ConnectionClosed:
                    continue
                assert reply["committed_text"] == translated(words)
                survived += 1
            assert survived == mine and 0 < mine < len(clients)
            late = Client(srv.url)  # the engine serves on, for the first front end
            clients.append(late)
            assert late.init()["type"] == "init_ok"
            assert late.ask(["late", "words"], final=True)["committed_text"] == translated(["late", "words"])
        finally:
            for c in clients:
                c.close()


def test_front_ends_need_the_engines_loaded_before_listening():
    with pytest.raises(ValueError, match="front_ends above 1 needs preload"):
        ServerConfig(front_ends=2, preload=False)
    from alignatt.serve.config import server_config

    with pytest.raises(AlignattError, match="front_ends"):
        server_config(front_ends=0)
