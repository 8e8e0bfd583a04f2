"""The load benchmark's client processes: every speaker runs once, in its own process group, and
a speaker that fails comes back as an error record, not a lost level."""

from alignatt.replay.speakers import SpeakerPlan, process_groups, run_speakers
from alignatt.measure.capacity import resolve_streams


def test_process_groups_deal_every_speaker_once_and_spread_the_stagger():
    groups = process_groups(37, 16)
    assert len(groups) == 3
    assert sorted(i for g in groups for i in g) == list(range(37))
    assert groups[0][:3] == [0, 3, 6]  # round-robin: a process's speakers are not one burst
    assert process_groups(1, 16) == [[0]]


def test_speakers_in_client_processes_report_each_failure_in_speaker_order():
    streams = resolve_streams(["smoke"])
    # Nothing listens there: each speaker's connect fails inside its client process.
    plan = SpeakerPlan("ws://127.0.0.1:9", "balanced", 50.0, 0.0, "lockstep",
                       tuple(s.model_dump() for _, s in streams))
    runs, wall = run_speakers(plan, 3, "processes", per_process=2)
    assert len(runs) == 3 and all(isinstance(r, BaseException) for r in runs)
    assert all("did not run" not in str(r) for r in runs)  # each one ran and failed on its own
    assert wall >= 0


def test_the_speakers_of_a_level_run_outside_the_calling_process(monkeypatch):
    from alignatt.replay import speakers as load_clients
    from alignatt.serve.config import DirectionRoute, ServerConfig, ServerLimits
    from alignatt.serve.server import ServerThread
    from tests.fakes.mt_fakes import FakeSeam

    def in_this_process(*args, **kwargs):
        raise AssertionError("speakers ran in the server's process")

    # A spawned client process imports its own copy: the patch reaches only this process.
    monkeypatch.setattr(load_clients, "run_speaker_threads", in_this_process)
    route = DirectionRoute(model="gemma3-270m", seam="hf_qk_fast", top_k=1, device="cpu")
    config = ServerConfig(host="127.0.0.1", port=0, directions={"en-de": route}, limits=ServerLimits(max_sessions=2))
    streams = resolve_streams(["smoke"])
    with ServerThread(config, lambda r, h: FakeSeam(heads=h)) as handle:
        plan = SpeakerPlan(handle.url, "balanced", 200.0, 0.0, "lockstep", tuple(s.model_dump() for _, s in streams))
        runs, _ = run_speakers(plan, 2, "processes", per_process=1)
    assert all(not isinstance(r, BaseException) for r in runs), runs
    assert all(any(e.final for e in r.events) for r in runs)
