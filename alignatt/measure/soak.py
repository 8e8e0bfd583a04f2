"""`alignatt soak`: minutes of mixed well-formed and hostile sessions against the server on loopback.

The server runs in a child process (127.0.0.1 only), so its RSS and descriptors are measured
from outside it, as a deployment's monitor sees them (no collection or heap trim inside the
server); a few client threads open sessions until the deadline, then stop by themselves (every session is bounded in updates and every reply wait in
time). Well-formed sessions stream sentences word by word (tail arrival, commit, final) and check
that `committed_text` only grows; hostile ones send what breaks a careless server (malformed JSON, huge
integers, lone surrogates, oversized frames, words with inner whitespace, token-bound breakers,
control characters, seq replays, idle sockets, abandoned sessions) and what issue 25 found
(256 KiB frames of nested arrays before and after init, 250 kB-prefix inits, a session pipelining
finals), and check the server's answer.
A sampler records RSS, file descriptors and active sessions over time. The `soak` artifact
records the targets and whether they were met: RSS back within 5% of its start once the load
ends, 0 retractions, 0 silent sessions (a reply that never came, with no close), 0 dropped finals,
every hostile case answered as expected, file descriptors back.
"""

from __future__ import annotations

import json
import multiprocessing
import random
import signal
import socket
import threading
import urllib.request
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from pydantic import BaseModel, ConfigDict, Field

from alignatt.capture.names import DEFAULT_SEAM
from alignatt.core.policy import POLICY_PRESETS
from alignatt.models.presets import DEFAULT_MODEL


RSS_TOLERANCE = 0.05
FD_SLACK = 2  # descriptors the runtime may open lazily (e.g. a thread pool's wake-up pipe)


class SoakOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str = DEFAULT_MODEL
    seam: str = DEFAULT_SEAM
    device: str = "cpu"
    dtype: str | None = None
    heads: str | None = Field(None, description="head-set file or bundled name (default: the model's)")
    preset: str = "balanced"
    minutes: float = Field(30.0, gt=0, description="how long sessions keep starting")
    clients: int = Field(3, ge=1, le=8, description="client threads (concurrent sessions)")
    hostile_share: float = Field(0.5, ge=0, le=1)
    sample_s: float = Field(5.0, gt=0, description="RSS / descriptor sampling period")
    settle_s: float = Field(20.0, ge=0, description="wait after the load before the final RSS")
    reply_timeout_s: float = Field(300.0, gt=0, description="a reply later than this is a silent session")
    init_timeout_s: float = Field(2.0, gt=0, description="the server's init timeout (idle sockets)")
    max_sessions_total: int = Field(100_000, ge=1, description="sessions started, at most")
    seed: int = 0


@dataclass
class Tally:
    """What the clients saw; one per thread, summed at the end."""

    sessions: dict[str, int] = field(default_factory=dict)
    updates: int = 0
    finals_sent: int = 0
    finals_answered: int = 0
    retractions: int = 0
    silent_sessions: int = 0
    client_errors: dict[str, int] = field(default_factory=dict)  # error codes received
    unexpected: list[str] = field(default_factory=list)  # hostile cases answered otherwise

    def add(self, other: "Tally") -> None:
        for k, v in other.sessions.items():
            self.sessions[k] = self.sessions.get(k, 0) + v
        for k, v in other.client_errors.items():
            self.client_errors[k] = self.client_errors.get(k, 0) + v
        self.updates += other.updates
        self.finals_sent += other.finals_sent
        self.finals_answered += other.finals_answered
        self.retractions += other.retractions
        self.silent_sessions += other.silent_sessions
        self.unexpected += other.unexpected


class Silent(Exception):
    """A reply that did not come in time, on a connection that was not closed."""


