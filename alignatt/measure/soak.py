"""`alignatt soak`: minutes of mixed well-formed and hostile sessions against the server on loopback.

The server runs in a child process (127.0.0.1 only), so its RSS and descriptors are measured
from outside it, as a deployment's monitor sees them (no collection or heap trim inside the
server); a few client threads open sessions (`alignatt.measure.soak_sessions`) until the
deadline, then stop by themselves (every session is bounded in updates and every reply wait in
time). A sampler records RSS, file descriptors and active sessions over time. The `soak`
artifact records the targets and whether they were met: RSS back within 5% of its start once
the load ends, 0 retractions, 0 silent sessions (a reply that never came, with no close), 0
dropped finals, every hostile case answered as expected, file descriptors back. The server
requires a token (a fresh one per soak, in a private file), as an exposed server does: every case
presents it, but those about the token (`alignatt.measure.soak_access`).
"""

from __future__ import annotations

import json
import multiprocessing
import random
import secrets
import shutil
import signal
import tempfile
import threading
import urllib.request
import time
from pathlib import Path
from typing import Callable

from alignatt.core.progress import timed_bar
from alignatt.record.artifacts.options import SoakOptions
from alignatt.measure.soak_sessions import HOSTILE_CASES, Tally, Timeouts, run_session, sentences_of


RSS_TOLERANCE = 0.05
FD_SLACK = 2  # descriptors the runtime may open lazily (e.g. a thread pool's wake-up pipe)


# ---- measuring ----


class _ServedProcess:
    """The server in a child process: its URL, and its RSS, descriptors and counters read from outside."""

    def __init__(self, config, seam_factory, token: str | None = None) -> None:
        self.token = token  # what /stats needs when the server requires one
        ctx = multiprocessing.get_context("spawn")  # a fresh interpreter: nothing of this one's heap
        parent, child = ctx.Pipe()
        self.process = ctx.Process(target=_serve_child, args=(config, seam_factory, child), name="soak-server")
        self.process.start()
        child.close()
        if not parent.poll(600):
            self.stop()
            raise RuntimeError("the soak's server did not start within 600 s")
        started = parent.recv()
        if isinstance(started, BaseException):
            self.process.join(10)
            raise started
        self.url = f"ws://127.0.0.1:{started}"
        self.http = f"http://127.0.0.1:{started}"

    def rss(self) -> int:
        import psutil

        return psutil.Process(self.process.pid).memory_info().rss

    def fds(self) -> int:
        import psutil

        return psutil.Process(self.process.pid).num_fds()

    def stats(self) -> dict:
        headers = {"Authorization": f"Bearer {self.token}"} if self.token is not None else {}
        with urllib.request.urlopen(urllib.request.Request(self.http + "/stats", headers=headers),
                                    timeout=10) as response:
            return json.loads(response.read())

    def stop(self) -> None:
        if self.process.is_alive():
            self.process.terminate()  # SIGTERM: `serve` stops cleanly
        self.process.join(60)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(10)


def _serve_child(config, seam_factory, conn) -> None:
    from alignatt.serve.server import serve

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the soak, which stops this child
    try:
        serve(config, seam_factory, on_ready=lambda server: conn.send(server.port))
    except BaseException as e:  # noqa: BLE001 - reported to the soak, which raises it
        conn.send(RuntimeError(f"the soak's server failed: {type(e).__name__}: {e}"))


