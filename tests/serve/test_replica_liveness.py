"""Hung engines (issue 25 item 6), on CPU with stand-in seams in child processes: an engine process
that stops answering, mid-step or while idle, is noticed within `step_deadline_s + heartbeat_s`;
its sessions get `processing_failed` and a 1012 close (reconnect), it gets no new sessions, it is
killed, and `/health` says degraded, or down when no engine is left."""

import os
import signal
import time
from contextlib import contextmanager

import pytest
from websockets.exceptions import ConnectionClosed

from alignatt.serve.config import ReplicaConfig
from alignatt.serve.server import ServerThread
from tests.fakes.replica_fakes import no_leaked_processes, process_of, recording_factory  # noqa: F401 - autouse
from tests.support.server_client import Client, fake_config, health

DEADLINE_S, HEARTBEAT_S = 1.0, 0.2
NOTICE_BOUND_S = DEADLINE_S + HEARTBEAT_S + 1.5  # the stated bound, plus room for a loaded CPU


@contextmanager
def watched_server(tmp_path, engines=2):
    record_dir = tmp_path / "drafts"
    record_dir.mkdir()
    config = fake_config(tmp_path, max_sessions=8)
    options = {"record_dir": str(record_dir), "hang_word": "HANG"}
    config.directions = {d: r.model_copy(update={"seam_options": options}) for d, r in config.directions.items()}
    config.engines = engines
    config.replicas = ReplicaConfig(step_deadline_s=DEADLINE_S, heartbeat_s=HEARTBEAT_S)
    with ServerThread(config, recording_factory) as srv:
        srv.record_dir = record_dir
        yield srv


def engine_pids(srv) -> list[int]:
    return srv.call(lambda: [e.stats()["pid"] for e in srv.server.registry.engines])


def home(srv, client: Client, tag: str) -> int:
    """The engine process that drafts for `client` (its first draft, words tagged `tag`)."""
    assert client.ask([f"{tag}a", f"{tag}b"], final=True)["type"] == "translation"
    (pid,) = process_of(srv.record_dir, tag)
    return pid


def told_to_reconnect(client: Client) -> tuple[dict, int | None, float]:
    """The error frame, the close code, and when the close came (monotonic)."""
    error = client.recv(timeout=NOTICE_BOUND_S + 5)
    try:
        client.recv(timeout=5)
        code = None
    except ConnectionClosed as e:
        code = e.rcvd.code if e.rcvd else None
    return error, code, time.monotonic()