class _Client:
    def __init__(self, url: str, tally: Tally, timeout: float) -> None:
        from websockets.sync.client import connect

        self.ws = connect(url, open_timeout=10.0, max_size=None, legacy=True)
        self.tally, self.timeout, self.seq = tally, timeout, 0
        self.shown: dict[int, str] = {}  # utterance id -> committed_text last seen

    def send(self, frame) -> None:
        self.ws.send(frame if isinstance(frame, (str, bytes)) else json.dumps(frame))

    def recv(self) -> dict:
        try:
            reply = json.loads(self.ws.recv(timeout=self.timeout))
        except TimeoutError:
            raise Silent from None
        if reply.get("type") == "error":
            code = reply.get("code", "?")
            self.tally.client_errors[code] = self.tally.client_errors.get(code, 0) + 1
        elif reply.get("type") == "translation":
            uid, text = reply["utterance_id"], reply["committed_text"]
            if not text.startswith(self.shown.get(uid, "")):
                self.tally.retractions += 1
            self.shown[uid] = text
        return reply

    def init(self, **fields) -> dict:
        self.send({"type": "init", "protocol_version": 1, "source_lang": "en", "target_lang": "de", **fields})
        return self.recv()

    def ask(self, words, tail=(), final=False, utterance_id: int | None = 0, **extra) -> dict:
        self.seq += 1
        frame = {"type": "update", "seq": self.seq, "words": [[w, None, None] for w in words],
                 "tail": {"words": [[w, None, None] for w in tail]}, "is_final": final, **extra}
        if utterance_id is not None:
            frame["utterance_id"] = utterance_id
        self.send(frame)
        self.tally.updates += 1
        self.tally.finals_sent += final
        while True:
            reply = self.recv()
            if reply.get("type") == "error" or (reply.get("seq") or -1) >= self.seq:
                self.tally.finals_answered += final
                return reply

    def close(self) -> None:
        self.ws.close()


def _sentences(words: list[str]) -> list[list[str]]:
    from alignatt.replay.stream import ends_sentence

    out, cur = [], []
    for w in words:
        cur.append(w)
        if ends_sentence(w):
            out.append(cur)
            cur = []
    return out + ([cur] if cur else [])


def well_formed(c: _Client, rng: random.Random, sentences: list[list[str]], deadline: float) -> None:
    """One to two utterances, streamed word by word (arrival as tail, then commit), then a final.

    Past the deadline the open utterance goes straight to its final, so the load ends promptly.
    """
    c.init(preset=rng.choice(list(POLICY_PRESETS)))
    named = rng.random() < 0.7  # else utterance_id is left out (the open utterance)
    for uid in range(rng.randint(1, 2)):
        words = rng.choice(sentences)
        for i in range(len(words)):
            if time.monotonic() > deadline:
                break
            c.ask(words[:i], words[i:i + 1], utterance_id=uid if named else None)
            c.ask(words[: i + 1], utterance_id=uid if named else None)
        reply = c.ask(words, final=True, utterance_id=uid if named else None)
        if reply.get("type") != "translation" or not reply.get("final"):
            c.tally.unexpected.append(f"well_formed final answered {reply.get('type')}: {reply.get('message', '')}"[:200])


def _expect_error(c: _Client, frame, fragment: str, name: str) -> None:
    c.send(frame)
    r = c.recv()
    if r.get("type") != "error" or fragment not in r.get("message", ""):
        c.tally.unexpected.append(f"{name}: {r}"[:200])
        return
    r = c.ask(["still", "here"], utterance_id=None)
    if r.get("type") != "translation":
        c.tally.unexpected.append(f"{name}: session did not go on: {r}"[:200])


_INIT = '{"type": "init", "protocol_version": 1, "source_lang": "en", "target_lang": "de"'


def _update(c: _Client, **fields) -> str:
    c.seq += 1  # a valid seq: the frame is refused for what it holds, not for its order
    return json.dumps({"type": "update", "seq": c.seq, **fields})


def _malformed_json(c: _Client) -> None:
    c.init()
    _expect_error(c, "{not json", "invalid JSON", "malformed_json")


def _huge_integer(c: _Client) -> None:
    c.init()
    _expect_error(c, '{"type": "update", "seq": 1, "clock_ms": ' + "9" * 5000 + "}", "invalid JSON", "huge_integer")


def _surrogate_override_key(c: _Client) -> None:
    c.send(_INIT + ', "overrides": {"\\ud800": 1}}')
    r = c.recv()
    if r.get("type") != "error" or "surrogate" not in r.get("message", ""):
        c.tally.unexpected.append(f"surrogate_override_key: {r}"[:200])
    c.init()
    if c.ask(["hello"], utterance_id=None).get("type") != "translation":
        c.tally.unexpected.append("surrogate_override_key: the session did not work after the refusal")


def _inner_whitespace(c: _Client) -> None:
    c.init()
    _expect_error(c, _update(c, words=[["two words", None, None]]), "whitespace", "inner_whitespace")


def _oversized_frame(c: _Client) -> None:
    c.init()
    _expect_error(c, _update(c, pad="x" * 300_000), "exceeds", "oversized_frame")


def _token_bound(c: _Client) -> None:
    c.init()
    words = [[f"{i}" + "x" * 190, None, None] for i in range(300)]  # within every word limit
    _expect_error(c, _update(c, words=words, is_final=True), "max_prompt_tokens", "token_bound")


