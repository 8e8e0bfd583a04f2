"""Issue 42's lockout, as it was found: 32 WebSocket connections that never send init, opened at once
and opened again whenever one is dropped, held while honest clients come and go. Every honest client
from another address is served, and `/health` says a new client is admitted throughout. (A client
that shares the attacker's address shares its bound: the token is what keeps such a peer out.) (The soak runs the same shape for 60 s: `alignatt.measure.soak_sessions`.)

Loopback only: the attacker's sockets come from 127.0.0.2, a second loopback address on Linux.
Bounded: HOLD_S seconds, 32 attacker threads, one honest client at a time.
"""

import json
import threading
import time
import urllib.error
import urllib.request

from alignatt.replay.client import ProtocolClient
from tests.support.server_client import fake_server

HOLD_S = 6.0  # the issue held 75 s; the shape, not the length, is what locked the server out
IDLE = 32
ATTACKER = "127.0.0.2"


def hold_idle(url: str, stop: float, opened: list) -> None:
    """One attacker socket at a time, never sending init, opened again whenever it is dropped or refused."""
    from websockets.sync.client import connect

    while time.monotonic() < stop:
        try:
            ws = connect(url, open_timeout=5.0, source_address=(ATTACKER, 0), legacy=True)
        except Exception:  # noqa: BLE001 - refused (503) or reset: try again
            time.sleep(0.05)
            continue
        opened.append(1)
        try:
            ws.recv(timeout=max(stop - time.monotonic(), 0.01))  # until the server drops it
        except Exception:  # noqa: BLE001 - closed by the server, or the hold is over
            pass
        finally:
            ws.close()


def health_status(port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
            json.loads(r.read())
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def test_idle_connections_held_at_once_never_lock_honest_clients_out(tmp_path):
    with fake_server(tmp_path, max_sessions=8, init_timeout_s=2.0) as srv:
        stop = time.monotonic() + HOLD_S
        opened: list = []
        attackers = [threading.Thread(target=hold_idle, args=(srv.url, stop, opened), daemon=True)
                     for _ in range(IDLE)]
        for t in attackers:
            t.start()
        time.sleep(1.5)  # every attacker socket opened, and past the grace
        outcomes, health = [], []
        while time.monotonic() < stop - 0.5:
            health.append(health_status(srv.server.port))
            try:
                with ProtocolClient.connect(srv.url, timeout=10.0, open_timeout=5.0) as c:
                    ok = c.init()["type"] == "init_ok" and c.ask(["hello", "world"])["type"] == "translation"
                    outcomes.append("served" if ok else "refused")
            except Exception as e:  # noqa: BLE001 - a refused handshake or a close: counted
                outcomes.append(type(e).__name__)
            time.sleep(0.1)
        for t in attackers:
            t.join(10)
        assert len(outcomes) >= 6 and outcomes == ["served"] * len(outcomes), outcomes
        assert health == [200] * len(health)
        assert len(opened) >= IDLE // 2  # the attack did run: its sockets were let in (and evicted)
        stats = srv.call(lambda: dict(srv.server.stats.closes))
        assert stats.get("evicted_before_init", 0) > 0
