"""`alignatt replicas`: `alignatt serve` replicas behind HAProxy, one killed and one drained under load.

Starts `replicas` servers (one engine each, a process each), writes the balancer's configuration
with `alignatt deploy haproxy`'s generator (`serve/balancer.py`) and runs HAProxy on it. Then:

1. the balancer's round trip against a direct one, interleaved on two open sessions (WebSocket
   ping -> pong), and what opening a session costs each way (connect, handshake, init);
2. N real-time speakers through the balancer, reconnecting when told (`failover_client`: they resume
   with `accepted_target_prefix` and send again the finals not answered), while on the schedule of
   `faults` one replica is SIGKILLed (with its process group) and another gets SIGTERM (it drains:
   `MTServer.drain`), each time the live replica holding the most sessions; or, `restart` faults,
   each replica in turn is drained and started again (a rolling restart). The balancer's view of
   every replica (its stats page) is sampled throughout.

The artifact (kind `replicas`) records per session what failover records, the reconnect times, the
round trips and the rotation, and checks: every speaker finishes its stream; nothing committed is
lost or retracted; every session told to reconnect is in session again within `reconnect_bound_s` of
the notice; the balancer takes each faulted replica out of rotation within its checks' time (and a
restarted one back); a drained or restarted replica exits 0 within `drain_s` and a few seconds.
"""

from __future__ import annotations

import csv
import io
import os
import signal
import statistics
import subprocess
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from alignatt.core.errors import AlignattError
from alignatt.measure.failover import route_of
from alignatt.record.artifacts.options import ReplicasOptions
from alignatt.measure.server_process import ServerProcess, free_port, http_json

ROTATION_EVERY_S = 0.25


def replica_config(options: ReplicasOptions, port: int) -> dict:
    """One replica's ServerConfig (as JSON data)."""
    from alignatt.serve.config import ServerConfig, ServerLimits

    limits = ServerLimits(
        max_sessions=options.speakers * 2,  # room for every speaker, and reconnects while old ones close
        # behind the balancer every client's address is the balancer's: bound it as the whole server
        max_connections_before_init_per_peer=ServerLimits().max_connections_before_init)
    config = ServerConfig(port=port, directions={"en-de": route_of(options)}, limits=limits,
                          engines=1, drain_s=options.drain_s)
    return config.model_dump(mode="json")


