"""Several engines per route, one process each, on CPU with stand-in seams in child processes:
placement (least loaded, sticky), a process engine's typed errors and death, an engine killed
while sessions stream over real WebSockets (only its sessions fail, they resume on a survivor),
and the per-engine stats."""

import collections
import os
import signal
import threading
import time
from contextlib import contextmanager
from dataclasses import replace

import pytest
from websockets.exceptions import ConnectionClosed

from alignatt.core.draft import DraftRequest
from alignatt.core.errors import AlignattError
from alignatt.serve.config import DirectionRoute, ServerLimits, server_config
from alignatt.serve.pool import Engine, least_loaded
from alignatt.serve.engine_devices import replica_devices
from alignatt.serve.scheduler import EngineDied, SchedulerConfig
from alignatt.serve.server import ServerThread
from tests.fakes.mt_fakes import target_word
from tests.fakes.replica_fakes import (drafts_by_process, no_leaked_processes, preparing_factory,  # noqa: F401
                                      process_of, recording_factory)
from tests.support.server_client import Client, fake_config, http_get


@contextmanager
def replica_server(tmp_path, engines: int, max_sessions: int = 8, **seam_options):
    record_dir = tmp_path / "drafts"
    record_dir.mkdir()
    config = fake_config(tmp_path, max_sessions=max_sessions)
    options = {"record_dir": str(record_dir), **seam_options}
    config.directions = {d: r.model_copy(update={"seam_options": options}) for d, r in config.directions.items()}
    config.engines = engines
    with ServerThread(config, recording_factory) as srv:
        srv.record_dir = record_dir
        yield srv


def engine_stats(srv) -> list[dict]:
    return srv.call(lambda: [e.stats() for e in srv.server.registry.engines])


def words_of(i: int, u: int, n: int = 4) -> list[str]:
    return [f"s{i}u{u}w{j}" for j in range(n)]


def translated(words: list[str]) -> str:
    return " ".join(target_word(j, w) for j, w in enumerate(words))


def retractions(replies: list[dict]) -> int:
    shown: dict = {}
    count = 0
    for r in replies:
        if r.get("type") != "translation":
            continue
        if not r["committed_text"].startswith(shown.get(r["utterance_id"], "")):
            count += 1
        shown[r["utterance_id"]] = r["committed_text"]
    return count


# ---- where engines run, and which one a session gets ----


def test_engine_count_and_devices(monkeypatch):
    cpu, cuda = DirectionRoute(), DirectionRoute(device="cuda")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,5")
    assert replica_devices(cpu, "auto") == [None]  # today's single in-process engine
    assert replica_devices(cuda, "auto") == ["2", "5"]  # one process per visible GPU
    assert replica_devices(cpu, 3) == [None, None, None]
    assert replica_devices(cuda, 1) == [None]
    with pytest.raises(AlignattError, match="2 CUDA GPUs are visible"):
        replica_devices(cuda, 3)
    with pytest.raises(AlignattError, match="must be 'cuda'"):
        replica_devices(DirectionRoute(device="cuda:1"), 2)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "7")
    assert replica_devices(cuda, "auto") == [None]  # one GPU: in-process, as before
    assert server_config(engines="3").engines == 3 and server_config().engines == "auto"
    with pytest.raises(AlignattError, match="engines"):
        server_config(engines="many")


def test_alignatt_serve_runs_a_vllm_engine_on_cuda_in_a_process_of_its_own_unless_told_otherwise():
    """`alignatt serve`'s default (`--engine-process` unset): vllm_capture on CUDA in a child, where its
    thread never waits for the server's interpreter lock; other seams, or CPU, in the server's process."""
    own = lambda **kw: server_config(**kw).replicas.own_process  # noqa: E731
    assert own(seam="vllm_capture", device="cuda") and own(seam="vllm_capture", device="cuda:0")
    assert not own(seam="vllm_capture", device="cuda", engine_process=False)
    assert not own(seam="hf_qk_fast", device="cuda") and not own(seam="hf_qk_fast", device="cpu")
    assert own(seam="hf_qk_fast", device="cpu", engine_process=True)


class _Loaded:
    """What placement reads of an engine."""

    def __init__(self, sessions: int, queued: int, alive: bool = True) -> None:
        self.sessions, self.queued, self.alive = sessions, queued, alive

    def load(self):
        return self.sessions, self.queued


