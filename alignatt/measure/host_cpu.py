"""How busy the host's CPUs were over a load level, how much time the hypervisor took from them, and
how much of one core the server's event loop used.

Read from the kernel's `/proc/stat` counters at the level's start and end (no sampling thread). A
host-bound engine (docs/batching.md) runs as fast as the CPU it gets: on a virtual machine, `steal`
is the time its vCPUs were runnable but the hypervisor ran something else, and `busy` is the share
of all vCPUs in use (the engine, the server, the load's client processes). Where `/proc/stat` is
missing (not Linux) both are None. The server's loop is one thread: at a share near 1 of one core it
never waited, so it, not the engine, set the level's pace, however idle the other cores were.
Each thread's own CPU time comes from `/proc/self/task`: the server's threads share one interpreter
lock, so together they cannot run Python for much more than one core.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Optional

# The first line's columns (proc(5)): guest time is already counted in user and nice.
FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")
STAT = Path("/proc/stat")


def cpu_times(text: Optional[str] = None) -> Optional[dict[str, int]]:
    """All CPUs' time in each state (clock ticks) from /proc/stat's text (None: read it now);
    None where there is no such file or its first line is not the `cpu` total."""
    if text is None:
        try:
            text = STAT.read_text()
        except OSError:
            return None
    first = text.split("\n", 1)[0].split()
    if not first or first[0] != "cpu":
        return None
    values = [int(v) for v in first[1:1 + len(FIELDS)]]
    return dict(zip(FIELDS, values + [0] * (len(FIELDS) - len(values))))


def shares(before: Optional[dict[str, int]], after: Optional[dict[str, int]]) -> dict[str, Optional[float]]:
    """`host_cpu_busy_share` (not idle nor waiting on I/O) and `host_cpu_steal_share` between two readings."""
    if before is None or after is None:
        return {"host_cpu_busy_share": None, "host_cpu_steal_share": None}
    delta = {k: after[k] - before[k] for k in FIELDS}
    total = sum(delta.values())
    if total <= 0:
        return {"host_cpu_busy_share": None, "host_cpu_steal_share": None}
    idle = delta["idle"] + delta["iowait"] + delta["steal"]
    return {"host_cpu_busy_share": round(1 - idle / total, 4), "host_cpu_steal_share": round(delta["steal"] / total, 4)}


def loop_shares(loop_cpu_s: float, process_cpu_s: float, wall_s: float) -> dict[str, Optional[float]]:
    """`server_loop_cpu_share`: the server's event-loop thread's CPU time over the level's wall (of one
    core); `server_process_cpu_cores`: the server process's CPU time over it, all its threads (in cores)."""
    if wall_s <= 0:
        return {"server_loop_cpu_share": None, "server_process_cpu_cores": None}
    return {"server_loop_cpu_share": round(loop_cpu_s / wall_s, 4),
            "server_process_cpu_cores": round(process_cpu_s / wall_s, 4)}


TASKS = Path("/proc/self/task")
NATIVE = "native threads"


def thread_cpu_s(tasks: Path = TASKS) -> Optional[dict[int, float]]:
    """CPU time (user + system, s) of each thread of this process by its kernel id, from
    /proc/self/task/*/stat (None where there is no such folder)."""
    try:
        entries = list(tasks.iterdir())
    except OSError:
        return None
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for entry in entries:
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # the thread ended meanwhile
        out[int(entry.name)] = (int(fields[11]) + int(fields[12])) / tick  # utime, stime (proc(5) 14, 15)
    return out


def thread_cores(before: Optional[dict[int, float]], after: Optional[dict[int, float]],
                 wall_s: float) -> Optional[dict[str, float]]:
    """`server_thread_cpu_cores`: each thread's CPU time between two readings over the wall, in cores,
    by its Python name (threads of one name summed; those Python did not start or no longer knows, such
    as torch's and the tokenizers' own, as `NATIVE`), busiest first; under 0.001 cores left out."""
    if before is None or after is None or wall_s <= 0:
        return None
    names = {t.native_id: t.name for t in threading.enumerate()}
    cores: dict[str, float] = {}
    for tid, cpu in after.items():
        name = names.get(tid, NATIVE)
        cores[name] = cores.get(name, 0.0) + (cpu - before.get(tid, 0.0)) / wall_s
    return {k: round(v, 4) for k, v in sorted(cores.items(), key=lambda kv: -kv[1]) if v >= 0.001}
