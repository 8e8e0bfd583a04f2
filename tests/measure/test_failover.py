"""`alignatt failover` on CPU with stand-in engines (tests.fakes.replica_fakes) in a server process of its
own: three engines, one SIGKILLed and one SIGSTOPped while four real-time speakers stream. Nothing
committed is lost, every session of a faulted engine is told within the bound and resumes on the
survivor, /health tells the truth, and the artifact round-trips through the shared schema."""

from alignatt.record.artifacts import load_artifact
from alignatt.measure.failover import FailoverOptions, run_failover
from alignatt.report.measurements import failover_item
from tests.support.server_client import head_set_file


def test_a_kill_and_a_stop_under_load_lose_nothing_and_every_session_is_told(tmp_path):
    options = FailoverOptions(
        model="fake", seam="fake", heads=head_set_file(tmp_path, "en-de", [(0, 0), (0, 1)]), top_k=2,
        engines=3, speakers=4, streams=["smoke"], speed=3.0, stagger_s=0.05, faults="kill@2.5,stop@5",
        step_deadline_s=1.0, heartbeat_s=0.2, start_timeout_s=120,
        seam_factory="tests.fakes.replica_fakes:recording_factory", seam_options={"delay_s": 0.01})
    artifact = run_failover(options, tmp_path / "failover.json")
    assert [f["action"] for f in artifact.faults] == ["kill", "stop"]
    told = [s for s in artifact.sessions if s.losses]
    assert len(told) >= 2 and all(s.connections >= 2 for s in told)
    assert all(c.passed for c in artifact.checks), [(c.name, c.detail) for c in artifact.checks]
    assert {e["state"] for e in artifact.engines} == {"dead", "hung", "live"}
    statuses = [h["status"] for h in artifact.health]
    assert statuses[0] == "ok" and statuses[-1] == "degraded"
    assert load_artifact(tmp_path / "failover.json").kind == "failover"
    item = failover_item("outputs/failover.json", artifact, "cpu")  # what the page shows of it
    assert "kill engine" in item["description"] and "stop engine" in item["description"]
    assert "targets met" in item["description"] and any(r.startswith("/health = ok -> degraded") for r in item["results"])
    assert [c[0] for c in item["checks"]] == ["✓"] * 4

