"""`alignatt serve` in a process of its own, started from a ServerConfig and read over HTTP: what the
failover and replicas measurements run their servers as.

With a seam factory (`module:function`, the tests' stand-ins) the process is this module's main,
which serves with it; otherwise it is `alignatt serve --config`. Each server leads a process group
of its own, so a kill takes its engine processes with it.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from alignatt.core.errors import AlignattError


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_json(port: int, path: str, timeout: float = 5.0) -> tuple[int, dict]:
    """GET http://127.0.0.1:port/path: its status and JSON body (an error status too)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def kill_group(process: subprocess.Popen) -> None:
    """SIGKILL a process's group (a server and the engine processes it started), then reap it."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    try:
        process.wait(10)
    except subprocess.TimeoutExpired:
        pass


class ServerProcess:
    """A server listening on `config["port"]` (a ServerConfig as JSON data), started and waited for."""

    def __init__(self, config: dict, workdir: Path, seam_factory: str | None, start_timeout_s: float,
                 name: str = "server", env: dict[str, str] | None = None) -> None:
        self.name, self.port = name, config["port"]
        self._again = (config, workdir, seam_factory, start_timeout_s, name, env)
        path = workdir / f"{name}.json"
        path.write_text(json.dumps(config))
        self.log = workdir / f"{name}.log"
        if seam_factory:
            command = [sys.executable, "-m", "alignatt.measure.server_process", str(path), seam_factory]
        else:
            command = [sys.executable, "-m", "alignatt.cli", "serve", "--config", str(path)]
        with self.log.open("ab") as out:  # a restarted server's log follows its predecessor's
            self.process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                            env={**os.environ, **(env or {})})
        self._deadline = time.monotonic() + start_timeout_s
        self.start_timeout_s = start_timeout_s
        self.started_s: float | None = None

    def wait_listening(self) -> "ServerProcess":
        """Until `/health` answers 200 (engines loaded); raises with the log's tail if it exits or is late."""
        began = time.monotonic()
        while True:
            if self.process.poll() is not None:
                raise AlignattError(f"{self.name} exited ({self.process.returncode}) before listening:\n{self.tail()}")
            try:
                if http_json(self.port, "/health")[0] == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > self._deadline:
                self.stop()
                raise AlignattError(f"{self.name} was not listening within {self.start_timeout_s:.0f} s:\n{self.tail()}")
            time.sleep(0.25)
        self.started_s = self.start_timeout_s - (self._deadline - time.monotonic())
        self.waited_s = time.monotonic() - began
        return self

    def again(self) -> "ServerProcess":
        """The same server started anew (same config and port): a restart, once this one has exited."""
        return ServerProcess(*self._again)

    def tail(self, chars: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-chars:]

    def engines(self) -> list[dict]:
        return http_json(self.port, "/stats")[1]["engines"]

    def kill(self) -> None:
        """SIGKILL the server and its engine processes (its process group)."""
        kill_group(self.process)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)  # drains, then stops; a second SIGTERM stops at once
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.kill()


def _serve_with_factory(config_path: str, factory: str) -> None:
    """The server process when a seam factory is given (`module:function`)."""
    import importlib
    import logging

    from alignatt.serve.config import ServerConfig
    from alignatt.serve.server import serve

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    module, _, name = factory.partition(":")
    serve(ServerConfig.model_validate_json(Path(config_path).read_text()),
          seam_factory=getattr(importlib.import_module(module), name))


if __name__ == "__main__":
    _serve_with_factory(sys.argv[1], sys.argv[2])
