"""Who may connect: Origin, token, TLS, and idle connections that must not lock honest clients out.

Every refusal is at the WebSocket handshake, before the connection handler runs: no session slot
and no place among the connections waiting for init. Loopback only; bounded loops.
"""

import datetime
import importlib
import ipaddress
import json
import logging
import os
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from alignatt.replay.client import ProtocolClient
from alignatt.serve.host import WaitingPeers
from alignatt.serve.server import ServerThread
from tests.support.server_client import FakeFactory, fake_config

TOKEN = "s3cret-token-4f9a2c71e0b5"
SAME_LENGTH = "x" * len(TOKEN)
ATTACKER = "127.0.0.2"  # all of 127/8 is loopback on Linux: a second peer address


def server(tmp_path, token: str | None = None, **fields):
    limits = {k: fields.pop(k) for k in list(fields) if k.startswith(("max_", "init_"))}
    cfg = fake_config(tmp_path, **limits)
    if token is not None:
        path = tmp_path / "token"
        path.write_text(token + "\n")
        fields["token_file"] = str(path)
    return ServerThread(cfg.model_copy(update=fields), FakeFactory())


def counts(srv) -> tuple[int, int, int]:
    """Connections that reached the handler, sessions held, connections waiting for init."""
    stats = srv.server.stats
    return srv.call(lambda: (stats.connections, stats.sessions_active, stats.connections_before_init))


def refused_status(url: str, **options) -> int:
    with pytest.raises(InvalidStatus) as refused:
        connect(url, open_timeout=5.0, legacy=True, **options)
    return refused.value.response.status_code


def init_ok(url: str, **options) -> dict:
    with ProtocolClient.connect(url, timeout=10.0, open_timeout=5.0, **options) as c:
        return c.init()


def get(url: str, headers=None) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=5) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


# ---- origins ----


@pytest.mark.parametrize("origin", ["http://evil.example", "null"])
def test_a_browser_origin_is_refused_at_the_handshake(tmp_path, caplog, origin):
    caplog.set_level(logging.INFO)
    with server(tmp_path) as srv:
        for _ in range(3):
            assert refused_status(srv.url, origin=origin) == 403
        assert counts(srv) == (0, 0, 0)
        assert srv.call(lambda: srv.server.stats.closes["origin_refused"]) == 3
        assert init_ok(srv.url)["type"] == "init_ok"  # no Origin header: WhisperLiveKit, the project's client
    refusals = [r for r in caplog.records if "refused" in r.getMessage() and "Origin" in r.getMessage()]
    assert len(refusals) == 1  # once per peer address, not once per attempt


def test_an_allowed_origin_is_served(tmp_path):
    with server(tmp_path, allow_origins=["https://captions.example"]) as srv:
        assert init_ok(srv.url, origin="https://captions.example")["type"] == "init_ok"
        assert refused_status(srv.url, origin="https://other.example") == 403


# ---- token ----


@pytest.mark.parametrize("presented", [None, "wrong", SAME_LENGTH, TOKEN[:-1] + "X"])
def test_no_or_a_wrong_token_is_refused_before_a_session_slot(tmp_path, presented):
    with server(tmp_path, token=TOKEN, max_sessions=1) as srv:
        headers = {"Authorization": f"Bearer {presented}"} if presented else None
        assert refused_status(srv.url, additional_headers=headers) == 401
        if presented:
            assert refused_status(f"{srv.url}/?token={presented}") == 401
        assert counts(srv) == (0, 0, 0)
        assert init_ok(srv.url, token=TOKEN)["type"] == "init_ok"  # the one slot was never taken


def test_the_right_token_in_a_header_or_the_url_is_served_and_never_logged(tmp_path, caplog):
    caplog.set_level(logging.DEBUG)
    with server(tmp_path, token=TOKEN) as srv:
        assert init_ok(srv.url, token=TOKEN)["type"] == "init_ok"
        assert init_ok(f"{srv.url}/?token={TOKEN}")["type"] == "init_ok"  # WhisperLiveKit's --alignatt-url
        refused_status(f"{srv.url}/?token={SAME_LENGTH}")
        refused_status(srv.url, additional_headers={"Authorization": f"Bearer {TOKEN}x"}, origin="http://a.example")
        assert refused_status(srv.url, additional_headers={"Authorization": f"Bearer {TOKEN}"},
                              origin="http://evil.example") == 403  # a token does not let a page in
    server_side = [r for r in caplog.records if not r.name.startswith("websockets.client")]  # the test's client
    logged = "".join(f"{r.getMessage()} {r.args}" for r in server_side)
    assert "refused" in logged  # the refusals were logged...
    assert TOKEN not in logged and SAME_LENGTH not in logged  # ...without the token they carried


