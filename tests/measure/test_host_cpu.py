"""The host's CPUs over a load level, from /proc/stat: the share in use and the share stolen; and
the share of a core the server's loop used."""

import sys

import pytest

import threading

from alignatt.measure.host_cpu import cpu_times, loop_shares, shares, thread_cores, thread_cpu_s

STAT = "cpu  {} 0 {} {} {} 0 0 {} 0 0\ncpu0 1 2 3 4 5 6 7 8 9 10\nintr 1 2\n"


def _stat(user, system, idle, iowait, steal):
    return STAT.format(user, system, idle, iowait, steal)


def test_the_busy_and_stolen_shares_come_from_the_totals_line_between_two_readings():
    before = cpu_times(_stat(100, 50, 1000, 10, 5))
    after = cpu_times(_stat(400, 150, 1400, 30, 25))  # +300 user, +100 system, +400 idle, +20 iowait, +20 steal
    assert before == {"user": 100, "nice": 0, "system": 50, "idle": 1000, "iowait": 10, "irq": 0, "softirq": 0,
                      "steal": 5}
    got = shares(before, after)
    assert got == {"host_cpu_busy_share": round(400 / 840, 4), "host_cpu_steal_share": round(20 / 840, 4)}


def test_no_reading_or_no_time_passed_gives_none():
    none = {"host_cpu_busy_share": None, "host_cpu_steal_share": None}
    assert cpu_times("intr 1 2\n") is None and cpu_times("") is None
    same = cpu_times(_stat(1, 1, 1, 1, 1))
    assert shares(None, same) == none and shares(same, same) == none


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/stat is Linux's")
def test_this_linux_host_is_read():
    before = cpu_times()
    sum(i * i for i in range(2_000_000))  # some CPU time between the readings
    got = shares(before, cpu_times())
    assert 0 < got["host_cpu_busy_share"] <= 1 and 0 <= got["host_cpu_steal_share"] < 1


def test_the_server_loop_share_is_its_thread_time_over_the_wall_and_a_zero_wall_gives_none():
    assert loop_shares(1.5, 3.0, 2.0) == {"server_loop_cpu_share": 0.75, "server_process_cpu_cores": 1.5}
    assert loop_shares(1.0, 1.0, 0.0) == {"server_loop_cpu_share": None, "server_process_cpu_cores": None}


def test_each_thread_is_named_as_python_names_it_and_idle_ones_are_left_out():
    me = threading.get_native_id()
    got = thread_cores({me: 1.0, 8: 2.0}, {me: 2.5, 8: 3.0, 9: 1.0}, 2.0)
    # 8 and 9 are no Python thread (torch's, say): summed as one
    assert got == {"native threads": 1.0, threading.current_thread().name: 0.75}
    assert thread_cores({me: 1.0}, {me: 1.001}, 2.0) == {}  # under 0.001 cores: left out
    assert list(got) == ["native threads", threading.current_thread().name]  # busiest first
    assert thread_cores(None, {me: 1.0}, 1.0) is None and thread_cores({}, {}, 0.0) is None


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/task is Linux's")
def test_this_process_threads_are_read_and_a_busy_one_shows(tmp_path):
    stop = threading.Event()

    def spin():
        while not stop.is_set():
            sum(i * i for i in range(10_000))

    before = thread_cpu_s()
    worker = threading.Thread(target=spin, name="spinner")
    worker.start()
    try:
        stop.wait(0.5)
        got = thread_cores(before, thread_cpu_s(), 0.5)  # read while the spinner is alive and named
    finally:
        stop.set()
        worker.join()
    assert got["spinner"] > 0.05
    assert thread_cpu_s(tmp_path / "absent") is None