def _update_before_init(c: _Client) -> None:
    c.send(json.dumps({"type": "update", "seq": 1, "words": []}))
    r = c.recv()
    if r.get("type") != "error" or "before init" not in r.get("message", ""):
        c.tally.unexpected.append(f"update_before_init: {r}"[:200])
    c.init()
    if c.ask(["hello"], utterance_id=None).get("type") != "translation":
        c.tally.unexpected.append("update_before_init: the session did not work after init")


def nested_arrays_frame(items: int = 216, depth: int = 600) -> str:
    """A 256 KiB update of deeply nested empty arrays: valid JSON, 130 000 values."""
    return '{"type": "update", "seq": 1, "x": [' + ",".join(["[" * depth + "]" * depth] * items) + "]}"


def _nested_arrays_in_session(c: _Client) -> None:
    c.init()
    c.seq += 1
    _expect_error(c, nested_arrays_frame().replace('"seq": 1', f'"seq": {c.seq}', 1), "JSON values",
                  "nested_arrays_in_session")


def _final_flood(c: _Client) -> None:
    """Finals of 40 words pipelined without reading (within every limit), then every reply read."""
    c.init()
    words = [f"word{i}" for i in range(39)] + ["end."]
    for uid in range(12):
        c.seq += 1
        c.send({"type": "update", "seq": c.seq, "utterance_id": uid, "words": [[w, None, None] for w in words],
                "is_final": True})
        c.tally.updates += 1
        c.tally.finals_sent += 1
    answered = 0
    while answered < 12:
        r = c.recv()
        if r.get("type") == "translation" and r.get("final"):
            answered += 1
            c.tally.finals_answered += 1
        elif r.get("type") == "error":
            c.tally.unexpected.append(f"final_flood: {r}"[:200])
            return


def _hostile_frames() -> dict[str, Callable[[_Client], None]]:
    return {
        "malformed_json": _malformed_json,
        "huge_integer": _huge_integer,
        "surrogate_override_key": _surrogate_override_key,
        "surrogate_prefix": _surrogate_prefix,
        "inner_whitespace": _inner_whitespace,
        "oversized_frame": _oversized_frame,
        "token_bound": _token_bound,
        "control_characters": _control_characters,
        "seq_replay": _seq_replay,
        "update_before_init": _update_before_init,
        "abandoned": _abandoned,
        "nested_arrays_in_session": _nested_arrays_in_session,
        "final_flood": _final_flood,
    }


def _surrogate_prefix(c: _Client) -> None:
    c.send('{"type": "init", "protocol_version": 1, "source_lang": "en", "target_lang": "de", '
           '"accepted_target_prefix": "Das \\udfff"}')
    r = c.recv()
    if r.get("type") != "error" or "surrogate" not in r.get("message", ""):
        c.tally.unexpected.append(f"surrogate_prefix: {r}"[:200])
    if c.init().get("type") != "init_ok" or c.ask(["hello"], final=True).get("type") != "translation":
        c.tally.unexpected.append("surrogate_prefix: the session did not work after the refusal")


def _control_characters(c: _Client) -> None:
    import re

    c.init(accepted_target_prefix="Das \u202eHaus")
    r = c.ask(["bell\x07", "rtl\u202ex", "end."], final=True)
    bad = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
    if r.get("type") != "translation" or bad.search(r["committed_text"] + r["buffer_text"]):
        c.tally.unexpected.append(f"control_characters: {r}"[:200])


def _seq_replay(c: _Client) -> None:
    c.init()
    c.ask(["one"])
    c.seq -= 1  # the same seq again
    r = c.ask(["one", "two"])
    if r.get("type") != "error" or "does not follow" not in r.get("message", ""):
        c.tally.unexpected.append(f"seq_replay: {r}"[:200])


def _abandoned(c: _Client) -> None:
    c.init()
    c.send(json.dumps({"type": "update", "seq": 1, "words": [["left", None, None], ["behind", None, None]]}))
    c.close()  # gone before the reply


def _connection_cases(url: str, tally: Tally, options: SoakOptions, name: str) -> None:
    """Cases that need no protocol client: idle sockets, raw TCP, frames past the hard cap."""
    from websockets.exceptions import ConnectionClosed
    from websockets.sync.client import connect

    host, port = url.removeprefix("ws://").rsplit(":", 1)
    if name == "raw_tcp":
        socket.create_connection((host, int(port)), timeout=5).close()
        return
    with connect(url, open_timeout=10.0, max_size=None) as ws:
        try:
            if name == "frame_past_hard_cap":
                ws.send("x" * (5 * 256 * 1024))
            elif name in _BEFORE_INIT:  # one bad_protocol, then the close
                ws.send(_BEFORE_INIT[name]())
                reply = json.loads(ws.recv(timeout=10.0))
                if reply.get("code") != "bad_protocol" or len(reply.get("message", "")) > 500:
                    tally.unexpected.append(f"{name}: {reply}"[:200])
            ws.recv(timeout=max(options.init_timeout_s * 3, 10.0))
            tally.unexpected.append(f"{name}: the server did not close the connection")
        except ConnectionClosed as e:
            want = 1009 if name == "frame_past_hard_cap" else 1008
            if e.rcvd is None or e.rcvd.code != want:
                tally.unexpected.append(f"{name}: closed with {e.rcvd}")
        except TimeoutError:
            tally.unexpected.append(f"{name}: no close in time")