def test_health_stays_open_and_stats_needs_the_token(tmp_path):
    with server(tmp_path, token=TOKEN) as srv:
        base = f"http://127.0.0.1:{srv.server.port}"
        status, body = get(f"{base}/health")
        assert status == 200 and json.loads(body)["status"] == "ok"
        assert TOKEN not in body.decode()
        assert get(f"{base}/stats")[0] == 401
        assert get(f"{base}/stats", {"Authorization": f"Bearer {TOKEN}"})[0] == 200


def test_the_token_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("ALIGNATT_TOKEN", TOKEN)
    with server(tmp_path) as srv:  # a server a measurement starts reads no variable
        assert init_ok(srv.url)["type"] == "init_ok"
    with server(tmp_path, token_env="ALIGNATT_TOKEN") as srv:  # `alignatt serve`'s
        assert refused_status(srv.url) == 401
        assert init_ok(srv.url, token=TOKEN)["type"] == "init_ok"


def test_serve_beyond_loopback_without_a_token_exits_2_with_one_line(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "ALIGNATT_TOKEN"}
    run = subprocess.run([sys.executable, "-m", "alignatt", "serve", "--host", "0.0.0.0", "--port", "0"],
                         capture_output=True, text=True, timeout=60, env=env)
    assert run.returncode == 2
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "token" in lines[0] and "--insecure-no-token" in lines[0]
    assert "loading" not in run.stdout  # refused before any model is loaded


# ---- TLS ----