def test_placement_takes_fewest_sessions_then_shortest_queue_and_never_a_dead_engine():
    route = DirectionRoute()
    a, b, c = _Loaded(2, 0), _Loaded(1, 5), _Loaded(1, 2)
    assert least_loaded([a, b, c], route) is c
    assert least_loaded([a, b, _Loaded(0, 9, alive=False)], route) is b
    with pytest.raises(EngineDied, match="every engine"):
        least_loaded([_Loaded(0, 0, alive=False)], route)


# ---- one engine in its own process ----


def test_a_process_engine_drafts_in_its_child_and_reports_errors_and_its_death_typed(tmp_path):
    route = DirectionRoute(model="fake", seam="fake", heads=None,
                           seam_options={"record_dir": str(tmp_path), "fail_word": "boom"})
    from alignatt.core.draft import Head

    engine = Engine("7", route, [Head(0, 0), Head(0, 1)], recording_factory, SchedulerConfig(capacity=4),
                    in_process=False)
    try:
        child = engine.stats()["pid"]
        assert child != os.getpid() and engine.alive
        engine.open_session("a")
        request = DraftRequest(source_words=["hello", "world"], committed_words=2)
        draft = engine.submit("a", request).result(60)
        assert draft.seam == f"fake@{child}" and draft.text == " ".join(target_word(j, w) for j, w in
                                                                         enumerate(request.source_words))
        with pytest.raises(ValueError, match="refuses 'boom'"):  # the child's error, its own type
            engine.submit("a", DraftRequest(source_words=["boom"], committed_words=1, final=True)).result(60)
        assert engine.submit("a", replace(request, final=True)).result(60).text == draft.text  # it goes on
        budget = engine.budget(ServerLimits(), draft_tokens=16)  # counted in the child, by its seam
        assert budget.prompt_tokens(request) == 5 + 2 + 2 and budget.positions == 4096
        told = []
        engine.on_death("a", told.append)
        os.kill(child, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while not told and time.monotonic() < deadline:
            time.sleep(0.02)
        assert told and isinstance(told[0], EngineDied) and "killed by signal 9" in str(told[0])
        assert not engine.alive and engine.stats()["alive"] is False
        with pytest.raises(EngineDied):
            engine.scheduler.submit("a", request)
        with pytest.raises(EngineDied):
            engine.open_session("b")
    finally:
        engine.close()


@pytest.mark.parametrize("unpicklable", [False, True], ids=["preparer-travels", "preparer-stays"])
def test_a_process_engine_has_its_drafts_prepared_by_the_server_when_its_preparer_travels(unpicklable):
    """The child hands over its seam's `preparer`: prompts are built in the server's process and the
    child only steps. A preparer that cannot be pickled stays in the child, which prepares, as before."""
    route = DirectionRoute(model="fake", seam="fake", heads=None, seam_options={"unpicklable": unpicklable})
    engine = Engine("p", route, [], preparing_factory, SchedulerConfig(capacity=2), in_process=False)
    try:
        child = engine.stats()["pid"]
        assert hasattr(engine.seam, "prepare") is not unpicklable
        engine.open_session("a")
        draft = engine.submit("a", DraftRequest(source_words=["hello", "world"], committed_words=2)).result(60)
        assert draft.seam == f"prepared@{child if unpicklable else os.getpid()}"
        assert draft.text == " ".join(target_word(j, w) for j, w in enumerate(["hello", "world"]))
    finally:
        engine.close()


def test_a_process_engine_takes_a_steps_submits_and_aborts_in_one_message_and_steps_on_unasked():
    """Submits and aborts wait for the next step and go with it: a step is one message to the child
    however many drafts join or leave the batch. While drafts run, a step is on its way ahead of the
    one the server reads, so the child steps on without waiting for the server; a reply read by
    another call on its way comes back from `step`, in order. A request the child's seam refuses
    comes back from its step in place of its draft, and through a scheduler it fails alone."""
    from alignatt.serve.engine_process import EngineSpec
    from alignatt.serve.engine_client import ProcessBatchSeam

    route = DirectionRoute(model="fake", seam="fake", heads=None, seam_options={"steps": 3, "refuse_word": "boom"})
    seam = ProcessBatchSeam(EngineSpec(preparing_factory, route, []), "trips")
    try:
        sent, send = [], seam._send
        seam._send = lambda message: (sent.append(type(message).__name__), send(message))[1]
        words = ["a", "b", "boom", "c"]
        handles = [seam.submit(DraftRequest(source_words=[w, "x"], committed_words=2)) for w in words]
        assert sent == [] and seam.has_unfinished()  # nothing crossed yet
        first = dict(seam.step())  # all four taken, "boom" refused; the others need two more steps
        assert list(first) == [handles[2]] and isinstance(first[handles[2]], ValueError)
        assert sent == ["Step", "Step"]  # the second went ahead: the child's next step
        time.sleep(0.3)
        assert seam.waiting_s() >= 0.3  # the watcher sees the step ahead as unanswered until it is read
        asked = time.monotonic()
        assert not seam.step() and seam.step_phases_s["last_started_at"] < asked  # it stepped unasked
        seam.abort(handles[1])
        assert seam.describe() is None and len(seam._early) == 1  # read the step ahead's reply on its way
        done = dict(seam.step())  # the third step ran ahead of the abort: its drafts come back all the same
        assert set(done) == {handles[0], handles[1], handles[3]} and seam.has_unfinished()  # the abort's step
        assert not seam.step() and not seam.has_unfinished() and seam.waiting_s() == 0.0
        assert sent == ["Step", "Step", "Step", "Describe", "Step"]
        assert seam.acceptance_totals() == {"drafts": 3} and sent[-1] == "Totals"  # counted in the child
        assert [done[h].text for h in (handles[0], handles[3])] == [
            " ".join(target_word(j, w) for j, w in enumerate([word, "x"])) for word in ("a", "c")]
    finally:
        seam.close()
    engine = Engine("r", route, [], preparing_factory, SchedulerConfig(capacity=2), in_process=False)
    try:
        engine.open_session("s")
        with pytest.raises(ValueError, match="refuses 'boom'"):
            engine.submit("s", DraftRequest(source_words=["boom"], committed_words=1, final=True)).result(60)
        assert engine.submit("s", DraftRequest(source_words=["ok"], committed_words=1)).result(60).text
        assert engine.scheduler.stats.failed == 1
        # the child's own time per step reaches the load artifact beside the server's round trip
        from alignatt.measure.capacity_levels import engine_level

        level = engine_level({}, engine.stats())
        assert 0 < level["child_step_ms_mean"] <= level["step_ms_mean"] and level["child_cpu_ms_mean"] >= 0
        assert level["child_steps"] >= 1 and level["child_batch_mean"] >= 1
        parts = level["step_phase_ms"]  # the seam's own parts, and the submits outside them
        assert 0 < parts["stand_in"] and 0 < parts["submit"] and parts["stand_in"] + parts["submit"] <= \
            level["child_step_ms_mean"]
    finally:
        engine.close()


def test_an_engine_that_cannot_load_raises_in_the_server(tmp_path):
    route = DirectionRoute(model="fake", seam="fake", seam_options={"record_dir": str(tmp_path), "fail_build": True})
    with pytest.raises(RuntimeError, match="cannot load"):  # the child's error, raised here
        Engine("0", route, [], recording_factory, in_process=False)
    with pytest.raises(AlignattError, match="module-level function"):  # a closure cannot reach a child
        Engine("1", route, [], lambda r, h: recording_factory(r, h), in_process=False)


# ---- the server with several engines ----


def test_one_engine_in_a_process_of_its_own_when_the_replicas_ask(tmp_path):
    """`ReplicaConfig.own_process`: the route's one engine drafts in a child, not in the server."""
    record_dir = tmp_path / "drafts"
    record_dir.mkdir()
    config = fake_config(tmp_path, max_sessions=2)
    config.directions = {d: r.model_copy(update={"seam_options": {"record_dir": str(record_dir)}})
                         for d, r in config.directions.items()}
    config.engines = 1
    config.replicas.own_process = True
    with ServerThread(config, recording_factory) as srv:
        (stats,) = engine_stats(srv)
        assert stats["pid"] != os.getpid() and stats["alive"]
        client = Client(srv.url)
        try:
            assert client.init()["type"] == "init_ok"
            words = words_of(0, 0)
            reply = client.ask(words, final=True, utterance_id=0)
            assert reply["committed_text"] == translated(words)
        finally:
            client.close()
    assert set(drafts_by_process(record_dir)) == {stats["pid"]}


def test_a_slow_token_count_in_an_engine_process_blocks_no_other_connection(tmp_path):
    """A prompt's exact token count goes over the engine process's pipe: counted off the event
    loop (`Session.fit` on the engine's tokenizing threads, not in `Session.plan`), so a child slow
    to answer holds up only the update that waits for it. Fitted on the loop, both waits below
    take the count's 3 s."""
    config = fake_config(tmp_path, max_sessions=2)
    config.directions = {d: r.model_copy(update={"seam_options": {"slow_count_word": "slowcount", "slow_count_s": 3.0}})
                         for d, r in config.directions.items()}
    config.engines = 1
    config.replicas.own_process = True
    with ServerThread(config, recording_factory) as srv:
        slow, other = Client(srv.url), Client(srv.url)
        try:
            assert slow.init()["type"] == "init_ok" and other.init()["type"] == "init_ok"
            seq = slow.update(["a", "slowcount"], final=True)
            time.sleep(0.5)  # the slow update is being counted now
            started = time.perf_counter()
            other.ws.ping().wait(5.0)  # answered by the server's event loop
            assert time.perf_counter() - started < 1.0
            started = time.perf_counter()
            answered = other.ask([], utterance_id=0)  # another session's update, answered without a draft
            assert answered["path"] == "empty" and time.perf_counter() - started < 1.0
            reply = slow.recv(timeout=10.0)
            assert reply["seq"] == seq and reply["final"]
        finally:
            slow.close()
            other.close()


def test_sessions_spread_least_loaded_stick_to_their_engine_and_stats_add_up(tmp_path):
    n, utterances = 6, 2
    with replica_server(tmp_path, engines=3, max_sessions=n, delay_s=0.002) as srv:
        stats = engine_stats(srv)
        pids = {e["pid"] for e in stats}
        assert len(pids) == 3 and os.getpid() not in pids and all(e["alive"] for e in stats)
        clients = []
        try:
            for i in range(n):  # one at a time: each goes to an engine with the fewest sessions
                clients.append(Client(srv.url))
                assert clients[-1].init()["type"] == "init_ok"
                sessions = [e["sessions"] for e in engine_stats(srv)]
                assert sum(sessions) == i + 1 and max(sessions) - min(sessions) <= 1, sessions
            replies: dict[int, list] = {i: [] for i in range(n)}

            def speak(i):
                for u in range(utterances):
                    words = words_of(i, u)
                    for k in range(1, len(words)):
                        replies[i].append(clients[i].ask(words[:k], words[k:], utterance_id=u))
                    replies[i].append(clients[i].ask(words, final=True, utterance_id=u))

            threads = [threading.Thread(target=speak, args=(i,)) for i in range(n)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(30)
            for i in range(n):
                finals = [r for r in replies[i] if r.get("final")]
                assert [f["committed_text"] for f in finals] == [translated(words_of(i, u)) for u in range(utterances)]
                assert retractions(replies[i]) == 0
            # Sticky: every draft of a session ran in one engine process; two sessions per process.
            homes = {i: process_of(srv.record_dir, f"s{i}u") for i in range(n)}
            assert all(len(h) == 1 for h in homes.values()), homes
            per_process = collections.Counter(next(iter(h)) for h in homes.values())
            assert set(per_process) == pids and sorted(per_process.values()) == [2, 2, 2]
            drafted = drafts_by_process(srv.record_dir)
            stats = engine_stats(srv)
            for e in stats:
                assert e["sessions"] == 2 and e["admitted"] == 2 and e["queued"] == 0 and e["failed"] == 0
                assert e["finished"] + e["discarded"] == len(drafted[e["pid"]]) > 0
                assert sum(e["batch_sizes"].values()) == e["steps"] and set(e["batch_sizes"]) == {"1"}
            status, health = http_get(srv, "/health")  # every session slot is taken
            assert status == 503 and health["status"] == "full" and health["engines_alive"] == 3
            status, snapshot = http_get(srv, "/stats")
            assert status == 200 and [e["pid"] for e in snapshot["engines"]] == [e["pid"] for e in stats]
            assert snapshot["sessions_active"] == n and snapshot["errors"] == {}
        finally:
            for c in clients:
                c.close()


def test_a_killed_engine_fails_only_its_sessions_and_they_resume_on_a_survivor(tmp_path):
    n, utterances = 6, 3
    with replica_server(tmp_path, engines=3, max_sessions=n + 2, delay_s=0.02) as srv:
        clients = [Client(srv.url) for _ in range(n)]
        try:
            for c in clients:
                assert c.init()["type"] == "init_ok"
            replies: dict[int, list] = {i: [] for i in range(n)}
            closes: dict[int, int] = {}
            first_done = threading.Barrier(n + 1)
            go = threading.Event()

            def speak(i):
                try:
                    for u in range(utterances):
                        words = words_of(i, u)
                        for k in range(1, len(words) + 1):
                            r = clients[i].ask(words[:k], words[k:], final=k == len(words), utterance_id=u)
                            replies[i].append(r)
                            if r["type"] == "error":
                                clients[i].recv()  # the server closes after the error frame
                        if u == 0:
                            first_done.wait(10)
                            go.wait(10)
                except ConnectionClosed as e:  # replies that came before the close are still read
                    closes[i] = e.rcvd.code if e.rcvd else None
                    try:
                        while True:
                            replies[i].append(clients[i].recv(timeout=1))
                    except (ConnectionClosed, TimeoutError):
                        pass

            threads = [threading.Thread(target=speak, args=(i,)) for i in range(n)]
            for t in threads:
                t.start()
            first_done.wait(20)
            homes = {i: process_of(srv.record_dir, f"s{i}u").pop() for i in range(n)}
            victim = engine_stats(srv)[0]["pid"]
            doomed = {i for i, pid in homes.items() if pid == victim}
            assert len(doomed) == 2
            go.set()
            time.sleep(0.03)  # the sessions are into their second utterance
            os.kill(victim, signal.SIGKILL)
            for t in threads:
                t.join(30)

            for i in range(n):
                assert retractions(replies[i]) == 0
                errors = [r for r in replies[i] if r["type"] == "error"]
                if i in doomed:  # one processing_failed that says to reconnect, then a 1012 close
                    assert len(errors) == 1 and errors[0]["code"] == "processing_failed", replies[i]
                    assert "reconnect" in errors[0]["message"] and closes[i] == 1012
                else:  # untouched: every final, in order, no error
                    assert not errors and i not in closes
                    finals = [r for r in replies[i] if r.get("final")]
                    assert [f["utterance_id"] for f in finals] == list(range(utterances))
                    assert [f["committed_text"] for f in finals] == [translated(words_of(i, u))
                                                                   for u in range(utterances)]

            stats = {e["pid"]: e for e in engine_stats(srv)}
            assert stats[victim]["alive"] is False and stats[victim]["state"] == "dead" and stats[victim]["sessions"] == 0
            assert all(e["alive"] and e["failed"] == 0 for pid, e in stats.items() if pid != victim)
            status, health = http_get(srv, "/health")
            assert status == 200 and health["status"] == "degraded"  # sessions still admitted, on fewer engines
            assert health["engines_alive"] == 2 and health["engines_dead"] == 1 and health["engines"] == 3

            # The doomed sessions reconnect with the text they showed and finish, append-only, on a survivor.
            for i in doomed:
                shown = [r for r in replies[i] if r["type"] == "translation"][-1]
                u = shown["utterance_id"] + (1 if shown["final"] else 0)
                prefix = "" if shown["final"] else shown["committed_text"]
                words = words_of(i, u)
                with Client(srv.url) as again:
                    assert again.init(accepted_target_prefix=prefix)["type"] == "init_ok"
                    final = again.ask(words, final=True, utterance_id=u)
                    assert final["committed_text"].startswith(prefix) and final["committed_text"] == translated(words)
            resumed = {pid for i in doomed for pid in process_of(srv.record_dir, f"s{i}u")}
            assert victim in resumed and resumed - {victim}
            # A new session after the crash is placed on a survivor.
            with Client(srv.url) as late:
                assert late.init()["type"] == "init_ok"
                assert late.ask(words_of(99, 0), final=True)["type"] == "translation"
                assert process_of(srv.record_dir, "s99u") <= set(stats) - {victim}
        finally:
            for c in clients:
                c.close()


def test_a_served_vllm_route_is_fullgraph_with_prefix_caching_unless_it_says_otherwise():
    from alignatt.serve.config import DirectionRoute
    from alignatt.serve.pool import served_route

    plain = served_route(DirectionRoute(model="gemma4-e4b-synthetic", seam="vllm_capture", device="cuda"))
    assert plain.seam_options == {"enable_prefix_caching": True, "max_num_seqs": 128, "vllm_mode": "fullgraph"}
    pinned = served_route(DirectionRoute(model="gemma4-e4b-synthetic", seam="vllm_capture", device="cuda",
                                         seam_options={"vllm_mode": "cudagraph"}))
    assert pinned.seam_options["vllm_mode"] == "cudagraph"  # the route's own choice wins
    hf = DirectionRoute(model="gemma3-270m", seam="hf_qk_fast")
    assert served_route(hf) is hf


def test_garbage_collector_pauses_are_counted_and_an_engine_process_freezes_its_startup_heap():
    """A collection stops the whole process, so the load benchmark reports its pauses per engine step:
    this process's (`gc_s`) and, for an engine in a process of its own, the child's (`child_gc_s`),
    which froze its startup objects before its first step."""
    import gc

    from alignatt.serve.gc_pauses import GcPauses

    pauses = GcPauses().install()
    try:
        gc.collect()
        assert pauses.pause_s > 0
    finally:
        pauses.uninstall()
    route = DirectionRoute(model="fake", seam="fake", heads=None, seam_options={"collect": True})
    engine = Engine("p", route, [], preparing_factory, SchedulerConfig(capacity=2), in_process=False)
    try:
        assert engine.stats()["child_gc_s"] == 0.0
        engine.open_session("a")
        engine.submit("a", DraftRequest(source_words=["hello", "world"], committed_words=2)).result(60)
        stats = engine.stats()
        assert stats["child_gc_s"] > 0 and stats["step_phases_s"]["frozen"] > 0
    finally:
        engine.close()


def test_a_kernel_windows_profiler_start_and_write_are_left_out_of_the_steps_time(tmp_path):
    """The engine stops stepping while a kernel window's profiler starts and while its trace is
    reduced and written (`write_s`): those stalls are the window's, not the step's, so the child's
    step time leaves them out (a window written inside a step once put 45 s into one step of an
    H100 run: 3.6 ms on the mean of its 12437 steps)."""
    import json

    from alignatt.serve.engine_process import EngineSpec
    from alignatt.serve.engine_client import ProcessBatchSeam

    route = DirectionRoute(model="fake", seam="fake", heads=None, seam_options={"steps": 1})
    seam = ProcessBatchSeam(EngineSpec(preparing_factory, route, []), "windowed")
    path = tmp_path / "engine0.json"
    try:
        seam.kernel_profile(str(path), 1)
        seam.submit(DraftRequest(source_words=["a", "b"], committed_words=2))
        started = time.perf_counter()
        while seam.has_unfinished():
            seam.step()
        waited_s = time.perf_counter() - started  # the server waited through the stalls
        assert json.loads(path.read_text())["steps"] == 1
        assert seam.child.wall_s < waited_s / 2, (seam.child, waited_s)
    finally:
        seam.close()


def test_an_engine_process_profiles_its_thread_between_two_profile_messages(tmp_path):
    """`profile(path)` starts a cProfile of the child's thread, `profile(None)` writes it: the
    statistics (for `pstats`) and a text of the functions with the most time of their own, which
    name the child seam's step. A second start, or a stop with none running, fails loudly."""
    import pstats

    from alignatt.serve.engine_process import EngineSpec
    from alignatt.serve.engine_client import ProcessBatchSeam

    route = DirectionRoute(model="fake", seam="fake", heads=None, seam_options={"steps": 2})
    seam = ProcessBatchSeam(EngineSpec(preparing_factory, route, []), "profiled")
    path = tmp_path / "engine" / "level_1.pstats"
    try:
        assert seam.profile(str(path)).path is None
        with pytest.raises(RuntimeError, match="already running"):
            seam.profile(str(path))
        seam.submit(DraftRequest(source_words=["a", "b"], committed_words=2))
        while seam.has_unfinished():
            seam.step()
        done = seam.profile(None)
        assert done.path == str(path) and path.exists() and "replica_fakes.py" in done.top
        steps = [f for f in pstats.Stats(str(path)).stats if f[0].endswith("replica_fakes.py") and f[2] == "step"]
        assert steps and (tmp_path / "engine" / "level_1.pstats.txt").read_text() == done.top
        with pytest.raises(RuntimeError, match="no profile is running"):
            seam.profile(None)
    finally:
        seam.close()
