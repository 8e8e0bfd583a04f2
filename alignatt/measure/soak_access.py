"""The soak's cases of who may connect (issues 42 and 47), each checking the server's answer.

- `cross_origin`, `null_origin`: a browser page of another origin, and a sandboxed frame
  (`Origin: null`), with the right token: refused at the handshake with 403.
- `no_token`, `wrong_token` (the token's length, other content): refused with 401.
- `idle_flood`: issue 42's lockout shape. 32 sockets that never send init, opened at once from a
  second loopback address and opened again whenever one is dropped, held `hold_s` (60 s in
  `alignatt soak`), while honest clients from 127.0.0.1 open a session and ask for a translation
  every second: every one of them must be served. The flood presents the token, so it tests the
  bounds before init, not the token.

What was not as expected is appended to `unexpected` (the soak's tally).
"""

from __future__ import annotations

import errno
import threading
import time
from typing import Callable

FLOOD_SOCKETS = 32
FLOOD_ADDRESS = "127.0.0.2"  # all of 127/8 is loopback on Linux: the flood's own peer address
HONEST_EVERY_S = 1.0
# One flood at a time: two soak clients flooding at once race for the same per-address slots, and the
# flood that came second may never get one in. The second runs only its honest clients.
_FLOOD = threading.Lock()

ACCESS_CASES = ("cross_origin", "null_origin", "no_token", "wrong_token", "idle_flood")


def _bearer(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token is not None else {}


def _refused_with(url: str, headers: dict[str, str], status: int, name: str, unexpected: list[str]) -> None:
    from websockets.exceptions import InvalidStatus
    from websockets.sync.client import connect

    try:
        ws = connect(url, open_timeout=10.0, additional_headers=headers, legacy=True)
    except InvalidStatus as e:
        if e.response.status_code != status:
            unexpected.append(f"{name}: refused with {e.response.status_code}, not {status}")
        return
    ws.close()
    unexpected.append(f"{name}: the handshake was accepted")


def _wrong(token: str) -> str:
    """Another token of the same length (the constant-time compare's case)."""
    return "".join("b" if ch == "a" else "a" for ch in token)


def _hold_idle(url: str, token: str | None, stop: float, opened: list[int]) -> None:
    """One flood socket at a time: never sends init; opened again when dropped, or after a pause
    when refused."""
    from websockets.sync.client import connect

    while time.monotonic() < stop:
        try:
            ws = connect(url, open_timeout=5.0, additional_headers=_bearer(token), legacy=True,
                         source_address=(FLOOD_ADDRESS, 0))
        except OSError as e:
            if e.errno == errno.EADDRNOTAVAIL:  # no second loopback address on this host
                opened.append(-1)
                return
            time.sleep(0.5)  # reset: wait, then try again
            continue
        except Exception:  # noqa: BLE001 - refused (503 at the handshake): wait, then try again
            time.sleep(0.5)
            continue
        opened.append(1)
        try:
            ws.recv(timeout=max(stop - time.monotonic(), 0.01))  # until the server drops it
        except Exception:  # noqa: BLE001 - closed by the server, or the hold is over
            pass
        finally:
            ws.close()


def _honest(url: str, token: str | None, unexpected: list[str]) -> None:
    from alignatt.replay.client import ProtocolClient

    try:
        with ProtocolClient.connect(url, timeout=60.0, open_timeout=10.0, token=token) as c:
            ok = c.init()
            reply = c.ask(["hello", "world"]) if ok.get("type") == "init_ok" else ok
            if reply.get("type") != "translation":
                unexpected.append(f"idle_flood: an honest client was not served: {reply}"[:200])
    except Exception as e:  # noqa: BLE001 - refused at the handshake, or closed: locked out
        unexpected.append(f"idle_flood: an honest client was locked out: {type(e).__name__}: {e}"[:200])


def _idle_flood(url: str, token: str | None, hold_s: float, unexpected: list[str]) -> None:
    if not _FLOOD.acquire(blocking=False):  # another client's flood is on: be its honest clients
        _honest_until(url, token, time.monotonic() + hold_s, unexpected)
        return
    try:
        _flood_with_honest_clients(url, token, hold_s, unexpected)
    finally:
        _FLOOD.release()


def _honest_until(url: str, token: str | None, stop: float, unexpected: list[str]) -> None:
    honest = 0
    while time.monotonic() < stop - HONEST_EVERY_S / 2 or not honest:
        _honest(url, token, unexpected)
        honest += 1
        time.sleep(HONEST_EVERY_S)


def _flood_with_honest_clients(url: str, token: str | None, hold_s: float, unexpected: list[str]) -> None:
    stop = time.monotonic() + hold_s
    opened: list[int] = []
    flood = [threading.Thread(target=_hold_idle, args=(url, token, stop, opened), name=f"soak-flood-{i}",
                              daemon=True) for i in range(FLOOD_SOCKETS)]
    for t in flood:
        t.start()
    time.sleep(min(1.5, hold_s / 2))  # the flood in place, past the server's grace
    _honest_until(url, token, stop, unexpected)
    for t in flood:
        t.join(30)
    if -1 in opened:
        unexpected.append(f"idle_flood: cannot connect from {FLOOD_ADDRESS} (not a loopback address here)")
    elif not opened:
        unexpected.append("idle_flood: no flood socket was let in")


def run_access_case(url: str, kind: str, token: str | None, hold_s: float, unexpected: list[str]) -> None:
    """One case of `ACCESS_CASES` against the server at `url` (which requires `token`)."""
    if kind == "idle_flood":
        _idle_flood(url, token, hold_s, unexpected)
        return
    if token is None and kind in ("no_token", "wrong_token"):
        unexpected.append(f"{kind}: the soak's server has no token")
        return
    cases: dict[str, Callable[[], None]] = {
        "cross_origin": lambda: _refused_with(url, {**_bearer(token), "Origin": "http://evil.example"}, 403,
                                              kind, unexpected),
        "null_origin": lambda: _refused_with(url, {**_bearer(token), "Origin": "null"}, 403, kind, unexpected),
        "no_token": lambda: _refused_with(url, {}, 401, kind, unexpected),
        "wrong_token": lambda: _refused_with(url, _bearer(_wrong(token or "")), 401, kind, unexpected),
    }
    cases[kind]()