def wait_status(srv, wanted: str, timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        status, body = health(srv)
        if body["status"] == wanted or time.monotonic() > deadline:
            return body
        time.sleep(0.05)


def test_an_engine_that_stops_mid_step_is_taken_out_within_the_deadline(tmp_path):
    with watched_server(tmp_path) as srv:
        a, b = Client(srv.url), Client(srv.url)
        try:
            assert a.init()["type"] == "init_ok" and b.init()["type"] == "init_ok"
            pid_a, pid_b = home(srv, a, "sa"), home(srv, b, "sb")
            assert pid_a != pid_b  # one session per engine
            asked = time.monotonic()
            a.update(["sa1", "HANG"], final=True, utterance_id=1)  # its engine stops inside this draft
            error, code, at = told_to_reconnect(a)
            assert error["type"] == "error" and error["code"] == "processing_failed"
            assert "answered nothing" in error["message"] and "reconnect" in error["message"]
            assert code == 1012 and at - asked <= NOTICE_BOUND_S
            body = wait_status(srv, "degraded", 5)
            assert body["status"] == "degraded" and body["engines_hung"] == 1 and body["engines_alive"] == 1
            # The other engine's session never noticed; a new session is placed on the live engine.
            assert b.ask(["sb1", "sb2"], final=True, utterance_id=1)["type"] == "translation"
            with Client(srv.url) as c:
                assert c.init()["type"] == "init_ok"
                assert home(srv, c, "sc") == pid_b
            stats = {e["pid"]: e for e in srv.call(lambda: [e.stats() for e in srv.server.registry.engines])}
            assert stats[pid_a]["state"] == "hung" and stats[pid_a]["alive"] is False
            deadline = time.monotonic() + 5  # killed, not left stopped holding its memory
            while os.path.exists(f"/proc/{pid_a}") and open(f"/proc/{pid_a}/stat").read().split()[2] != "Z" \
                    and time.monotonic() < deadline:
                time.sleep(0.05)
            assert not os.path.exists(f"/proc/{pid_a}") or open(f"/proc/{pid_a}/stat").read().split()[2] == "Z"
        finally:
            a.close()
            b.close()


def test_an_idle_engine_stopped_from_outside_is_noticed_by_its_heartbeat(tmp_path):
    with watched_server(tmp_path) as srv:
        a, b = Client(srv.url), Client(srv.url)
        try:
            assert a.init()["type"] == "init_ok" and b.init()["type"] == "init_ok"
            pid_a, pid_b = home(srv, a, "sa"), home(srv, b, "sb")
            stopped = time.monotonic()
            os.kill(pid_a, signal.SIGSTOP)  # no draft in flight: only the ping can notice
            error, code, at = told_to_reconnect(a)  # told without sending anything
            assert error["code"] == "processing_failed" and "reconnect" in error["message"] and code == 1012
            assert at - stopped <= NOTICE_BOUND_S
            assert wait_status(srv, "degraded", 5)["engines_hung"] == 1
            with Client(srv.url) as c:  # never placed on the hung engine
                assert c.init()["type"] == "init_ok" and home(srv, c, "sc") == pid_b
            os.kill(pid_b, signal.SIGSTOP)  # the last engine too: down, and new sessions are refused
            error, code, _ = told_to_reconnect(b)
            assert error["code"] == "processing_failed" and code == 1012
            status, body = health(srv)
            assert status == 503 and body["status"] == "down" and body["engines_alive"] == 0
            with Client(srv.url) as d:
                assert d.init()["type"] == "error"
        finally:
            a.close()
            b.close()


def test_several_engines_share_one_gpu_each_asking_for_its_share_of_the_memory(monkeypatch):
    from alignatt.core.errors import AlignattError
    from alignatt.serve.config import DirectionRoute
    from alignatt.serve.pool import served_route
    from alignatt.serve.engine_devices import replica_devices

    cuda = DirectionRoute(model="gemma4-e4b-synthetic", seam="vllm_capture", device="cuda")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    with pytest.raises(AlignattError, match="1 CUDA GPUs are visible"):
        replica_devices(cuda, 3)  # one per GPU unless told otherwise
    assert replica_devices(cuda, 3, per_gpu=3) == ["3", "3", "3"]
    assert replica_devices(cuda, "auto", per_gpu=2) == ["3", "3"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    assert replica_devices(cuda, 3, per_gpu=2) == ["0", "1", "0"]  # dealt in turn
    shared = served_route(cuda, engines_on_gpu=3)
    assert shared.seam_options["engine_kwargs"] == {"gpu_memory_utilization": 0.3}
    pinned = cuda.model_copy(update={"seam_options": {"engine_kwargs": {"gpu_memory_utilization": 0.2}}})
    assert served_route(pinned, engines_on_gpu=3).seam_options["engine_kwargs"]["gpu_memory_utilization"] == 0.2
    assert "engine_kwargs" not in served_route(cuda).seam_options  # alone on its GPU: vLLM's default
    # a process with a part of the device (a GPU-suite lane) splits that part, not the whole device:
    # four lanes of two engines each asking 0.45 did not fit an H100 (cc3577e)
    monkeypatch.setenv("ALIGNATT_VLLM_GPU_MEMORY_SHARE", "0.225")
    assert served_route(cuda, engines_on_gpu=3).seam_options["engine_kwargs"] == {"gpu_memory_utilization": 0.075}
