"""`alignatt failover`: engines killed and stopped under load, and what the clients saw.

Starts `alignatt serve` in a process of its own with `engines` engine processes on one device
(on CUDA they share the GPU, each asking vLLM for its share of the memory: `engines_per_gpu`),
runs N real-time speakers that reconnect when told (`failover_client`), and on the schedule of
`faults` SIGKILLs one engine process and SIGSTOPs another (each time the live engine with the
most sessions). `/health` is sampled throughout. The artifact (kind `failover`) records per
session the text shown before each loss and the final text, every notice, the time from the
fault to the notice and to the next translation, and the checks:

- nothing committed is lost: every utterance gets a final that extends every text shown for it
  (across reconnects), and no reply retracts;
- every session on a faulted engine is told within the bound: a killed engine at once (its pipe
  closes; bound `failover_record.KILL_NOTICE_S`), a stopped one within `step_deadline_s +
  heartbeat_s` (plus `failover_record.NOTICE_SLACK_S`), and gets a translation again after reconnecting;
- `/health` tells the truth: degraded (or down) from the notice on, never ok again after a fault.
"""

from __future__ import annotations

import os
import signal
import tempfile
import threading
import time
from pathlib import Path
from alignatt.core.errors import AlignattError
from alignatt.measure.server_process import ServerProcess, free_port, http_json
from alignatt.record.artifacts.options import FailoverOptions, ServersUnderFaults

HEALTH_EVERY_S = 0.25


def route_of(options: ServersUnderFaults):
    """The one direction's DirectionRoute a measurement's server serves."""
    from alignatt.serve.config import DirectionRoute

    seam_options = dict(options.seam_options)
    if options.vllm_mode:
        seam_options["vllm_mode"] = options.vllm_mode
    return DirectionRoute(model=options.model, seam=options.seam, heads=options.heads, top_k=options.top_k,
                          device=options.device, dtype=options.dtype, seam_options=seam_options)


def server_config(options: FailoverOptions, port: int) -> dict:
    """The ServerConfig (as JSON data) the server process is started with."""
    from alignatt.serve.config import ReplicaConfig, ServerConfig, ServerLimits

    route = route_of(options)
    on_gpu = options.device.startswith("cuda")
    config = ServerConfig(
        port=port, default_preset=options.preset, directions={"en-de": route},
        limits=ServerLimits(max_sessions=options.speakers * 2),  # room for reconnects while old ones close
        engines=options.engines,
        replicas=ReplicaConfig(step_deadline_s=options.step_deadline_s, heartbeat_s=options.heartbeat_s,
                               engines_per_gpu=options.engines if on_gpu else 1),
    )
    return config.model_dump(mode="json")


def _health_sampler(port: int, t0: float, samples: list[dict], stop: threading.Event) -> None:
    while not stop.is_set():
        try:
            code, body = http_json(port, "/health")
            samples.append({"t_s": round(time.time() - t0, 3), "http": code, **{k: body.get(k) for k in (
                "status", "sessions_active", "engines_alive", "engines_hung", "engines_dead")}})
        except OSError as e:
            samples.append({"t_s": round(time.time() - t0, 3), "http": None, "status": f"unreachable: {e}"})
        stop.wait(HEALTH_EVERY_S)


def _inject(server: ServerProcess, options: FailoverOptions, t0: float, faults: list[dict]) -> None:
    """At each fault's time, SIGKILL or SIGSTOP the live engine with the most sessions."""
    for action, at in sorted(options.faults, key=lambda f: f[1]):
        time.sleep(max(t0 + at - time.time(), 0.0))
        live = [e for e in server.engines() if e.get("state", "live") == "live"]
        if not live:
            faults.append({"t": time.time(), "action": action, "engine": None, "pid": None, "sessions": 0})
            continue
        victim = max(live, key=lambda e: e["sessions"])
        os.kill(victim["pid"], signal.SIGKILL if action == "kill" else signal.SIGSTOP)
        faults.append({"t": time.time(), "action": action, "engine": victim["engine"], "pid": victim["pid"],
                       "sessions": victim["sessions"]})


def run_failover(options: FailoverOptions, out: str | Path | None = "outputs/failover.json"):
    from alignatt.measure.failover_client import run_speakers
    from alignatt.measure.failover_record import failover_artifact
    from alignatt.measure.capacity import resolve_streams

    streams = [s for _, s in resolve_streams(options.streams)]
    with tempfile.TemporaryDirectory(prefix="alignatt-failover-") as tmp:
        started = time.perf_counter()
        port = free_port()
        server = ServerProcess(server_config(options, port), Path(tmp), options.seam_factory,
                               options.start_timeout_s).wait_listening()
        load_s = time.perf_counter() - started
        try:
            engines_before = server.engines()
            t0 = time.time()
            samples: list[dict] = []
            faults: list[dict] = []
            stop = threading.Event()
            sampler = threading.Thread(target=_health_sampler, args=(server.port, t0, samples, stop), daemon=True)
            injector = threading.Thread(target=_inject, args=(server, options, t0, faults), daemon=True)
            sampler.start()
            injector.start()
            records = run_speakers(f"ws://127.0.0.1:{server.port}", streams, options.speakers, options.speed,
                                   options.preset, options.stagger_s)
            injector.join(5)
            time.sleep(2 * HEALTH_EVERY_S)
            stop.set()
            sampler.join(5)
            engines_after = server.engines()
        except BaseException:
            tail = server.tail()
            server.stop()
            raise AlignattError(f"failover run failed; the server's log ends:\n{tail}") from None
        server.stop()
        artifact = failover_artifact(options, load_s, t0, faults, records, samples, engines_before, engines_after)
    if out is not None:
        from alignatt.record.artifacts import write_artifact

        write_artifact(out, artifact)
    return artifact
