"""The draft scheduler on CPU with stand-in seams: supersede, abort, final ordering, fairness,
admission, the slow reader, engine failure, and the one-at-a-time adapter for the HF seams."""

import threading
import time
from concurrent.futures import wait

import pytest

from alignatt.core.draft import DraftRequest
from alignatt.serve.batch_seam import OneAtATime, as_batch_seam
from alignatt.serve.scheduler import (
    DraftScheduler,
    EngineDied,
    SchedulerBusy,
    SchedulerConfig,
    SessionSeam,
    Superseded,
)
from tests.fakes.batch_fakes import PreparingBatchSeam, StandInBatchSeam
from tests.fakes.mt_fakes import FakeSeam


def req(*words, max_new=16, final=False):
    return DraftRequest(source_words=list(words) or ["x"], committed_words=0, max_new_tokens=max_new, final=final)


def until(predicate, timeout=5.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached")
        time.sleep(0.002)


@pytest.fixture
def make():
    made = []

    def build(seam, **config):
        sched = DraftScheduler(lambda: seam, SchedulerConfig(**config))
        made.append((sched, seam))
        return sched

    yield build
    for sched, seam in made:
        if seam.gate is not None:  # let a step blocked on the gate return
            for _ in range(1000):
                seam.gate.release()
        sched.close(5)


def test_drafts_of_many_sessions_share_one_batch_and_each_gets_its_own(make):
    seam = StandInBatchSeam(max_batch=8, steps_for=lambda r: 3)
    sched = make(seam)
    futures = {}
    for i in range(6):
        sched.open_session(i)
        futures[i] = sched.submit(i, req(f"w{i}", "b"))
    for i, f in futures.items():
        assert f.result(5).request.source_words == [f"w{i}", "b"]
    assert max(len(b) for b in seam.batches) == 6  # all six ran together
    assert sched.stats.batch_sizes[6] >= 1 and sched.stats.finished == 6
    assert seam.threads == {"engine-0"}


def test_new_requests_join_the_running_batch_at_the_next_step(make):
    gate = threading.Semaphore(0)
    seam = StandInBatchSeam(max_batch=8, steps_for=lambda r: 4, gate=gate)
    sched = make(seam)
    for s in "ab":
        sched.open_session(s)
    fa = sched.submit("a", req("a"))
    until(lambda: len(seam.submitted) == 1)
    gate.release()
    until(lambda: seam.steps == 1)
    fb = sched.submit("b", req("b"))  # arrives while step 2 runs: joins at step 3
    gate.release()
    until(lambda: len(seam.submitted) == 2)
    assert seam.running[0][1] == 2  # a is still running: b joined its batch
    for _ in range(10):
        gate.release()
    fa.result(5), fb.result(5)
    assert [0, 1] in seam.batches  # one step held both, a not finished first


def test_a_newer_update_drops_the_queued_partial(make):
    gate = threading.Semaphore(0)
    seam = StandInBatchSeam(max_batch=1, steps_for=lambda r: 1, gate=gate)
    sched = make(seam)
    for s in "ab":
        sched.open_session(s)
    busy = sched.submit("b", req("b"))  # occupies the one slot
    until(lambda: len(seam.submitted) == 1)
    old = sched.submit("a", req("old"))
    new = sched.submit("a", req("new"))  # supersedes the queued one
    with pytest.raises(Superseded):
        old.result(1)
    for _ in range(5):
        gate.release()
    assert new.result(5).request.source_words == ["new"]
    busy.result(5)
    assert [r.source_words for _, r in seam.submitted] == [["b"], ["new"]]  # old never reached the engine
    assert sched.stats.superseded_queued == 1


def test_a_newer_update_aborts_the_running_partial_in_the_engine(make):
    gate = threading.Semaphore(0)
    seam = StandInBatchSeam(max_batch=4, steps_for=lambda r: 50, gate=gate)
    sched = make(seam)
    sched.open_session("a")
    running = sched.submit("a", req("stale"))
    until(lambda: len(seam.submitted) == 1)
    sched.supersede("a")  # what the server does when the next update arrives
    with pytest.raises(Superseded):
        running.result(1)  # released at once, not after 50 steps
    gate.release()
    until(lambda: seam.aborted == [0])
    assert not seam.running and sched.stats.aborted_running == 1


def test_finals_are_never_superseded_and_go_in_order_ahead_of_their_sessions_partial(make):
    gate = threading.Semaphore(0)
    seam = StandInBatchSeam(max_batch=1, steps_for=lambda r: 1, gate=gate)
    sched = make(seam, max_queued_finals=4)
    for s in "abc":
        sched.open_session(s)
    first = sched.submit("c", req("c0"))
    until(lambda: len(seam.submitted) == 1)
    partial_b = sched.submit("b", req("pb"))
    finals = [sched.submit("a", req(f"f{i}", final=True)) for i in range(3)]
    sched.supersede("a")  # a newer update of a: finals stay
    partial_a = sched.submit("a", req("pa"))
    for _ in range(20):
        gate.release()
    wait([first, partial_b, partial_a, *finals], 5)
    assert [f.result().request.source_words[0] for f in finals] == ["f0", "f1", "f2"]
    order = [r.source_words[0] for _, r in seam.submitted]
    assert order[0] == "c0" and [w for w in order if w.startswith("f")] == ["f0", "f1", "f2"]
    assert order.index("pa") > order.index("f2")  # a session's finals before its own partial
    assert order.index("pb") <= 2  # another session's partial takes its turn among a's finals


def test_a_fast_speaker_does_not_starve_the_others(make):
    """One slot; a fast session resubmits the moment its partial is answered, three slow ones
    submit once: each slow one is served before the fast one gets a second turn after it."""
    seam = StandInBatchSeam(max_batch=1, steps_for=lambda r: 1, step_s=0.002)
    sched = make(seam)
    for s in ["fast", "s1", "s2", "s3"]:
        sched.open_session(s)
    stop = threading.Event()

    def fast():
        while not stop.is_set():
            try:
                sched.submit("fast", req("fast")).result(5)
            except Superseded:
                pass

    t = threading.Thread(target=fast)
    t.start()
    until(lambda: len(seam.submitted) >= 3)
    slow = [sched.submit(s, req(s)) for s in ["s1", "s2", "s3"]]
    for f in slow:
        f.result(5)
    stop.set()
    t.join(5)
    order = [r.source_words[0] for _, r in seam.submitted]
    first_slow = min(order.index(s) for s in ["s1", "s2", "s3"])
    last_slow = max(order.index(s) for s in ["s1", "s2", "s3"])
    assert order[first_slow:last_slow + 1].count("fast") <= 2  # least recently served first


def test_sessions_past_capacity_are_refused_and_a_closed_one_frees_its_place(make):
    sched = make(StandInBatchSeam(), capacity=2)
    sched.open_session(1)
    sched.open_session(2)
    with pytest.raises(SchedulerBusy, match="all 2 sessions"):
        sched.open_session(3)
    with pytest.raises(SchedulerBusy, match="not admitted"):
        sched.submit(3, req("x"))
    sched.close_session(1)
    sched.open_session(3)
    assert sched.sessions == 2 and sched.stats.refused == 1
    with pytest.raises(ValueError, match="already admitted"):  # a session is admitted once
        sched.open_session(3)
    assert sched.stats.admitted == 3


def test_a_slow_reader_is_bounded_and_does_not_slow_the_others(make):
    """A session that never collects its results: at most one partial waits for it (each newer
    one supersedes), its finals are capped, and another session's drafts keep their latency."""
    seam = StandInBatchSeam(max_batch=2, steps_for=lambda r: 2, step_s=0.001)
    sched = make(seam, max_queued_finals=3)
    sched.open_session("reader")
    sched.open_session("never")
    ignored = [sched.submit("never", req("p", str(i))) for i in range(50)]
    finals = [sched.submit("never", req("f", str(i), final=True)) for i in range(3)]
    with pytest.raises(SchedulerBusy, match="finals waiting"):
        for i in range(20):  # the cap holds while they wait; the engine may drain some meanwhile
            sched.submit("never", req("f", "x", final=True))
    started = time.perf_counter()
    for i in range(10):
        sched.submit("reader", req("r", str(i))).result(5)
    per_draft = (time.perf_counter() - started) / 10
    assert per_draft < 0.1
    assert sum(1 for f in ignored if f.done() and f.exception() is not None) >= 48  # superseded, not queued
    wait(finals, 5)
    assert all(f.result().request.source_words[0] == "f" for f in finals)


def test_a_failed_engine_step_fails_only_the_drafts_it_held(make):
    seam = StandInBatchSeam(max_batch=4, steps_for=lambda r: 1, fail_step_when=lambda i: i == 0)
    sched = make(seam)
    sched.open_session("a")
    first = sched.submit("a", req("x", final=True))
    with pytest.raises(RuntimeError, match="step failed"):
        first.result(5)
    assert sched.submit("a", req("y", final=True)).result(5).request.source_words == ["y"]


def test_an_engine_that_dies_fails_everything_held_and_refuses_later_work(make):
    class Dying(StandInBatchSeam):
        def step(self):
            super().step()
            raise EngineDied("engine 0 stopped: killed by signal 9")

    gate = threading.Semaphore(0)
    seam = Dying(max_batch=1, steps_for=lambda r: 5, gate=gate)
    sched = make(seam)
    sched.open_session("a")
    sched.open_session("b")
    running = sched.submit("a", req("x", final=True))
    until(lambda: len(seam.submitted) == 1)
    queued = [sched.submit("b", req("y", final=True)), sched.submit("b", req("z"))]
    gate.release()
    for f in [running, *queued]:  # not only the running draft: the queued ones too
        with pytest.raises(EngineDied, match="signal 9"):
            f.result(5)
    with pytest.raises(EngineDied):
        sched.submit("a", req("w"))
    with pytest.raises(EngineDied):
        sched.open_session("c")
    assert sched.stats.failed == 3 and len(seam.submitted) == 1
    until(lambda: seam.closed_on is not None)  # its thread ended and closed the seam


def test_closing_a_session_aborts_its_work(make):
    gate = threading.Semaphore(0)
    seam = StandInBatchSeam(max_batch=4, steps_for=lambda r: 10, gate=gate)
    sched = make(seam)
    sched.open_session("a")
    f = sched.submit("a", req("x", final=True))
    until(lambda: len(seam.submitted) == 1)
    sched.close_session("a")
    with pytest.raises(Superseded, match="session closed"):
        f.result(1)
    gate.release()
    until(lambda: seam.aborted == [0])


def test_an_hf_seam_runs_as_a_batch_of_one_on_the_engine_thread():
    seam = FakeSeam()
    assert isinstance(as_batch_seam(seam), OneAtATime)
    batch = StandInBatchSeam()
    assert as_batch_seam(batch) is batch
    sched = DraftScheduler(lambda: seam, SchedulerConfig(), name="hf")
    try:
        assert sched.max_batch == 1
        sched.open_session("s")
        proxy = SessionSeam(sched, "s")
        direct = FakeSeam().draft(req("a", "b"))
        got = proxy.draft(req("a", "b"))
        assert got.text == direct.text and proxy.name == "fake"
        assert seam.threads == {"engine-hf"}
    finally:
        sched.close()
    assert seam.closed_on == "engine-hf"  # built, drafted and closed on its own thread


def test_a_seam_that_fails_to_build_raises_in_the_caller():
    def boom():
        raise ValueError("no model here")

    with pytest.raises(ValueError, match="no model here"):
        DraftScheduler(boom)


# ---- through the server ----


def _batch_server(tmp_path, seam, max_sessions=8):
    from alignatt.serve.server import ServerThread
    from tests.support.server_client import fake_config

    return ServerThread(fake_config(tmp_path, max_sessions=max_sessions), lambda route, heads: seam)


def test_sessions_waiting_for_drafts_hold_no_thread_each(tmp_path):
    """Every session's draft is pending (the engine is held at a gate): the server's thread count
    does not grow with the sessions, since a connection awaits its draft's future."""
    from tests.support.server_client import Client

    gate = threading.Semaphore(0)
    seam = StandInBatchSeam(max_batch=16, steps_for=lambda r: 1, gate=gate)
    n = 12
    with _batch_server(tmp_path, seam, max_sessions=n) as srv:
        clients = [Client(srv.url) for _ in range(n)]
        try:
            for c in clients:
                c.init()
            before = threading.active_count()
            for i, c in enumerate(clients):
                c.update([f"s{i}w0", f"s{i}w1"], [f"s{i}w2"])
            until(lambda: len(seam.running) + sum(len(b) for b in seam.batches) >= 1)
            time.sleep(0.3)  # every update reached the server and waits on its draft
            waiting = threading.active_count()
            assert waiting - before < 3, (before, waiting)  # not one thread per waiting session
            for _ in range(4 * n):
                gate.release()
            for c in clients:
                assert c.recv(timeout=10)["type"] == "translation"
        finally:
            for _ in range(100):
                gate.release()
            for c in clients:
                c.close()


def test_the_server_batches_drafts_of_concurrent_sessions(tmp_path):
    from tests.support.server_client import Client

    seam = StandInBatchSeam(max_batch=8, steps_for=lambda r: 3, step_s=0.005)
    n = 6
    with _batch_server(tmp_path, seam, max_sessions=n) as srv:
        results, errors = {}, []
        barrier = threading.Barrier(n)

        def run(i):
            try:
                with Client(srv.url) as c:
                    c.init()
                    barrier.wait(5)
                    words = [f"s{i}w{j}" for j in range(4)]
                    for k in range(1, 5):
                        c.ask(words[:k], words[k:])
                    results[i] = c.ask(words, final=True)["committed_text"]
            except Exception as e:  # reported below
                errors.append(repr(e))

        threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not errors, errors
        for i in range(n):  # no cross-talk between sessions
            assert results[i] == " ".join(f"W{j}:s{i}w{j}" for j in range(4))
        assert max(len(b) for b in seam.batches) >= 2  # sessions shared engine steps
        assert seam.threads == {"engine-0"}
    assert seam.closed_on == "engine-0"


def test_a_newer_update_aborts_the_running_draft_and_only_it_is_answered(tmp_path):
    from tests.support.server_client import Client

    seam = StandInBatchSeam(max_batch=4, steps_for=lambda r: 400 if "slow" in r.source_words else 1,
                            step_s=0.005)
    with _batch_server(tmp_path, seam) as srv:
        with Client(srv.url) as c:
            c.init()
            stale = c.update(["a"], ["slow"])
            until(lambda: len(seam.submitted) == 1)
            fresh = c.update(["a", "b"])
            reply = c.recv()
            assert reply["seq"] == fresh and reply["type"] == "translation"  # no reply for `stale`
            assert stale < fresh
            until(lambda: seam.aborted == [0])  # the 2 s draft did not run to its end
            assert srv.call(lambda: srv.server.stats.coalesced) == 1


# ---- the per-session share of the engine ----


def test_two_sessions_full_of_finals_do_not_starve_a_third_sessions_partial(make):
    """Issue 25 item 2: two sessions with 12 finals queued each; a third session's partial goes into
    the engine after at most one draft of each other session (the share bound), not after all 24."""
    gate = threading.Semaphore(0)
    seam = StandInBatchSeam(max_batch=1, steps_for=lambda r: 1, gate=gate)
    sched = make(seam, max_queued_finals=12)
    for s in "abc":
        sched.open_session(s)
    finals = {s: [sched.submit(s, req(f"{s}{i}", final=True)) for i in range(12)] for s in "ab"}
    until(lambda: len(seam.submitted) == 1)  # a0 is in the engine
    partial = sched.submit("c", req("c-partial"))
    for _ in range(40):
        gate.release()
    assert partial.result(5).request.source_words == ["c-partial"]
    order = [r.source_words[0] for _, r in seam.submitted]
    assert order.index("c-partial") <= 3, order  # a0 (running), then at most one of a and one of b
    for s in "ab":  # never dropped, in order
        assert [f.result(5).request.source_words[0] for f in finals[s]] == [f"{s}{i}" for i in range(12)]
        assert [w for w in order if w.startswith(s)] == [f"{s}{i}" for i in range(12)]
    assert sched.stats.finished == 25


def test_sessions_that_resubmit_finals_at_once_still_share_the_engine_with_a_partial(make):
    """The server's pattern: each session's worker submits its next final the moment the last one
    is answered. Counted in drafts the engine took ahead of the partial, not in wall time."""
    seam = StandInBatchSeam(max_batch=1, steps_for=lambda r: 1, step_s=0.003)
    sched = make(seam)
    for s in "abc":
        sched.open_session(s)
    stop = threading.Event()

    def pipeline(s):
        i = 0
        while not stop.is_set() and i < 40:
            sched.submit(s, req(f"{s}{i}", final=True)).result(5)
            i += 1

    threads = [threading.Thread(target=pipeline, args=(s,)) for s in "ab"]
    for t in threads:
        t.start()
    until(lambda: len(seam.submitted) >= 4)
    before = len(seam.submitted)
    sched.submit("c", req("c-partial")).result(10)
    stop.set()
    for t in threads:
        t.join(10)
    order = [r.source_words[0] for _, r in seam.submitted]
    assert order.index("c-partial") - before <= 2, order[before:]


def test_a_multi_target_session_takes_one_place_and_batches_its_targets_in_one_turn(make):
    seam = StandInBatchSeam(max_batch=8, steps_for=lambda r: 1)
    sched = make(seam, capacity=2)
    for t in ("it", "de", "fr", "es"):
        sched.open_session(("m", t), slot=("m", "it"))
    assert sched.sessions == 1 and sched.has_room()
    sched.open_session("solo")
    assert sched.sessions == 2 and not sched.has_room()
    with pytest.raises(SchedulerBusy):
        sched.open_session("third")
    futures = [sched.submit(("m", t), req(t)) for t in ("it", "de", "fr", "es")] + [sched.submit("solo", req("s"))]
    wait(futures, 5)
    assert [len(b) for b in seam.batches][0] == 5  # room in the engine: every target in the one step
    for t in ("it", "de", "fr"):
        sched.close_session(("m", t))
    assert sched.sessions == 2  # one target left keeps the session's place
    sched.close_session(("m", "es"))
    assert sched.sessions == 1 and sched.has_room()


def test_through_the_server_pipelined_finals_of_two_sessions_let_a_third_sessions_partial_through(tmp_path):
    """The issue's frames: two sessions each pipeline 12 finals of 40 words; a third session's
    2-word partial is answered after at most a few of those drafts (it waited for all 24 before)."""
    from tests.support.server_client import Client

    seam = StandInBatchSeam(max_batch=1, steps_for=lambda r: 1, step_s=0.01)
    with _batch_server(tmp_path, seam) as srv:
        a, b, c = Client(srv.url, timeout=30), Client(srv.url, timeout=30), Client(srv.url, timeout=30)
        try:
            for client in (a, b, c):
                assert client.init()["type"] == "init_ok"
            for u in range(12):
                for tag, client in (("a", a), ("b", b)):
                    client.update([f"{tag}{u}w{j}" for j in range(40)], final=True, utterance_id=u)
            until(lambda: len(seam.submitted) >= 2)
            before = len(seam.submitted)
            reply = c.ask(["c0", "c1"], ["c2"])
            assert reply["type"] == "translation"
            order = [r.source_words[0] for _, r in seam.submitted]
            assert order.index("c0") - before <= 3, order[before:]
            for tag, client in (("a", a), ("b", b)):  # every final, in order
                finals = [client.recv() for _ in range(12)]
                assert [f["utterance_id"] for f in finals] == list(range(12)) and all(f["final"] for f in finals)
        finally:
            for client in (a, b, c):
                client.close()


def test_a_drafts_prompt_is_prepared_on_the_submitting_thread_not_the_engine_thread(make):
    # prompt building and tokenising were ~39 % of the engine thread's busy samples on the H200
    seam = PreparingBatchSeam(max_batch=8, steps_for=lambda r: 2)
    sched = make(seam)
    futures = []

    def speaker(i):
        sched.open_session(i)
        futures.append(sched.submit(i, req(f"w{i}", "b")))

    threads = [threading.Thread(target=speaker, args=(i,), name=f"speaker-{i}") for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for f in futures:
        f.result(5)
    assert sorted(seam.prepared_on) == ["speaker-0", "speaker-1", "speaker-2"]
    assert sorted(seam.submitted_prompts) == [(f"W{i}", "B") for i in range(3)]  # prepared once, handed on
    assert seam.threads == {"engine-0"}


def test_a_request_that_cannot_be_prepared_fails_its_caller_at_once_and_nothing_else(make):
    seam = PreparingBatchSeam(max_batch=8, steps_for=lambda r: 1, fail_prepare_when=lambda r: "huge" in r.source_words)
    sched = make(seam)
    sched.open_session("a")
    sched.open_session("b")
    with pytest.raises(ValueError, match="too long"):
        sched.submit("a", req("huge"))
    assert sched.submit("b", req("fine")).result(5).request.source_words == ["fine"]
    assert sched.submit("a", req("small")).result(5).request.source_words == ["small"]
    assert [r.source_words for _, r in seam.submitted] == [["fine"], ["small"]]  # the bad one never queued


class AheadBatchSeam(StandInBatchSeam):
    """A stand-in that, like an engine process with a step sent ahead, still has something to
    collect after every draft was delivered: one more step, which returns nothing."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.ahead = False

    def has_unfinished(self) -> bool:
        return bool(self.running) or self.ahead

    def step(self):
        self.ahead = bool(self.running)
        return super().step()


def test_a_step_with_no_draft_in_flight_is_a_collect_not_an_engine_step(make):
    seam = AheadBatchSeam(max_batch=8, steps_for=lambda r: 3)
    sched = make(seam)
    sched.open_session("a")
    assert sched.submit("a", req("w", "b")).result(5).request.source_words == ["w", "b"]
    until(lambda: not seam.has_unfinished())
    assert seam.steps == 4 and sched.stats.steps == 3 and sched.stats.collects == 1
    assert dict(sched.stats.batch_sizes) == {1: 3}  # no batch of 0
