"""`alignatt replicas` on CPU with stand-in engines: three `alignatt serve` replicas behind HAProxy,
twelve real-time speakers through it, one replica SIGKILLed and one drained (SIGTERM) mid-stream.
Every speaker finishes, nothing committed is lost, every told session answers again within the
bound, and the balancer takes both replicas out of rotation. Without the health check the same run
fails: the balancer keeps sending sessions to a replica that is draining."""

from alignatt.measure.replicas import ReplicasOptions, run_replicas
from alignatt.record.artifacts import load_artifact
from alignatt.report.measurements import replicas_item
from tests.support.server_client import head_set_file, needs_haproxy


def _options(tmp_path, **overrides) -> ReplicasOptions:
    return ReplicasOptions(**{
        "model": "fake", "seam": "fake", "heads": head_set_file(tmp_path, "en-de", [(0, 0), (0, 1)]), "top_k": 2,
        "replicas": 3, "speakers": 12, "streams": ["smoke"], "speed": 2.0, "stagger_s": 0.05,
        "faults": "kill@4,drain@8", "drain_s": 3.0, "rtt_probes": 50, "start_timeout_s": 120,
        "seam_factory": "tests.fakes.replica_fakes:recording_factory", "seam_options": {"delay_s": 0.01},
        **overrides})


@needs_haproxy
def test_a_kill_and_a_drain_behind_the_balancer_lose_nothing(tmp_path):
    artifact = run_replicas(_options(tmp_path), tmp_path / "replicas.json")
    assert [(f["action"], f["exit_code"]) for f in artifact.faults] == [("kill", -9), ("drain", 0)]
    assert all(c.passed for c in artifact.checks), [(c.name, c.detail) for c in artifact.checks]
    told = sum(f["sessions"] for f in artifact.faults)
    assert told >= 2 and len(artifact.reopen_s) >= told and len(artifact.answered_again_s) >= told
    assert max(artifact.answered_again_s) <= artifact.bounds_s["reconnect"]  # no queue behind stand-in engines
    assert sum(s.finals_delivered for s in artifact.sessions) == sum(s.utterances for s in artifact.sessions) > 0
    survivor = [r for r in artifact.replicas if r["fate"] == "served to the end"]
    assert len(survivor) == 1 and survivor[0]["sessions_opened"] >= 4 + told  # the moved sessions landed there
    assert artifact.rtt.ping_balanced_ms_p50 > 0 and artifact.rtt.open_balanced_ms_p50 > 0
    assert "balance leastconn" in artifact.balancer["config"] and "httpchk GET /health" in artifact.balancer["config"]
    assert load_artifact(tmp_path / "replicas.json").kind == "replicas"
    item = replicas_item("outputs/cpu/replicas.json", artifact, "cpu")
    assert "kill replica" in item["description"] and "drain replica" in item["description"]
    assert [c[0] for c in item["checks"]] == ["✓"] * 5


@needs_haproxy
def test_without_the_health_check_the_same_run_fails(tmp_path):
    artifact = run_replicas(_options(tmp_path, health_check=False, rtt_probes=10), tmp_path / "replicas.json")
    assert "httpchk" not in artifact.balancer["config"]
    failed = {c.name for c in artifact.checks if not c.passed}
    assert "the balancer takes each faulted replica out of rotation" in failed and not artifact.passed


@needs_haproxy
def test_a_rolling_restart_of_every_replica_loses_nothing(tmp_path):
    artifact = run_replicas(_options(tmp_path, faults="restart@2,restart@8,restart@14", speed=1.0, rtt_probes=10),
                            tmp_path / "replicas.json")
    assert sorted(f["replica"] for f in artifact.faults) == ["replica1", "replica2", "replica3"]
    assert all(f["exit_code"] == 0 and f["back_after_s"] > f["exited_after_s"] for f in artifact.faults)
    assert all(c.passed for c in artifact.checks), [(c.name, c.detail) for c in artifact.checks]
    assert {r["fate"] for r in artifact.replicas} == {"restarted"}
    assert sum(s.finals_delivered for s in artifact.sessions) == sum(s.utterances for s in artifact.sessions) > 0