class _Sampler(threading.Thread):
    def __init__(self, period: float, started: float, served: _ServedProcess,
                 progress: Callable[[str], None] | None = None) -> None:
        super().__init__(name="soak-sampler", daemon=True)
        self.period, self.started, self.served = period, started, served
        self.progress = progress
        self._last_report = 0.0
        self.samples: list[dict] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                sample = {"t_s": round(time.monotonic() - self.started, 1),
                          "rss_mb": round(self.served.rss() / 2**20, 1),
                          "fds": self.served.fds(), "sessions_active": self.served.stats()["sessions_active"]}
            except Exception:  # noqa: BLE001 - a sample that cannot be read (the server busy) is skipped
                self.stop.wait(self.period)
                continue
            self.samples.append(sample)
            if self.progress is not None and sample["t_s"] - self._last_report >= 60:
                self._last_report = sample["t_s"]
                self.progress(f"soak: {sample['t_s']:.0f} s, RSS {sample['rss_mb']} MiB, {sample['fds']} fds, "
                              f"{sample['sessions_active']} sessions active")
            self.stop.wait(self.period)


def run_soak(options: SoakOptions, out: str | Path | None = "outputs/cpu/soak.json", seam_factory=None,
             progress: Callable[[str], None] | None = None):
    """Start the server on loopback, run the load until the deadline, write the `soak` artifact."""
    from alignatt.record.artifacts import ARTIFACT_SCHEMA_VERSION, Check, SoakArtifact, SoakRecord, write_artifact
    from alignatt.record.provenance import collect_provenance, model_identity
    from alignatt.replay.stream import load_stream
    from alignatt.serve.config import DirectionRoute, ServerConfig, ServerLimits

    try:
        model_id, revision = model_identity(options.model)
    except Exception:  # noqa: BLE001 - identity is best effort (a test fake, a local path)
        model_id, revision = options.model, None
    # Recorded before the load: the code and the machine that ran it, not whatever is checked out after.
    provenance = collect_provenance(model_id=model_id, model_revision=revision)
    sentences = sentences_of(load_stream().words)
    timeouts = Timeouts(reply_s=options.reply_timeout_s, init_s=options.init_timeout_s,
                        idle_hold_s=options.idle_hold_s)
    route = DirectionRoute(model=options.model, seam=options.seam, device=options.device, dtype=options.dtype,
                           heads=options.heads)
    limits = ServerLimits(max_sessions=max(8, options.clients + 2), init_timeout_s=options.init_timeout_s)
    token_dir = tempfile.mkdtemp(prefix="alignatt-soak-")  # mode 0700: the token file is private
    token = secrets.token_urlsafe(24)
    token_file = Path(token_dir) / "token"
    token_file.write_text(token + "\n")
    config = ServerConfig(host="127.0.0.1", port=0, default_preset=options.preset, directions={"en-de": route},
                          limits=limits, token_file=str(token_file))
    cases = ["well_formed", *HOSTILE_CASES]
    try:
        handle = _ServedProcess(config, seam_factory, token)
    except BaseException:
        shutil.rmtree(token_dir, ignore_errors=True)
        raise
    try:
        warm = Tally()
        for kind in cases:  # every path once, so lazily built state exists before the start RSS
            run_session(handle.url, kind, warm, random.Random(options.seed), sentences, timeouts,
                        deadline=time.monotonic() + 30.0, token=token)
        time.sleep(min(options.settle_s, 2.0))
        rss_start, fds_start = handle.rss(), handle.fds()
        started = time.monotonic()
        if progress is not None:
            progress(f"soak: warm-up done ({warm.updates} updates, unexpected: {warm.unexpected or 'none'}, "
                     f"silent {warm.silent_sessions}), RSS {rss_start / 2**20:.1f} MiB; load for {options.minutes:g} min")
        sampler = _Sampler(options.sample_s, started, handle, progress)
        sampler.start()
        deadline = started + options.minutes * 60.0
        tallies = [Tally() for _ in range(options.clients)]
        budget = {"left": options.max_sessions_total}
        lock = threading.Lock()

        def client_loop(i: int) -> None:
            rng = random.Random(options.seed * 1000 + i)
            while time.monotonic() < deadline:
                with lock:
                    if budget["left"] <= 0:
                        return
                    budget["left"] -= 1
                hostile = rng.random() < options.hostile_share
                kind = rng.choice(HOSTILE_CASES) if hostile else "well_formed"
                try:
                    run_session(handle.url, kind, tallies[i], rng, sentences, timeouts, deadline, token)
                except Exception as e:  # noqa: BLE001 - a client-side failure is recorded, the soak goes on
                    tallies[i].unexpected.append(f"{kind}: client failed: {type(e).__name__}: {e}"[:200])

        threads = [threading.Thread(target=client_loop, args=(i,), name=f"soak-client-{i}") for i in range(options.clients)]
        with timed_bar(options.minutes * 60.0, "soak: hostile + well-formed sessions"):
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        load_s = time.monotonic() - started
        if progress is not None:
            progress(f"soak: load ended after {load_s:.0f} s; settling {options.settle_s:g} s")
        time.sleep(options.settle_s)
        rss_end, fds_end = handle.rss(), handle.fds()
        sampler.stop.set()
        sampler.join()
        snapshot = handle.stats()
        stats = {k: snapshot[k] for k in ("errors", "closes", "sessions_opened", "sessions_active", "updates",
                                          "engine_calls")}
    finally:
        handle.stop()
        shutil.rmtree(token_dir, ignore_errors=True)
    total = Tally()
    for t in [warm, *tallies]:  # the warm-up's sessions are checked like the others
        total.add(t)
    change = (rss_end - rss_start) / rss_start
    dropped = total.finals_sent - total.finals_answered
    checks = [
        Check(name="rss_back_within_5pct", passed=abs(change) <= RSS_TOLERANCE,
              detail=f"{rss_start / 2**20:.1f} -> {rss_end / 2**20:.1f} MiB ({change * 100:+.2f}%)"),
        Check(name="zero_retractions", passed=total.retractions == 0, detail=str(total.retractions)),
        Check(name="zero_silent_sessions", passed=total.silent_sessions == 0, detail=str(total.silent_sessions)),
        Check(name="zero_dropped_finals", passed=dropped == 0, detail=f"{total.finals_answered}/{total.finals_sent} answered"),
        Check(name="hostile_cases_as_expected", passed=not total.unexpected, detail="; ".join(total.unexpected[:5])),
        Check(name="file_descriptors_back", passed=fds_end <= fds_start + FD_SLACK, detail=f"{fds_start} -> {fds_end}"),
    ]
    artifact = SoakArtifact(
        schema_version=ARTIFACT_SCHEMA_VERSION,
        provenance=provenance,
        config=SoakRecord(
            **options.model_dump(), limits=limits.model_dump(), hostile_cases=HOSTILE_CASES,
            warmup="every case once before the start RSS; counted in every total",
            rss="the server's child process, read from outside (psutil on its pid): no collection or heap trim",
            seam_factory="alignatt" if seam_factory is None else type(seam_factory).__name__),
        load_s=round(load_s, 1),
        sessions=total.sessions,
        updates=total.updates,
        finals=total.finals_sent,
        dropped_finals=dropped,
        retractions=total.retractions,
        silent_sessions=total.silent_sessions,
        hostile_unexpected=total.unexpected[:50],
        client_errors=total.client_errors,
        server=stats,
        rss_start_mb=round(rss_start / 2**20, 1),
        rss_end_mb=round(rss_end / 2**20, 1),
        rss_change_pct=round(change * 100, 2),
        fds_start=fds_start,
        fds_end=fds_end,
        samples=sampler.samples,
        checks=checks,
        passed=all(c.passed for c in checks),
    )
    if out is not None:
        write_artifact(out, artifact)
    return artifact


def summary_line(artifact) -> str:
    checks = ", ".join(f"{c.name} {'ok' if c.passed else 'FAILED'} ({c.detail})" for c in artifact.checks)
    return (f"soak {'passed' if artifact.passed else 'FAILED'}: {sum(artifact.sessions.values())} sessions, "
            f"{artifact.updates} updates, {artifact.finals} finals in {artifact.load_s} s; {checks}")