# Frames that a connection sends before any init (the server answers one bad_protocol, then closes).
_BEFORE_INIT: dict[str, Callable[[], str]] = {
    "nested_arrays_before_init": nested_arrays_frame,
    "huge_prefix_init": lambda: _INIT + ', "accepted_target_prefix": "' + "Wort " * 50_000 + '"}',
}
_CONNECTION_CASES = ("raw_tcp", "idle_no_init", "frame_past_hard_cap", *_BEFORE_INIT)
HOSTILE_CASES = sorted([*_hostile_frames(), *_CONNECTION_CASES])


def run_session(url: str, kind: str, tally: Tally, rng: random.Random, sentences, options: SoakOptions,
                deadline: float = float("inf")) -> None:
    tally.sessions[kind] = tally.sessions.get(kind, 0) + 1
    if kind in _CONNECTION_CASES:
        _connection_cases(url, tally, options, kind)
        return
    from websockets.exceptions import ConnectionClosed

    c = _Client(url, tally, options.reply_timeout_s)
    try:
        if kind == "well_formed":
            well_formed(c, rng, sentences, deadline)
        else:
            _hostile_frames()[kind](c)
    except Silent:
        tally.silent_sessions += 1
    except ConnectionClosed as e:
        if kind != "abandoned":
            tally.unexpected.append(f"{kind}: connection closed ({e.rcvd})"[:200])
    finally:
        c.close()


# ---- measuring ----


class _ServedProcess:
    """The server in a child process: its URL, and its RSS, descriptors and counters read from outside."""

    def __init__(self, config, seam_factory) -> None:
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
        with urllib.request.urlopen(self.http + "/stats", timeout=10) as response:
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
    from alignatt.record.artifacts import ARTIFACT_SCHEMA_VERSION, Check, SoakArtifact, write_artifact
    from alignatt.record.provenance import collect_provenance, model_identity
    from alignatt.replay.stream import load_stream
    from alignatt.serve.config import DirectionRoute, ServerConfig, ServerLimits

    try:
        model_id, revision = model_identity(options.model)
    except Exception:  # noqa: BLE001 - identity is best effort (a test fake, a local path)
        model_id, revision = options.model, None
    # Recorded before the load: the code and the machine that ran it, not whatever is checked out after.
    provenance = collect_provenance(model_id=model_id, model_revision=revision)
    sentences = _sentences(load_stream().words)
    route = DirectionRoute(model=options.model, seam=options.seam, device=options.device, dtype=options.dtype,
                           heads=options.heads)
    limits = ServerLimits(max_sessions=max(8, options.clients + 2), init_timeout_s=options.init_timeout_s)
    config = ServerConfig(host="127.0.0.1", port=0, default_preset=options.preset, directions={"en-de": route},
                          limits=limits)
    cases = ["well_formed", *HOSTILE_CASES]
    handle = _ServedProcess(config, seam_factory)
    try:
        warm = Tally()
        for kind in cases:  # every path once, so lazily built state exists before the start RSS
            run_session(handle.url, kind, warm, random.Random(options.seed), sentences, options,
                        deadline=time.monotonic() + 30.0)
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
                    run_session(handle.url, kind, tallies[i], rng, sentences, options, deadline)
                except Exception as e:  # noqa: BLE001 - a client-side failure is recorded, the soak goes on
                    tallies[i].unexpected.append(f"{kind}: client failed: {type(e).__name__}: {e}"[:200])

        threads = [threading.Thread(target=client_loop, args=(i,), name=f"soak-client-{i}") for i in range(options.clients)]
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
        config={**options.model_dump(), "limits": limits.model_dump(), "hostile_cases": HOSTILE_CASES,
                "warmup": "every case once before the start RSS; counted in every total",
                "rss": "the server's child process, read from outside (psutil on its pid): no collection or heap trim",
                "seam_factory": "alignatt" if seam_factory is None else type(seam_factory).__name__},
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
