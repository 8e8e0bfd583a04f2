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