def self_signed(tmp_path) -> tuple[str, str]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "alignatt-test")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=1))
            .not_valid_after(now + datetime.timedelta(hours=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return str(cert_path), str(key_path)


def test_tls_sends_no_session_tickets(tmp_path):
    """A TLS 1.3 ticket arrives after the handshake, while websockets' sync client (the replay
    client's) writes its opening request on one thread and reads on another: about one TLS
    connection in a hundred then hung until its open timeout. The server sends none."""
    import socket

    cert, key = self_signed(tmp_path)
    with server(tmp_path, ssl_certfile=cert, ssl_keyfile=key) as srv:
        trusting = ssl.create_default_context(cafile=cert)
        with trusting.wrap_socket(socket.create_connection(("127.0.0.1", srv.server.port), timeout=5),
                                  server_hostname="127.0.0.1") as tls:
            tls.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            assert tls.recv(64).startswith(b"HTTP/1.1 ")  # a ticket would have come before the reply
            assert tls.version() == "TLSv1.3" and not tls.session.has_ticket


def test_tls_with_the_token_gets_init_ok_from_a_verifying_client(tmp_path):
    cert, key = self_signed(tmp_path)
    with server(tmp_path, token=TOKEN, ssl_certfile=cert, ssl_keyfile=key) as srv:
        assert srv.url.startswith("wss://")
        trusting = ssl.create_default_context(cafile=cert)  # verifies the chain and the address
        assert init_ok(srv.url, token=TOKEN, ssl=trusting)["type"] == "init_ok"
        assert init_ok(f"{srv.url}/?token={TOKEN}", ssl=trusting)["type"] == "init_ok"
        assert refused_status(srv.url, ssl=trusting) == 401
        with pytest.raises(ssl.SSLCertVerificationError):  # a client that does not trust it refuses it
            connect(srv.url, open_timeout=5.0, legacy=True, ssl=ssl.create_default_context())


# ---- idle connections (issue 42) ----


def open_idle(srv, address: str, attempts: int) -> tuple[list, int]:
    """`attempts` sockets from `address` that never send init, each opened once the previous one
    reached the handler and is past the grace; the ones accepted, and how many were refused (503)."""
    idle, refused = [], 0
    for _ in range(attempts):
        handled = counts(srv)[0]
        try:
            idle.append(connect(srv.url, open_timeout=5.0, legacy=True, source_address=(address, 0)))
        except InvalidStatus as e:
            assert e.response.status_code == 503
            refused += 1
            continue
        deadline = time.monotonic() + 5
        while counts(srv)[0] == handled and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(WaitingPeers.GRACE_S * 2)
    return idle, refused


def test_idle_connections_do_not_lock_honest_clients_out(tmp_path, monkeypatch):
    monkeypatch.setattr(WaitingPeers, "GRACE_S", 0.05)
    with server(tmp_path, max_sessions=8, max_connections_before_init=12,
                max_connections_before_init_per_peer=3, init_timeout_s=30.0) as srv:
        idle, refused = open_idle(srv, ATTACKER, 10)  # an attacker keeps opening sockets, never sends init
        try:
            # past its bound each new socket closes the attacker's longest-waiting one: it holds 3
            assert refused == 0 and srv.call(lambda: srv.server.stats.closes["evicted_before_init"]) == 7
            assert srv.call(lambda: srv.server.stats.sessions_active) == 0  # idle sockets hold no session
            status, body = get(f"http://127.0.0.1:{srv.server.port}/health")
            assert status == 200 and json.loads(body)["connections_before_init"] == 3
            served, errors = [], []

            def honest(address):
                try:
                    with ProtocolClient.connect(srv.url, timeout=10.0, open_timeout=5.0,
                                                source_address=(address, 0)) as c:
                        assert c.init()["type"] == "init_ok"
                        served.append(c.ask(["hello", "world"])["type"])
                except Exception as e:  # reported below
                    errors.append(repr(e))

            # bursts of honest clients up to the bound, from another address and from the attacker's
            # own (its idle sockets make room): none is refused
            for address in ("127.0.0.1", ATTACKER):
                threads = [threading.Thread(target=honest, args=(address,)) for _ in range(3)]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join(30)
            assert not errors and served == ["translation"] * 6
        finally:
            for ws in idle:
                ws.close()


def test_health_says_busy_when_a_new_connection_would_be_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(WaitingPeers, "GRACE_S", 30.0)  # none waits past it: none can make room
    with server(tmp_path, max_connections_before_init=2, max_connections_before_init_per_peer=1,
                init_timeout_s=30.0) as srv:
        base = f"http://127.0.0.1:{srv.server.port}/health"
        idle = [connect(srv.url, open_timeout=5.0, legacy=True, source_address=(f"127.0.0.{i}", 0)) for i in (2, 3)]
        try:
            deadline = time.monotonic() + 5
            while counts(srv)[2] < 2 and time.monotonic() < deadline:
                time.sleep(0.01)
            status, body = get(base)
            assert status == 503 and json.loads(body)["status"] == "busy"
            assert refused_status(srv.url, source_address=("127.0.0.4", 0)) == 503  # as it says
        finally:
            for ws in idle:
                ws.close()
        deadline = time.monotonic() + 5
        while counts(srv)[2] and time.monotonic() < deadline:
            time.sleep(0.02)
        assert get(base)[0] == 200



@pytest.mark.filterwarnings("ignore:connect\\(\\) must be used:DeprecationWarning")  # the WLK client's call
def test_the_unmodified_whisperlivekit_client_with_a_token_url_over_tls(tmp_path, monkeypatch):
    try:
        from alignatt.replay.wlk_client import load_wlk_client

        wlk = load_wlk_client()
        timed = importlib.import_module("whisperlivekit.timed_objects")
    except Exception as e:  # not installed here
        pytest.skip(f"WhisperLiveKit client not importable ({e})")
    cert, key = self_signed(tmp_path)
    monkeypatch.setenv("SSL_CERT_FILE", cert)  # the client's default context trusts the test's certificate
    words = "the causal encoder processes each block once.".split()
    with server(tmp_path, token=TOKEN, ssl_certfile=cert, ssl_keyfile=key) as srv:
        for url, served in ((f"{srv.url}/?token={TOKEN}", True), (f"{srv.url}/?token={SAME_LENGTH}", False)):
            engine = wlk.AlignAttRemoteEngine(url=url, source_language="en", preset=None, latency="balanced")
            client = engine.new_session("de")
            client.insert_tokens([timed.ASRToken(start=0.4 * i, end=0.4 * i + 0.4, text=" " + w)
                                  for i, w in enumerate(words)])
            seg, _ = client.process()
            assert (seg is not None and seg.text.endswith("once.")) is served
            assert (client._ws is not None) is served
        assert srv.call(lambda: srv.server.stats.sessions_opened) == 1
