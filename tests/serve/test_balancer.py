"""`alignatt deploy haproxy`: the generated configuration is one HAProxy accepts, balances by least
connections, checks /health (unless told not to), and a replica list that is not host:port is refused."""

import subprocess

import pytest
from pydantic import ValidationError

from alignatt.serve.balancer import BalancerOptions, haproxy_config
from tests.support.server_client import needs_haproxy


def _haproxy_accepts(tmp_path, text: str) -> subprocess.CompletedProcess:
    path = tmp_path / "haproxy.cfg"
    path.write_text(text)
    return subprocess.run(["haproxy", "-c", "-f", str(path)], capture_output=True, text=True)


@needs_haproxy
@pytest.mark.parametrize("health_check", [True, False])
def test_the_generated_config_is_valid_haproxy(tmp_path, health_check):
    options = BalancerOptions(replicas="replica-1:8765, replica-2:8765,10.0.0.3:8765", bind=":8765",
                              stats_bind="127.0.0.1:8404", health_check=health_check)
    text = haproxy_config(options)
    checked = _haproxy_accepts(tmp_path, text)
    assert checked.returncode == 0, checked.stderr  # names that do not resolve yet are fine (init-addr none)
    assert "balance leastconn" in text and text.count("\n    server replica") == 3
    assert ("option httpchk GET /health" in text) is health_check
    assert "retry-on conn-failure empty-response response-timeout 503" in text
    broken = _haproxy_accepts(tmp_path, text.replace("balance leastconn", "balance leastconnections"))
    assert broken.returncode != 0  # the check above can fail


def test_a_replica_that_is_not_host_port_is_refused():
    with pytest.raises(ValidationError, match="not host:port: nohost"):
        BalancerOptions(replicas="127.0.0.1:8765,nohost")
    with pytest.raises(ValidationError):
        BalancerOptions(replicas="")


def test_the_compose_file_runs_what_the_balancer_config_names():
    """deploy/compose.yaml, linted: its replicas are the generator's servers, each runs `alignatt serve`
    with options the command takes, is checked on /health and drains on SIGTERM within its grace."""
    from pathlib import Path

    import typer.main
    import yaml

    from alignatt.cli.app import app

    root = Path(__file__).resolve().parents[2]
    compose = yaml.safe_load((root / "deploy/compose.yaml").read_text())
    services = compose["services"]
    replicas = sorted(name for name in services if name.startswith("replica-"))
    assert len(replicas) == 3 and "balancer" in services
    expected = haproxy_config(BalancerOptions(replicas=[f"{r}:8765" for r in replicas], bind=":8765",
                                              stats_bind=":8404"))
    assert (root / "deploy/haproxy.cfg").read_text() == expected  # regenerate it when the generator changes
    serve = typer.main.get_command(app).commands["serve"]
    known = {opt for p in serve.params for opt in p.opts}
    for name in replicas:
        service = services[name]
        command = service["command"]
        assert command[:2] == ["alignatt", "serve"]
        assert {c for c in command[2:] if c.startswith("--")} <= known
        drain_s = float(command[command.index("--drain-s") + 1])
        assert "--token-file" in command and "token" in service["secrets"]
        assert service["stop_signal"] == "SIGTERM" and float(service["stop_grace_period"].rstrip("s")) > drain_s
        assert any("/health" in part for part in service["healthcheck"]["test"])
    balancer = services["balancer"]
    assert "./haproxy.cfg:/etc/haproxy/haproxy.cfg:ro" in balancer["volumes"]
    assert {r: {"condition": "service_healthy"} for r in replicas} == balancer["depends_on"]


@needs_haproxy
@pytest.mark.parametrize("degraded_in_rotation, expected", [(True, "UP"), (False, "DOWN")])
def test_a_degraded_replica_stays_in_rotation_only_when_told(tmp_path, degraded_in_rotation, expected):
    """A replica whose /health answers 200 `degraded`, checked by a real HAProxy on the generated config."""
    import csv
    import http.server
    import io
    import json
    import threading
    import time
    import urllib.request

    from alignatt.measure.server_process import free_port

    class Degraded(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = json.dumps({"status": "degraded", "engines_alive": 1, "engines_dead": 1}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    replica = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Degraded)
    threading.Thread(target=replica.serve_forever, daemon=True).start()
    stats = free_port()
    text = haproxy_config(BalancerOptions(replicas=[f"127.0.0.1:{replica.server_address[1]}"],
                                          bind=f"127.0.0.1:{free_port()}", stats_bind=f"127.0.0.1:{stats}",
                                          check_interval_ms=100, degraded_in_rotation=degraded_in_rotation))
    (tmp_path / "haproxy.cfg").write_text(text)
    proxy = subprocess.Popen(["haproxy", "-db", "-f", str(tmp_path / "haproxy.cfg")], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    try:
        status, deadline = None, time.monotonic() + 10
        while status != expected and time.monotonic() < deadline:
            time.sleep(0.2)
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{stats}/stats;csv", timeout=2) as r:
                    rows = csv.DictReader(io.StringIO(r.read().decode().lstrip("# ")))
                    status = next(row["status"] for row in rows if row["svname"] == "replica1")
            except OSError:
                continue
        assert status == expected
    finally:
        proxy.terminate()
        proxy.wait(10)
        replica.shutdown()
