"""`alignatt soak` on the fake engine: a short run, every target recorded, the artifact valid."""

from alignatt.record.artifacts import SoakArtifact, load_artifact
from alignatt.measure.soak import HOSTILE_CASES, SoakOptions, run_soak
from tests.support.server_client import FakeFactory, head_set_file


def test_a_short_soak_on_the_fake_engine_meets_its_targets(tmp_path):
    out = tmp_path / "soak.json"
    heads = head_set_file(tmp_path, "en-de", [(0, 0), (0, 1), (1, 2), (2, 3)])
    options = SoakOptions(model="fake", seam="fake", heads=heads, minutes=0.25, clients=3, sample_s=1.0, settle_s=1.0,
                          reply_timeout_s=20.0, init_timeout_s=0.5, idle_hold_s=5.0)
    artifact = run_soak(options, out, seam_factory=FakeFactory(delay_s=0.005))
    assert isinstance(load_artifact(out), SoakArtifact)
    assert artifact.load_s >= 15 and len(artifact.samples) >= 10
    assert artifact.sessions.get("well_formed", 0) > 5 and sum(artifact.sessions.values()) > 30
    assert set(artifact.sessions) - {"well_formed"} <= set(HOSTILE_CASES)
    assert artifact.finals > 5 and artifact.updates > 100
    by_name = {c.name: c for c in artifact.checks}
    for name in ("zero_retractions", "zero_silent_sessions", "zero_dropped_finals", "hostile_cases_as_expected",
                 "file_descriptors_back"):
        assert by_name[name].passed, (name, by_name[name].detail, artifact.hostile_unexpected)
    assert artifact.server["sessions_active"] == 0
    # every idle socket closed: idle_no_init's, and the flood's (timed out, or evicted to make room)
    assert artifact.server["closes"].get("init_timeout", 0) >= artifact.sessions["idle_no_init"]  # warm-up included
    for kind in ("idle_flood", "cross_origin", "null_origin", "no_token", "wrong_token"):
        assert artifact.sessions.get(kind, 0) >= 1  # in the warm-up at least
    assert "rss_back_within_5pct" in by_name  # recorded (the test process's RSS is not the target here)


def test_the_soak_is_shown_on_the_benchmarks_page(tmp_path):
    from alignatt.report.measurements import soak_item

    heads = head_set_file(tmp_path, "en-de", [(0, 0), (0, 1), (1, 2), (2, 3)])
    options = SoakOptions(model="fake", seam="fake", heads=heads, minutes=0.05, clients=1, sample_s=1.0,
                          settle_s=0.0, init_timeout_s=0.5, idle_hold_s=1.0)
    artifact = run_soak(options, None, seam_factory=FakeFactory())
    item = soak_item("outputs/cpu/soak.json", artifact, "cpu")
    assert item["name"] == "server_soak" and len(item["checks"]) == len(artifact.checks)
    assert any(line.startswith("rss_mb = ") for line in item["results"])
