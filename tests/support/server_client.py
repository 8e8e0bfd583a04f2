"""Helpers for server tests: a fake-engine server on loopback and the protocol client with a test's defaults."""

from __future__ import annotations

import json
import os
import shutil
import urllib.error
import urllib.request
from contextlib import contextmanager

import pytest

from websockets.sync.client import connect

from alignatt.heads.sets import HeadSet, RankedHead, write_head_set
from alignatt.replay.client import ProtocolClient
from alignatt.serve.server import ServerThread
from alignatt.serve.config import DirectionRoute, ServerConfig, ServerLimits
from tests.fakes.mt_fakes import FakeSeam


# CI installs HAProxy (.ci/run): there a missing binary is a failure, not a skip.
needs_haproxy = pytest.mark.skipif(shutil.which("haproxy") is None and not os.environ.get("CI"),
                                   reason="needs HAProxy (apt-get install haproxy)")


class FakeFactory:
    """Builds one FakeSeam per engine and remembers them (seam options apply to all)."""

    def __init__(self, **seam_options) -> None:
        self.seam_options = seam_options
        self.seams: list[FakeSeam] = []

    def __call__(self, route, heads):
        seam = FakeSeam(heads=heads, **self.seam_options)
        self.seams.append(seam)
        return seam


def head_set_file(tmp_path, direction: str, heads: list[tuple[int, int]]) -> str:
    hs = HeadSet(
        model="fake", direction=direction, num_layers=8, num_heads=8, used_pairs=0,
        used_target_tokens=0, score_name="test",
        heads=[RankedHead(layer=l, head=h, score=0.9 - 0.1 * i) for i, (l, h) in enumerate(heads)],
    )
    return str(write_head_set(tmp_path / f"{direction}.json", hs))


def fake_config(tmp_path, directions=("en-de",), **limits) -> ServerConfig:
    routes = {}
    for i, d in enumerate(directions):
        path = head_set_file(tmp_path, d, [(i, 0), (i, 1), (i + 1, 2), (i + 2, 3)])
        routes[d] = DirectionRoute(model="fake", seam="fake", heads=path, top_k=2)
    return ServerConfig(port=0, directions=routes, limits=ServerLimits(**limits))


@contextmanager
def fake_server(tmp_path, directions=("en-de",), seam_options=None, **limits):
    factory = FakeFactory(**(seam_options or {}))
    with ServerThread(fake_config(tmp_path, directions, **limits), factory) as handle:
        handle.factory = factory
        yield handle


class Client(ProtocolClient):
    """The protocol-v1 client with a test's defaults: a short reply timeout, frames sent unchecked
    (tests send what the server must refuse), and every update stamped `clock_ms: 0`."""

    def __init__(self, url: str, timeout: float = 10.0) -> None:
        super().__init__(connect(url, open_timeout=5.0, legacy=True), timeout, check=False)

    def update(self, words, tail=None, final=False, utterance_id=0, seq=None, clock_ms=0.0, **extra) -> int:
        return super().update(words, tail or (), final, utterance_id, seq, clock_ms, **extra)


class StalledClient:
    """Completes the handshake, sends frames, and never reads again (a tiny receive buffer), so the
    server's writes to it block: a client that stopped reading."""

    def __init__(self, url: str) -> None:
        import socket

        from websockets.client import ClientProtocol
        from websockets.uri import parse_uri

        uri = parse_uri(url)
        self.protocol = ClientProtocol(uri)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        self.sock.settimeout(10.0)
        self.sock.connect((uri.host, uri.port))
        self.protocol.send_request(self.protocol.connect())
        self._flush()
        while self.protocol.handshake_exc is None and self.protocol.state.name == "CONNECTING":
            self.protocol.receive_data(self.sock.recv(4096))
        if self.protocol.handshake_exc is not None:
            raise self.protocol.handshake_exc

    def _flush(self) -> None:
        for data in self.protocol.data_to_send():
            if data:
                self.sock.sendall(data)

    def send(self, frame: dict) -> bool:
        """False once the server has cut the connection."""
        try:
            self.protocol.send_text(json.dumps(frame).encode())
            self._flush()
            return True
        except OSError:
            return False

    def close(self) -> None:
        self.sock.close()


def http_get(srv, path: str) -> tuple[int, dict]:
    """The status and JSON body of GET `path` on the server's HTTP side (an error status too)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{srv.server.port}{path}", timeout=5) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def health(srv) -> tuple[int, dict]:
    return http_get(srv, "/health")
