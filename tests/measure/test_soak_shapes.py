"""The soak's hostile set holds issue 25's shapes, and its server runs in a process of its own, so
RSS and descriptors are read from outside the server (a trimmed heap inside it would hide them)."""

import os

from alignatt.measure.soak import _ServedProcess
from alignatt.measure.soak_sessions import HOSTILE_CASES, nested_arrays_frame
from tests.support.server_client import FakeFactory, fake_config


def test_the_hostile_set_holds_the_expensive_and_refused_shapes():
    assert {"nested_arrays_before_init", "nested_arrays_in_session", "huge_prefix_init",
            "final_flood"} <= set(HOSTILE_CASES)
    frame = nested_arrays_frame()
    assert 250_000 < len(frame) <= 256 * 1024  # what the reproduction sent: just inside max_frame_bytes


def test_the_soaks_server_is_measured_from_outside_its_process(tmp_path):
    served = _ServedProcess(fake_config(tmp_path), FakeFactory())
    try:
        assert served.process.pid != os.getpid()
        assert served.rss() > 10 * 2**20 and served.fds() > 0
        assert served.stats()["sessions_active"] == 0
    finally:
        served.stop()
    assert not served.process.is_alive() and served.process.exitcode == 0


def test_the_access_cases_hold_against_a_server_with_a_token_and_see_a_lockout(tmp_path):
    """Each case of who may connect is answered as expected by a server with a token; the idle
    flood reports a lockout when the server lets one address fill its bound before init."""
    from alignatt.measure.soak_access import ACCESS_CASES, run_access_case
    from alignatt.serve.server import ServerThread

    assert set(ACCESS_CASES) <= set(HOSTILE_CASES)
    token_file = tmp_path / "token"
    token_file.write_text("soak-token-0123456789\n")
    config = fake_config(tmp_path, init_timeout_s=1.0).model_copy(update={"token_file": str(token_file)})
    with ServerThread(config, FakeFactory()) as srv:
        for kind in ACCESS_CASES:
            unexpected: list[str] = []
            run_access_case(srv.url, kind, "soak-token-0123456789", 3.0, unexpected)
            assert unexpected == [], (kind, unexpected)
        unexpected = []
        run_access_case(srv.url, "no_token", "another-token-0123456", 3.0, unexpected)  # a token it does not hold
        assert unexpected == []  # still refused: no token at all
    # A server whose one bound before init the flood's 32 sockets fill, with no room made: honest
    # clients are locked out, and the case says so.
    locked = fake_config(tmp_path, init_timeout_s=30.0, max_connections_before_init=8,
                         max_connections_before_init_per_peer=8)
    from alignatt.serve.host import WaitingPeers

    grace, WaitingPeers.GRACE_S = WaitingPeers.GRACE_S, 60.0  # none ever old enough to make room
    try:
        with ServerThread(locked, FakeFactory()) as srv:
            unexpected = []
            run_access_case(srv.url, "idle_flood", None, 3.0, unexpected)
            assert unexpected and all("locked out" in u for u in unexpected), unexpected
    finally:
        WaitingPeers.GRACE_S = grace