def _threads_env(options: ReplicasOptions) -> dict[str, str]:
    """Replicas on one host's CPU split its cores: each torch takes its share, not all of them (on two
    cores, three replicas of two threads each spend their time preempting one another)."""
    if not options.device.startswith("cpu"):
        return {}
    share = str(max(1, (os.cpu_count() or 1) // options.replicas))
    return {"OMP_NUM_THREADS": share, "MKL_NUM_THREADS": share}


class Balancer:
    """HAProxy on the generated configuration, in the foreground, with its stats page."""

    def __init__(self, options: ReplicasOptions, ports: list[int], workdir: Path) -> None:
        from alignatt.serve.balancer import BalancerOptions, haproxy_config

        self.port, self.stats_port = free_port(), free_port()
        self.options = BalancerOptions(
            replicas=[f"127.0.0.1:{p}" for p in ports], bind=f"127.0.0.1:{self.port}",
            stats_bind=f"127.0.0.1:{self.stats_port}", health_check=options.health_check,
            check_interval_ms=options.check_interval_ms)
        self.text = haproxy_config(self.options)
        self.config = workdir / "haproxy.cfg"
        self.config.write_text(self.text)
        try:
            version = subprocess.run([options.haproxy, "-v"], capture_output=True, text=True, check=True)
        except (OSError, subprocess.CalledProcessError) as e:
            raise AlignattError(f"HAProxy is needed ({options.haproxy!r}: {e}); install it: apt-get install "
                                "haproxy") from None
        self.version = version.stdout.splitlines()[0]
        self.log = workdir / "haproxy.log"
        with self.log.open("wb") as out:
            self.process = subprocess.Popen([options.haproxy, "-db", "-f", str(self.config)], stdout=out,
                                            stderr=subprocess.STDOUT)

    def statuses(self) -> dict[str, str]:
        """The balancer's status of each replica (UP, DOWN, `no check`...), from its stats CSV."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.stats_port}/stats;csv", timeout=5) as r:
            text = r.read().decode()
        rows = csv.DictReader(io.StringIO(text.lstrip("# ")))
        return {row["svname"]: row["status"] for row in rows
                if row["pxname"] == "replicas" and row["svname"].startswith("replica")}

    def wait_up(self, replicas: int, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            if self.process.poll() is not None:
                raise AlignattError(f"haproxy exited ({self.process.returncode}):\n{self.log.read_text()[-2000:]}")
            try:
                states = self.statuses()
                if len(states) == replicas and all(s in ("UP", "no check") for s in states.values()):
                    return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise AlignattError(f"the balancer did not see every replica up within {timeout_s:.0f} s")
            time.sleep(0.1)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()


def _p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(int(q * len(ordered)), len(ordered) - 1)], 3)


def measure_rtt(direct_url: str, balanced_url: str, probes: int) -> dict[str, Any]:
    """Ping round trips on two open sessions, interleaved, and session opens each way."""
    from alignatt.replay.client import ProtocolClient

    def opened(url: str) -> tuple[ProtocolClient, float]:
        began = time.perf_counter()
        client = ProtocolClient.connect(url, timeout=30)
        client.open()
        return client, (time.perf_counter() - began) * 1000.0

    opens: dict[str, list[float]] = {"direct": [], "balanced": []}
    pings: dict[str, list[float]] = {"direct": [], "balanced": []}
    for _ in range(10):
        for name, url in (("direct", direct_url), ("balanced", balanced_url)):
            client, ms = opened(url)
            opens[name].append(ms)
            client.close()
    clients = {"direct": opened(direct_url)[0], "balanced": opened(balanced_url)[0]}
    try:
        for _ in range(probes):
            for name, client in clients.items():
                began = time.perf_counter()
                if not client.ws.ping().wait(10):
                    raise AlignattError(f"no pong within 10 s ({name})")
                pings[name].append((time.perf_counter() - began) * 1000.0)
    finally:
        for client in clients.values():
            client.close()
    return dict(probes=probes,
                ping_direct_ms_p50=_p(pings["direct"], 0.5), ping_balanced_ms_p50=_p(pings["balanced"], 0.5),
                ping_added_ms_p50=round(statistics.median(b - d for d, b in zip(pings["direct"], pings["balanced"])), 3),
                ping_direct_ms_p95=_p(pings["direct"], 0.95), ping_balanced_ms_p95=_p(pings["balanced"], 0.95),
                open_direct_ms_p50=_p(opens["direct"], 0.5), open_balanced_ms_p50=_p(opens["balanced"], 0.5))


def _rotation_sampler(balancer: Balancer, t0: float, samples: list[dict], stop: threading.Event) -> None:
    while not stop.is_set():
        try:
            samples.append({"t_s": round(time.time() - t0, 3), **balancer.statuses()})
        except OSError:
            pass
        stop.wait(ROTATION_EVERY_S)


def _inject(servers: list[ServerProcess], options: ReplicasOptions, t0: float, faults: list[dict]) -> None:
    """At each fault's time, SIGKILL, drain or restart the live replica holding the most sessions (of
    those not faulted before; a restarted replica replaces its predecessor in `servers`)."""
    faulted: set[int] = set()
    for action, at in sorted(options.faults, key=lambda f: f[1]):
        time.sleep(max(t0 + at - time.time(), 0.0))
        live = []
        for i, server in enumerate(servers):
            if i in faulted or server.process.poll() is not None:
                continue
            try:
                live.append((http_json(server.port, "/health")[1].get("sessions_active", 0), i))
            except OSError:
                continue
        if not live:
            continue
        sessions, i = max(live)
        faulted.add(i)
        fault = {"t": time.time(), "action": action, "replica": f"replica{i + 1}", "pid": servers[i].process.pid,
                 "sessions": sessions, "exit_code": None, "exited_after_s": None}
        faults.append(fault)
        if action == "kill":
            servers[i].kill()
        else:
            servers[i].process.send_signal(signal.SIGTERM)
            servers[i].process.wait(options.drain_s + 60)
        fault["exit_code"] = servers[i].process.returncode
        fault["exited_after_s"] = round(time.time() - fault["t"], 3)
        if action == "restart":  # a rolling restart's step: the same replica, started again
            servers[i] = servers[i].again().wait_listening()
            fault["back_after_s"] = round(time.time() - fault["t"], 3)


def run_replicas(options: ReplicasOptions, out: str | Path | None = "outputs/replicas.json"):
    from alignatt.measure.capacity import resolve_streams
    from alignatt.measure.failover_client import run_speakers
    from alignatt.measure.replicas_record import replicas_artifact

    streams = [s for _, s in resolve_streams(options.streams)]
    with tempfile.TemporaryDirectory(prefix="alignatt-replicas-") as tmp:
        workdir = Path(tmp)
        started = time.perf_counter()
        servers: list[ServerProcess] = []
        balancer = None
        try:
            for i in range(options.replicas):  # started together, loaded in parallel
                servers.append(ServerProcess(replica_config(options, free_port()), workdir, options.seam_factory,
                                             options.start_timeout_s, name=f"replica{i + 1}",
                                             env=_threads_env(options)))
            for server in servers:
                server.wait_listening()
            load_s = time.perf_counter() - started
            balancer = Balancer(options, [s.port for s in servers], workdir)
            balancer.wait_up(options.replicas)
            balanced_url = f"ws://127.0.0.1:{balancer.port}"
            rtt = measure_rtt(f"ws://127.0.0.1:{servers[0].port}", balanced_url, options.rtt_probes)
            t0 = time.time()
            rotation: list[dict] = []
            faults: list[dict] = []
            stop = threading.Event()
            sampler = threading.Thread(target=_rotation_sampler, args=(balancer, t0, rotation, stop), daemon=True)
            injector = threading.Thread(target=_inject, args=(servers, options, t0, faults), daemon=True)
            sampler.start()
            injector.start()
            records = run_speakers(balanced_url, streams, options.speakers, options.speed, options.preset,
                                   options.stagger_s)
            injector.join(options.drain_s + 70)
            time.sleep(2 * ROTATION_EVERY_S)
            stop.set()
            sampler.join(5)
            opened = {}
            for i, server in enumerate(servers):
                if server.process.poll() is None:
                    opened[f"replica{i + 1}"] = http_json(server.port, "/stats")[1].get("sessions_opened")
        except Exception as e:
            tails = "\n".join(f"--- {s.name}:\n{s.tail(1500)}" for s in servers)
            raise AlignattError(f"replicas run failed ({type(e).__name__}: {e}); the servers' logs end:\n{tails}") from e
        finally:
            if balancer is not None:
                balancer.stop()
            for server in servers:
                server.stop()
        fates = {f["replica"]: f["action"] for f in faults}
        replicas = [{"replica": f"replica{i + 1}", "port": s.port, "sessions_opened": opened.get(f"replica{i + 1}"),
                     "fate": {"kill": "killed", "drain": "drained", "restart": "restarted"}.get(
                         fates.get(f"replica{i + 1}"), "served to the end")}
                    for i, s in enumerate(servers)]
        balancer_info = {"version": balancer.version, "health_check": options.health_check,
                         "config": balancer.text}
        artifact = replicas_artifact(options, load_s, t0, faults, records, rtt, rotation, replicas, balancer_info)
    if out is not None:
        from alignatt.record.artifacts import write_artifact

        write_artifact(out, artifact)
    return artifact
