"""`alignatt load` on CPU: load levels through the real server with stand-in seams (fast), the
level summary's judgements (lag growth, finals order, errors), and a 4-speaker loopback run on the
embedded model with 0 retractions (slow)."""

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from alignatt.core.errors import AlignattError
from alignatt.core.prompt import ContextConfig
from alignatt.measure.capacity import LoadOptions, resolve_streams, run_load
from alignatt.measure.capacity_levels import summarise_level
from alignatt.measure.load_configurations import LoadConfiguration
from alignatt.record.events import ReplayEvent
from alignatt.replay.events import RunRecord
from alignatt.replay.stream import SmokeStream
from tests.fakes.batch_fakes import StandInBatchSeam
from tests.fakes.mt_fakes import FakeSeam

SHORT = {"description": "two short sentences", "words_per_second": 6.0, "commit_lag_seconds": 0.5,
         "replay_speed": 1.0, "text": "The tram leaves at noon. Please buy a ticket first."}


@pytest.fixture
def short_stream(tmp_path):
    path = tmp_path / "short.json"
    path.write_text(json.dumps(SHORT))
    return str(path)


def render_site(site):
    """Render the Benchmarks page of a site folder holding load artifacts under outputs/ (the
    project's template and params copied in): its text and figures."""
    import shutil
    from pathlib import Path

    from alignatt.report.page import render_all

    root = Path(__file__).resolve().parents[2]
    (site / "reports").mkdir(parents=True, exist_ok=True)
    (site / "outputs" / "published").mkdir(parents=True, exist_ok=True)
    shutil.copy(root / "reports" / "BENCHMARKS.md.j2", site / "reports")
    shutil.copy(root / "params.yaml", site / "params.yaml")
    return render_all(site)


def capacity_table(text: str) -> list[str]:
    """The rows of the page's capacity table (one per load level)."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| Date | Machine | Configuration | Stream"))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("| "):
            break
        rows.append(line)
    return rows


def test_load_levels_through_the_server_with_a_batching_seam(tmp_path, short_stream):
    from alignatt.record.artifacts import LoadArtifact, load_artifact

    seam = StandInBatchSeam(max_batch=8, steps_for=lambda r: 2, step_s=0.002)
    options = LoadOptions(model="gemma3-270m", speakers="1,3", streams=[short_stream], speed=2.0, stagger_s=0.01,
                          capture_cost="off")
    out, metrics, plot = tmp_path / "load.json", tmp_path / "m.json", tmp_path / "p.csv"
    artifact = run_load(options, out, metrics, plot, seam_factory=lambda route, heads: seam)
    assert isinstance(load_artifact(out), LoadArtifact)
    one, three = artifact.levels
    assert (one.speakers, three.speakers) == (1, 3)
    for lv in artifact.levels:
        assert lv.retractions == 0 and lv.error_frames == 0
        assert lv.finals_expected == 2 * lv.speakers and lv.finals_delivered == lv.finals_expected
        assert lv.finals_in_order
        assert lv.partial_rtt_ms_p50 is not None and lv.partial_rtt_ms_p99 >= lv.partial_rtt_ms_p50
        assert lv.engine_steps > 0 and sum(lv.engine_batch_sizes.values()) == lv.engine_steps
        assert lv.peak_gpu_memory_mib is None and lv.gpu_busy_share is None  # no GPU here: nothing sampled
        (engine,) = lv.engines  # the stand-in's step sleeps 2 ms: wall, not CPU
        assert engine.step_ms_mean >= 2.0 and engine.step_cpu_ms_mean < engine.step_ms_mean
        # a draft takes 2 steps of at least 2 ms in the engine; the server holds it longer than that
        assert engine.draft_in_engine_ms_mean >= 4.0 and engine.draft_queued_ms_mean >= 0
        assert lv.partial_server_ms_p50 >= 4.0 and lv.partial_server_ms_p95 <= lv.partial_rtt_ms_p95
    assert one.texts_differing_from_alone is None  # nothing to compare the alone run with
    assert three.texts_differing_from_alone == 0 and three.decisions_differing_from_alone == 0  # deterministic seam
    assert artifact.capture_cost == [] and "not measured" in artifact.capture_cost_note
    m = json.loads(metrics.read_text())
    assert m["speakers_3"]["retractions"] == 0
    rows = plot.read_text().splitlines()
    assert rows[0].startswith("speakers,") and len(rows) == 3


def test_a_one_at_a_time_seam_reports_batches_of_one(tmp_path, short_stream):
    options = LoadOptions(speakers=[2], streams=[short_stream], speed=3.0, stagger_s=0.0, capture_cost="off")
    artifact = run_load(options, None, seam_factory=lambda route, heads: FakeSeam(heads=heads, delay_s=0.002))
    (lv,) = artifact.levels
    assert set(lv.engine_batch_sizes) == {"1"} and lv.retractions == 0 and lv.finals_in_order


def test_a_load_run_on_two_engine_processes_records_each_engine(tmp_path, short_stream):
    from alignatt.record.artifacts import load_artifact
    from tests.fakes.replica_fakes import recording_factory

    options = LoadOptions(speakers=[2], streams=[short_stream], speed=3.0, stagger_s=0.0, capture_cost="off",
                          clients="threads", engines=2)
    artifact = run_load(options, tmp_path / "load.json", seam_factory=recording_factory)
    (lv,) = load_artifact(tmp_path / "load.json").levels
    assert lv.retractions == 0 and lv.finals_in_order and lv.error_frames == 0
    assert [e.engine for e in lv.engines] == ["0", "1"]
    assert all(e.sessions == 1 and e.steps > 0 and e.alive and e.failed == 0 for e in lv.engines)  # one speaker each
    assert lv.engine_steps == sum(e.steps for e in lv.engines) == sum(lv.engine_batch_sizes.values())
    engines = artifact.config.per_engine
    assert len({e["pid"] for e in engines}) == 2 and artifact.config.scheduler["engine"] == "0"


def _events(lags, finals=(0, 1), error=False):
    events = [{"seq": i + 1, "lag_s": lag, "path": "draft", "rtt_ms": 10.0 + i, "committed_text": "",
               "utterance_id": 0} for i, lag in enumerate(lags)]
    for k, uid in enumerate(finals):
        events.append({"seq": len(events) + 1, "lag_s": lags[-1], "final": True, "path": "final", "rtt_ms": 50.0,
                       "utterance_id": uid, "committed_text": f"text {k}"})
    if error:
        events.append({"seq": len(events) + 1, "lag_s": 0.0, "error": "processing_failed", "rtt_ms": 1.0})
    return [ReplayEvent(**e) for e in events]


def test_the_level_summary_judges_lag_growth_finals_order_and_errors():
    stream = SmokeStream(words_per_second=2.0, commit_lag_seconds=1.0, text="One two. Three four.")
    streams = [("s", stream)]
    steady = RunRecord("native", _events([0.1] * 9), 1.0, 0.1)
    growing = RunRecord("native", _events([0.0, 0.0, 0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0]), 1.0, 3.0)
    swapped = RunRecord("native", _events([0.1] * 9, finals=(1, 0)), 1.0, 0.1)
    failed = RuntimeError("connection refused")
    args = (1.0, [{"steps": 0, "batch_sizes": {}}], [{"engine": "0", "steps": 4, "batch_sizes": {"1": 1, "2": 3}}],
            {"coalesced": 2}, (None, None), {})
    ok = summarise_level(1, [steady], streams, *args)
    assert not ok["lag_grows"] and ok["finals_in_order"] and ok["finals_delivered"] == 2 and ok["error_frames"] == 0
    assert ok["engine_batch_sizes"] == {"1": 1, "2": 3} and ok["superseded"] == 2
    assert summarise_level(1, [growing], streams, *args)["lag_grows"]
    assert not summarise_level(1, [swapped], streams, *args)["finals_in_order"]
    bad = summarise_level(2, [steady, failed], streams, *args)
    assert bad["error_frames"] == 1 and not bad["finals_in_order"] and bad["finals_expected"] == 4
    err = summarise_level(1, [RunRecord("native", _events([0.1] * 3, error=True), 1.0, 0.1)], streams, *args)
    assert err["error_frames"] == 1


def test_alone_comparison_counts_updates_that_differ():
    stream = SmokeStream(words_per_second=2.0, commit_lag_seconds=1.0, text="One two. Three four.")
    base = _events([0.1] * 3)
    changed = list(base)
    changed[1] = changed[1].model_copy(update={"committed_text": "different"})
    from alignatt.measure.capacity_levels import signature

    level = summarise_level(2, [RunRecord("native", base, 1, 0), RunRecord("native", changed, 1, 0)], [("s", stream)],
                            1.0, [], [], {}, (None, None), {"s": signature(base)})
    assert level["texts_differing_from_alone"] == 1 and level["decisions_differing_from_alone"] == 0


def test_bundled_streams_and_bad_options():
    names = dict(resolve_streams(["smoke", "long"]))
    assert len(names["long"].words) / names["long"].words_per_second > 120  # multi-minute
    with pytest.raises(AlignattError, match="cannot read stream"):
        resolve_streams(["/nonexistent/stream.json"])
    from pydantic import ValidationError

    with pytest.raises(ValidationError):
        LoadOptions(speakers="1,x")
    with pytest.raises(ValidationError):
        LoadOptions(speakers="0")


def test_the_cli_refuses_bad_speaker_lists_with_one_line(tmp_path):
    from typer.testing import CliRunner

    from alignatt.cli import app

    result = CliRunner().invoke(app, ["load", "--speakers", "1,two", "--out", str(tmp_path / "x.json")])
    assert result.exit_code == 2 and "speakers" in result.output
    assert not (tmp_path / "x.json").exists()


@pytest.mark.slow
def test_four_speakers_on_the_embedded_model_with_no_retractions(tmp_path):
    # One short sentence each: on a loaded 2-core runner a draft of the embedded model takes
    # seconds, and the replays are lockstep (every update waits for its reply).
    path = tmp_path / "one.json"
    path.write_text(json.dumps({**SHORT, "text": "The tram leaves at noon."}))
    options = LoadOptions(speakers=[4], streams=[str(path)], speed=1.0, stagger_s=0.14, capture_cost="off")
    artifact = run_load(options, tmp_path / "load.json")
    (lv,) = artifact.levels
    assert lv.retractions == 0 and lv.error_frames == 0
    assert lv.finals_delivered == lv.finals_expected == 4 and lv.finals_in_order
    assert lv.partial_drafts > 0


def test_the_report_shows_a_capacity_table_and_the_rtt_figure(tmp_path, short_stream):
    site = tmp_path / "site"
    seam = StandInBatchSeam(max_batch=8, steps_for=lambda r: 2, step_s=0.002)
    options = LoadOptions(speakers="1,2", streams=[short_stream], speed=3.0, stagger_s=0.0, capture_cost="off")
    run_load(options, site / "outputs" / "cpu" / "load.json", seam_factory=lambda route, heads: seam)
    text, figures = render_site(site)
    assert "## Capacity (many speakers on one engine)" in text
    rows = [line for line in text.splitlines() if line.startswith("| ") and "fake_batch" not in line
            and "cpu: hf_qk_fast" in line]
    capacity, split = rows[:2], rows[2:]
    assert [r.split(" | ")[4] for r in capacity] == ["1", "2"]  # one row per load level
    assert {r.split(" | ")[3] for r in capacity} == {Path(short_stream).stem}  # the stream replayed
    # and where each level's partials spent their round trip: in the server, queued, in the engine
    assert [r.split(" | ")[3] for r in split] == ["1", "2"]
    for r in split:
        rtt, server, queued, in_engine = (r.split(" | ")[i] for i in (4, 5, 6, 7))
        assert float(in_engine) >= 4.0 and float(queued) >= 0  # 2 steps of 2 ms in the stand-in
        assert float(server.split(" / ")[0]) <= float(rtt.split(" / ")[0])
    assert any(f.name == "capacity_rtt_p95" and f.kind == "load" for f in figures)
    assert "outputs/cpu/load.json" in text  # listed with the artifacts


def test_several_vllm_modes_are_configurations_of_one_run_each_with_its_own_levels_and_line(tmp_path, short_stream):
    import shutil

    built: list[dict] = []

    def factory(route, heads):
        built.append(dict(route.seam_options))
        return StandInBatchSeam(max_batch=8, steps_for=lambda r: 2, step_s=0.002)

    options = LoadOptions(seam="vllm_capture", configurations=["vllm_mode=fullgraph", "vllm_mode=cudagraph"], speakers="1,2", streams=[short_stream],
                          speed=3.0, stagger_s=0.0, capture_cost="off")
    site = tmp_path / "site"
    out, metrics, plot = site / "outputs" / "h200" / "load.json", tmp_path / "m.json", tmp_path / "p.csv"
    artifact = run_load(options, out, metrics, plot, seam_factory=factory)
    assert [b["vllm_mode"] for b in built] == ["fullgraph", "cudagraph"]  # one server per mode, in order
    assert [(lv.vllm_mode, lv.speakers) for lv in artifact.levels] == [
        ("fullgraph", 1), ("fullgraph", 2), ("cudagraph", 1), ("cudagraph", 2)]
    # Each mode's N=2 is compared with its own N=1.
    assert all(lv.texts_differing_from_alone == 0 for lv in artifact.levels if lv.speakers == 2)
    assert set(artifact.config.engines_by_configuration) == {"fullgraph", "cudagraph"}
    m = json.loads(metrics.read_text())
    assert set(m) == {"fullgraph", "cudagraph"} and m["cudagraph"]["speakers_2"]["retractions"] == 0
    assert [r.split(",")[1] for r in plot.read_text().splitlines()[1:]] == [
        "vllm_capture/fullgraph", "vllm_capture/fullgraph", "vllm_capture/cudagraph", "vllm_capture/cudagraph"]
    text, figures = render_site(site)
    configurations = {line.split(" | ")[2].split(" (")[0] for line in capacity_table(text) if "h200: vllm_capture" in line}
    assert configurations == {"h200: vllm_capture fullgraph", "h200: vllm_capture cudagraph"}
    (capacity,) = [f for f in figures if f.name == "capacity_rtt_p95"]
    # One legend entry per configuration, in words (the figure's legend sits under its panels).
    assert capacity.svg.count("vLLM capture, full CUDA graphs") == 1
    assert capacity.svg.count("vLLM capture, piecewise CUDA graphs") == 1
    # a second run of the same mode, in a file of its own, is a configuration of its own
    shutil.copy(out, out.with_name("load_rerun.json"))
    text, figures = render_site(site)
    configurations = {line.split(" | ")[2].split(", ")[0] for line in capacity_table(text) if "vllm_capture" in line}
    assert {"h200: vllm_capture fullgraph", "h200 (load_rerun): vllm_capture fullgraph"} <= configurations
    # ... in the table; the figure draws only the stage's own run (load.json)
    (capacity,) = [f for f in figures if f.name == "capacity_rtt_p95"]
    assert capacity.svg.count("vLLM capture, full CUDA graphs") == 1


def test_a_configuration_flag_sets_its_engine_option_and_names_the_levels(tmp_path, short_stream):
    """`fullgraph+batch_invariant` is a configuration of its own: the engine gets the option, the
    levels carry the label, and its N=2 is compared with its own N=1."""
    built: list[dict] = []

    def factory(route, heads):
        built.append(dict(route.seam_options))
        return StandInBatchSeam(max_batch=8, steps_for=lambda r: 2, step_s=0.002)

    options = LoadOptions(seam="vllm_capture", configurations=[{"vllm_mode": "fullgraph"},
                                                               {"vllm_mode": "fullgraph", "batch_invariant": True}],
                          speakers="1,2",
                          streams=[short_stream], speed=3.0, stagger_s=0.0, capture_cost="off")
    site = tmp_path / "site"
    artifact = run_load(options, site / "outputs" / "h200" / "load_batch_invariant.json", seam_factory=factory)
    assert [b["vllm_mode"] for b in built] == ["fullgraph", "fullgraph"]
    assert [b.get("batch_invariant") for b in built] == [None, True]
    assert [lv.vllm_mode for lv in artifact.levels] == ["fullgraph", "fullgraph", "fullgraph+batch_invariant",
                                                       "fullgraph+batch_invariant"]
    assert all(lv.texts_differing_from_alone == 0 for lv in artifact.levels if lv.speakers == 2)
    # the page's configuration note reports the comparison, from the artifact's own figures
    text, _ = render_site(site)
    p50 = {lv.vllm_mode: round(lv.partial_rtt_ms_p50) for lv in artifact.levels if lv.speakers == 1}
    note = " ".join(text.split("Load independence:")[1].split("\n\n")[0].split())
    assert note.startswith("with vLLM's batch-invariant kernels (`fullgraph+batch_invariant`")
    assert "0 of the 2 speakers' updates had a committed text that differed" in note
    assert "against 0 with plain `fullgraph`" in note
    assert (f"p50 was {p50['fullgraph+batch_invariant']} ms against {p50['fullgraph']} ms") in note


def test_later_configurations_run_only_the_compared_levels(tmp_path, short_stream):
    """`compared_speakers`: the served default runs every level, the whole-draft comparison only those
    given (one speaker alone is where it is matched update by update against the first)."""
    def factory(route, heads):
        return StandInBatchSeam(max_batch=8, steps_for=lambda r: 2, step_s=0.002)

    options = LoadOptions(seam="vllm_capture", configurations=["vllm_mode=fullgraph,settle_buffer_tokens=2",
                                                               "vllm_mode=fullgraph"],
                          speakers="1,2", compared_speakers="1", kernel_profile_speakers="2", streams=[short_stream],
                          speed=3.0, stagger_s=0.0, capture_cost="off")
    later = options.for_later_configurations()
    assert (later.speakers, later.kernel_profile_speakers) == ([1], [])
    options = options.model_copy(update={"kernel_profile_speakers": []})  # no profiler here
    artifact = run_load(options, tmp_path / "load.json", seam_factory=factory)
    assert [(lv.vllm_mode, lv.speakers) for lv in artifact.levels] == [
        ("fullgraph+settle2", 1), ("fullgraph+settle2", 2), ("fullgraph", 1)]
    (alone,) = [lv for lv in artifact.levels if lv.vllm_mode == "fullgraph"]
    assert alone.updates_compared_with_first_configuration > 0
    assert artifact.config.compared_speakers == [1] and artifact.config.speakers == [1, 2]
    with pytest.raises(ValueError, match="compared_speakers 4 is not a level of speakers 1,2"):
        LoadOptions(speakers="1,2", compared_speakers="1,4")


def test_the_capture_cost_of_a_flagged_configuration_builds_its_engines_with_the_flag(monkeypatch):
    from alignatt.measure.capacity import capture_cost_in_child

    made: list[dict] = []

    class Quick:
        def draft_many(self, requests):
            return []

        def close(self):
            pass

    def make(name, **kw):
        made.append(kw)
        return Quick()

    monkeypatch.setattr("alignatt.capture.registry.make_seam", make)
    profiled: list[str] = []
    monkeypatch.setattr("alignatt.measure.capture_cost.profile_drafts",
                        lambda seam, requests, folder, label: profiled.append(f"{folder.name}/{label}"))
    options = LoadOptions(seam="vllm_capture", device="cuda", capture_cost_batches="1", capture_cost_repeats=1,
                          profile_dir="prof")
    configuration = LoadConfiguration(vllm_mode="fullgraph", batch_invariant=True)
    rows = capture_cost_in_child({"options": options.model_dump(), "configuration": configuration.model_dump(),
                                  "heads": [[0, 1]]})
    # each configuration profiles into a folder of its own (two would overwrite each other's files)
    assert profiled == ["fullgraph_batch_invariant/captured_b1", "fullgraph_batch_invariant/uncaptured_b1"]
    assert [r["batch"] for r in rows] == [1]
    assert [(m["vllm_mode"], m["batch_invariant"], m["capture"]) for m in made] == [
        ("fullgraph", True, True), ("fullgraph", True, False)]


@pytest.mark.parametrize("configurations, message", [
    ([{"vllm_mode": "cudagraph"}, {"vllm_mode": "warp"}], "configurations.1.vllm_mode: unknown vllm_mode 'warp'"),
    ([{"vllm_mode": "fullgraph", "fast": True}], "configurations.0: unknown configuration key 'fast': use vllm_mode, "),
    (["vllm_mode=fullgraph,engine=2"], "unknown configuration key 'engine'"),
    (["fullgraph+settle2"], "'fullgraph+settle2': write key=value pairs, comma-separated"),
    ([{"vllm_mode": "fullgraph", "settle_buffer_tokens": -1}], "settle_buffer_tokens: Input should be greater"),
])
def test_a_bad_configuration_fails_in_one_line_before_any_server_starts(configurations, message):
    import re

    from alignatt.core.options import validate_flat

    with pytest.raises(AlignattError, match=re.escape(message)) as raised:
        validate_flat(LoadOptions, {"seam": "vllm_capture", "configurations": configurations}, "load option")
    assert "\n" not in str(raised.value) and str(raised.value).startswith("bad load option configurations")


def test_a_kernel_profile_of_a_level_the_run_does_not_measure_is_refused_before_it_starts():
    from alignatt.core.options import validate_flat

    with pytest.raises(AlignattError, match="kernel_profile_speakers 3 is not a level of speakers 1,2"):
        validate_flat(LoadOptions, {"speakers": "1,2", "kernel_profile_speakers": "2,3"}, "load option")
    assert validate_flat(LoadOptions, {"speakers": "1,2", "kernel_profile_speakers": "2"},
                         "load option").kernel_profile_speakers == [2]


def test_the_command_line_takes_one_configuration_per_option_and_refuses_a_bad_one(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from alignatt.cli import app
    from alignatt.measure import capacity

    got = {}

    def stop(options, *args, **kwargs):  # noqa: ANN001, ANN202 - the options, then stop
        got["options"] = options
        raise AlignattError("stopped before any server starts")

    monkeypatch.setattr(capacity, "run_load", stop)
    result = CliRunner().invoke(app, ["load", "--seam", "vllm_capture", "--configurations",
                                      "vllm_mode=fullgraph,settle_buffer_tokens=2,own_process=true",
                                      "--configuration", '{"vllm_mode": "fullgraph", "own_process": true}',
                                      "--out", str(tmp_path / "load.json")])
    assert "stopped before any server starts" in result.output, result.output
    assert [c.label() for c in got["options"].runs()] == ["fullgraph+settle2+process", "fullgraph+process"]
    result = CliRunner().invoke(app, ["load", "--seam", "vllm_capture", "--configurations", "vllm_mode=fullgraph,engine=2",
                                      "--out", str(tmp_path / "load.json")])
    assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1, result.output
    assert "unknown configuration key 'engine'" in result.output


def test_a_run_measures_the_served_default_then_whole_drafts_unless_told():
    from alignatt.measure.load_configurations import served_default

    on_gpu = LoadOptions(seam="vllm_capture", device="cuda").runs()
    assert on_gpu == [served_default(), served_default().model_copy(update={"settle_buffer_tokens": None})]
    assert [c.label() for c in on_gpu] == ["fullgraph+settle2+process", "fullgraph+process"]
    assert [c.label() for c in LoadOptions().runs()] == [None]  # hf_eager on CPU: served whole, in its process
    assert [c.label() for c in LoadOptions(seam="vllm_capture").runs()] == ["fullgraph"]  # vllm on CPU
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="sets vllm_capture's engine options"):
        LoadOptions(configurations=["vllm_mode=fullgraph"])  # the default seam is hf_eager
    assert [c.label() for c in LoadOptions(configurations=["settle_buffer_tokens=2", "own_process=false"]).runs()] == [
        "default+settle2", None]


def test_the_capture_cost_compares_captured_and_uncaptured_on_the_same_prompts(tmp_path):
    """With a stand-in for make_seam: both engines get the same prompts at every batch size, one
    engine at a time, each closed; the profiler writes a trace and an operator table."""
    from alignatt.measure.capture_cost import capture_cost

    built = []

    class Timed:
        def __init__(self, capture):
            self.capture, self.batches, self.closed = capture, [], False

        def draft_many(self, requests):
            assert not any(not s.closed for s in built if s is not self)  # one engine at a time
            self.batches.append([r.source_words for r in requests])
            return []

        def close(self):
            self.closed = True

    def make(name, capture, **kw):
        assert name == "vllm_capture" and kw["fixed_length"]
        built.append(Timed(capture))
        return built[-1]

    options = LoadOptions(seam="vllm_capture", device="cuda", capture_cost_batches="1,3", capture_cost_repeats=2,
                          profile_dir=str(tmp_path / "prof"))
    rows = capture_cost(options, [], make=make)
    assert [r["batch"] for r in rows] == [1, 3] and all(r["ratio"] > 0 for r in rows)
    captured, plain = built
    assert captured.capture and not plain.capture and captured.closed and plain.closed
    assert captured.batches == plain.batches  # same prompts, same order
    assert sorted(p.name for p in (tmp_path / "prof").iterdir()) == [
        f"{kind}_b{b}_{what}" for kind in ("captured", "uncaptured") for b in (1, 3)
        for what in ("top_ops.txt", "trace.json")]


def test_realtime_pacing_supersedes_stale_partials_and_still_delivers_every_final(tmp_path, short_stream):
    """Speakers that never wait, on an engine slower than their updates: stale partials are
    superseded (aborted in the engine), every final arrives in order, nothing is retracted."""
    seam = StandInBatchSeam(max_batch=4, steps_for=lambda r: 20, step_s=0.005)  # ~100 ms a draft
    options = LoadOptions(speakers=[3], streams=[short_stream], speed=1.0, stagger_s=0.02, pacing="realtime",
                          capture_cost="off")
    artifact = run_load(options, tmp_path / "load.json", seam_factory=lambda route, heads: seam)
    (lv,) = artifact.levels
    assert artifact.config.pacing == "realtime"
    assert lv.superseded > 0 and seam.aborted  # running partials were aborted, not finished
    assert lv.finals_delivered == lv.finals_expected == 6 and lv.finals_in_order
    assert lv.retractions == 0 and lv.error_frames == 0
    assert lv.updates < 3 * 2 * len(SHORT["text"].split())  # superseded updates got no reply


def test_one_speaker_on_a_later_configuration_is_compared_with_the_first(tmp_path, short_stream, monkeypatch):
    """Verification on against off in one run: the later configuration's N=1 level says how many of
    the same updates differ from the first's; only configurations that change more than verification
    get a capture cost of their own (its drafts carry no proposal)."""
    costed: list[str] = []
    monkeypatch.setattr("alignatt.measure.capacity.capture_cost_in_child",
                        lambda payload: costed.append(LoadConfiguration(**payload["configuration"]).label()) or [])
    options = LoadOptions(seam="vllm_capture", configurations=["vllm_mode=fullgraph", "vllm_mode=fullgraph,verify=true"],
                          speakers="1,2", streams=[short_stream], speed=3.0, stagger_s=0.0, capture_cost="on")
    artifact = run_load(options, None, seam_factory=lambda route, heads: StandInBatchSeam(max_batch=8))
    first, later = ([lv for lv in artifact.levels if lv.vllm_mode == m and lv.speakers == 1]
                    for m in ("fullgraph", "fullgraph+verify"))
    assert first[0].updates_compared_with_first_configuration is None  # the reference itself
    assert later[0].updates_compared_with_first_configuration == later[0].updates > 0
    assert later[0].texts_differing_from_first_configuration == 0  # the same stand-in engine
    assert all(lv.updates_compared_with_first_configuration is None for lv in artifact.levels if lv.speakers == 2)
    assert costed == ["fullgraph"]
    assert "not measured for fullgraph+verify" in artifact.capture_cost_note


def test_an_engines_flag_serves_its_configuration_from_that_many_engine_processes(short_stream, monkeypatch):
    """`fullgraph+engines2`: the same route from two engine processes (the server's replicas), one
    speaker alone compared with the first configuration's; its capture cost is its mode's (one engine)."""
    from tests.fakes.replica_fakes import vllm_route_factory

    costed: list[str] = []
    monkeypatch.setattr("alignatt.measure.capacity.capture_cost_in_child",
                        lambda payload: costed.append(LoadConfiguration(**payload["configuration"]).label()) or [])
    options = LoadOptions(seam="vllm_capture", configurations=["vllm_mode=fullgraph", "vllm_mode=fullgraph,engines=2"],
                          speakers="1,2",
                          streams=[short_stream], speed=3.0, stagger_s=0.0, capture_cost="on", clients="threads")
    artifact = run_load(options, None, seam_factory=vllm_route_factory)
    levels = {(lv.vllm_mode, lv.speakers): lv for lv in artifact.levels}
    assert [len(levels["fullgraph", n].engines) for n in (1, 2)] == [1, 1]
    assert [len(levels["fullgraph+engines2", n].engines) for n in (1, 2)] == [2, 2]
    assert [e.sessions for e in levels["fullgraph+engines2", 2].engines] == [1, 1]  # one speaker on each
    assert all(lv.retractions == 0 and lv.finals_in_order and lv.error_frames == 0 for lv in levels.values())
    alone = levels["fullgraph+engines2", 1]
    assert alone.updates_compared_with_first_configuration == alone.updates > 0
    assert alone.texts_differing_from_first_configuration == 0 and alone.peak_gpu_memory_mib is None
    assert costed == ["fullgraph"] and "not measured for fullgraph+engines2" in artifact.capture_cost_note


def test_a_process_flag_serves_its_one_engine_from_a_process_of_its_own(short_stream):
    import os

    from tests.fakes.replica_fakes import vllm_route_factory

    options = LoadOptions(seam="vllm_capture", configurations=["vllm_mode=fullgraph,own_process=true"], speakers="1", streams=[short_stream],
                          speed=3.0, stagger_s=0.0, capture_cost="off", clients="threads")
    artifact = run_load(options, None, seam_factory=vllm_route_factory)
    (lv,) = artifact.levels
    assert len(lv.engines) == 1 and lv.retractions == 0 and lv.finals_in_order and lv.peak_gpu_memory_mib is None
    assert artifact.config.per_engine[0]["pid"] != os.getpid()
    # garbage-collector pauses per step: the server's process and the engine's own
    assert lv.engines[0].gc_ms_mean is not None and lv.engines[0].child_gc_ms_mean is not None
    assert 0 < lv.host_cpu_busy_share <= 1 and lv.host_cpu_steal_share is not None  # this Linux host's CPUs
    # the server's loop thread did some work but waited for the engine's process: less than a core
    assert 0 < lv.server_loop_cpu_share < 1 and lv.server_process_cpu_cores >= lv.server_loop_cpu_share
    # each of the server's threads by name, the event loop's among them; together no more than the process
    threads = lv.server_thread_cpu_cores
    assert threads["alignatt-server"] > 0 and sum(threads.values()) <= lv.server_process_cpu_cores + 0.05


def test_an_engine_profile_dir_profiles_each_engine_process_over_each_level(short_stream, tmp_path):
    from alignatt.report.capacity import configuration
    from tests.fakes.replica_fakes import vllm_route_factory

    options = LoadOptions(seam="vllm_capture", configurations=["vllm_mode=fullgraph,own_process=true"], speakers="1,2", streams=[short_stream],
                          speed=3.0, stagger_s=0.0, capture_cost="off", clients="threads",
                          engine_profile_dir=str(tmp_path / "profiles"))
    artifact = run_load(options, None, seam_factory=vllm_route_factory)
    written = sorted(p.name for p in (tmp_path / "profiles").iterdir())
    assert written == [f"fullgraph_process_engine0_{n}.pstats{ext}" for n in (1, 2) for ext in ("", ".txt")]
    # the profiler slows what it profiles: the artifact says so, and the page labels its rows
    assert artifact.config.engine_profile_dir == str(tmp_path / "profiles")
    assert "under cProfile" in configuration("outputs/h200/load_profiled.json", artifact, "fullgraph+process")
    unprofiled = artifact.model_copy(update={"config": artifact.config.model_copy(update={"engine_profile_dir": None})})
    assert "cProfile" not in configuration("outputs/h200/load_profiled.json", unprofiled, "fullgraph+process")
    # an engine in the server's process cannot be profiled apart from the server: said before any level runs
    with pytest.raises(AlignattError, match="no engine in a process of its own"):
        in_server = options.model_copy(update={"configurations": [LoadConfiguration(vllm_mode="fullgraph")]})
        run_load(in_server, None, seam_factory=vllm_route_factory)


def test_a_configuration_and_its_label_round_trip_as_artifacts_have_always_named_it():
    every = LoadConfiguration(vllm_mode="fullgraph", settle_buffer_tokens=2, own_process=True, engines=4, verify=True,
                              batch_invariant=True, quantization="fp8", settle_every=1, chunked_history=True,
                              front_ends=3, max_num_seqs=256)
    assert every.label() == ("fullgraph+settle2+process+engines4+verify+batch_invariant+fp8+every1+chunked+frontends3"
                             "+seqs256")
    assert LoadConfiguration.from_label(every.label()) == every
    from alignatt.serve.config import DirectionRoute

    assert every.server_config(DirectionRoute(), port=0).front_ends == 3
    # FP8 weights reach the engine's options, and the capture cost's engines keep them
    assert every.seam_options()["quantization"] == "fp8" and every.plain_engine().quantization == "fp8"
    assert every.seam_options()["settle_every"] == 1  # the engine's option; None keeps the engine's default
    assert every.seam_options()["max_num_seqs"] == 256  # over the served batch limit, in the route's options
    from alignatt.capture.vllm.engine import VllmEngineConfig

    assert VllmEngineConfig(model="m", **every.seam_options()).max_num_seqs == 256  # every option is the engine's
    assert "settle_every" not in LoadConfiguration(vllm_mode="fullgraph").seam_options()
    with pytest.raises(ValidationError, match="unknown quantization 'int4'"):
        LoadConfiguration(quantization="int4")
    assert LoadConfiguration.from_label("fullgraph+engines4+verify") == LoadConfiguration(
        vllm_mode="fullgraph", engines=4, verify=True)
    assert LoadConfiguration.from_label(None) == LoadConfiguration() and LoadConfiguration().label() is None
    for label in ("fullgraph+engines0", "fullgraph+engines", "fullgraph+fast", "fullgraph+every0",
                  "fullgraph+frontends1", "fullgraph+seqs0"):
        with pytest.raises(AlignattError, match="unknown configuration flag"):
            LoadConfiguration.from_label(label)
    with pytest.raises(AlignattError, match="names engines twice"):
        LoadConfiguration.from_label("fullgraph+engines2+engines3")
    with pytest.raises(AlignattError, match="unknown vllm_mode 'warp'"):
        LoadConfiguration.from_label("warp+process")


def test_every_label_a_committed_load_artifact_recorded_reads_back_as_the_configuration_it_names():
    """outputs/*/load*.json name configurations by label (config vllm_modes, each level's vllm_mode):
    each reads as one configuration whose label is that text again."""
    from alignatt.record.artifacts import LoadArtifact, load_artifact

    root = Path(__file__).resolve().parents[2] / "outputs"
    labels = set()
    for path in sorted(root.glob("*/load*.json")):
        if path.name.endswith("_metrics.json"):
            continue
        artifact = load_artifact(path)
        assert isinstance(artifact, LoadArtifact)
        labels |= set(artifact.config.vllm_modes) | {lv.vllm_mode for lv in artifact.levels}
    assert {"fullgraph+settle2+process", "fullgraph+process", "fullgraph+engines4", "fullgraph+verify"} <= labels
    for label in labels:
        assert LoadConfiguration.from_label(label).label() == label


def test_a_configuration_is_the_server_it_sets():
    from alignatt.serve.config import DirectionRoute

    route = DirectionRoute(seam="vllm_capture", device="cuda", seam_options={"max_num_seqs": 8})
    cfg = LoadConfiguration(vllm_mode="fullgraph", settle_buffer_tokens=2, engines=2, verify=True).server_config(
        route, port=0)
    assert cfg.directions["en-de"].seam_options == {"max_num_seqs": 8, "vllm_mode": "fullgraph", "verify": True}
    assert (cfg.settle_buffer_tokens, cfg.engines, cfg.replicas.engines_per_gpu, cfg.port) == (2, 2, 2, 0)
    alone = LoadConfiguration(own_process=True).server_config(route, engines="auto")
    assert (alone.engines, alone.replicas.own_process, alone.settle_buffer_tokens) == ("auto", True, None)
    chunked = LoadConfiguration(chunked_history=True).server_config(route, context=ContextConfig(history_pairs=2))
    assert (chunked.context.history_window, chunked.context.history_pairs) == ("chunked", 2)
    assert LoadConfiguration().server_config(route).context.history_window == "sliding"


def test_a_settle_flag_gives_every_session_of_its_configuration_the_buffer(short_stream):
    seam = StandInBatchSeam(max_batch=8)
    options = LoadOptions(seam="vllm_capture", configurations=["vllm_mode=fullgraph,settle_buffer_tokens=2"],
                          speakers="1", streams=[short_stream], speed=3.0, stagger_s=0.0, capture_cost="off")
    run_load(options, None, seam_factory=lambda route, heads: seam)
    partials = [r for _, r in seam.submitted if not r.final]
    assert partials and all(r.settle is not None and r.settle.buffer_tokens == 2 for r in partials)
    assert all(r.settle is None for _, r in seam.submitted if r.final)


def test_the_configuration_difference_counts_texts_and_decisions_by_stream_and_seq():
    from alignatt.measure.capacity_levels import configuration_difference

    reference = {"smoke": {"0": ["Das", "draft", "Das", "ist ein"], "1": ["Das Haus", "draft", " Haus", "ist gross und"],
                           "2": ["x", "fast_path", "", ""]}}
    other = {"smoke": {"0": ["Das", "draft", "Das", "ist ein"], "1": ["Das Heim", "draft", " Heim", "ist"],
                       "2": ["x", "draft", "", ""], "9": ["unmatched", "draft", "", "a b c d e"]}}
    assert configuration_difference(reference, other) == {
        "updates_compared_with_first_configuration": 3, "texts_differing_from_first_configuration": 1,
        "decisions_differing_from_first_configuration": 2, "buffers_differing_from_first_configuration": 1,
        "buffer_words_mean": 1.0, "first_configuration_buffer_words_mean": 1.67}


def test_the_page_judges_the_capacity_targets_and_shows_verification_against_plain_drafts(tmp_path, short_stream):
    """params.yaml's capacity targets judged on the load stage's run, per configuration (met,
    missed, or not measured), and the verification table with its per-draft figures."""
    import yaml

    class CountingSeam(StandInBatchSeam):
        """Counts every finished draft as 4 proposed tokens, 3 accepted, 2 decoded, 3 forwards."""

        def acceptance_totals(self):
            n = sum(1 for _ in self.submitted) - len(self.running)
            return {"drafts": n, "tokens": 5 * n, "proposed": 4 * n, "accepted": 3 * n, "decoded": 2 * n,
                    "forward_steps": 3 * n, "verify_ms": 1.5 * n, "extend_ms": 2.5 * n}

    options = LoadOptions(seam="vllm_capture", configurations=["vllm_mode=fullgraph", "vllm_mode=fullgraph,verify=true"],
                          speakers="1,2", streams=[short_stream], speed=3.0, stagger_s=0.0, capture_cost="off")
    site = tmp_path / "site"
    out = site / "outputs" / "h200" / "load.json"
    run_load(options, out, seam_factory=lambda route, heads: CountingSeam(max_batch=8, step_s=0.002))
    artifact = json.loads(out.read_text())  # as a GPU run records the bench prompts verified (no CUDA here)
    assert artifact["verify_equality"] == []
    artifact["verify_equality"] = [{"vllm_mode": "fullgraph+verify", "prompts": 16, "tokens_differ": 2, "texts_differ": 1,
                                    "decisions_differ": 0, "proposed": 180, "accepted": 120, "row_max_abs_diff": 0.0031}]
    out.write_text(json.dumps(artifact))
    render_site(site)  # copies params.yaml in; then set targets the stand-in meets and misses
    params = yaml.safe_load((site / "params.yaml").read_text())
    params["report"]["capacity_targets"] = [{"speakers": 1, "rtt_p50_ms": 1e6}, {"speakers": 1, "rtt_p50_ms": 0.001},
                                            {"speakers": 64, "rtt_p95_ms": 300}]
    (site / "params.yaml").write_text(yaml.safe_dump(params))
    from alignatt.report.page import render_all

    lines = render_all(site)[0].splitlines()
    verdicts = [line.split(" | ")[2:4] for line in lines if line.startswith("| ") and "**" in line]
    # a level no configuration ran: not measured on the run's first (a later one may run fewer levels)
    assert verdicts == [["1", "**met**"], ["1", "**met**"], ["1", "**missed**"], ["1", "**missed**"],
                        ["64", "**—**"]]
    start = next(i for i, line in enumerate(lines) if line.startswith("| Date | Configuration | Speakers | Drafts"))
    rows = [line.split(" | ") for line in lines[start + 2:start + 6]]
    assert [r[2] for r in rows] == ["1", "2", "1", "2"]  # every level of both configurations
    for r in rows:  # CountingSeam: 3 of 4 proposed kept, 2 decoded, 3 forwards, 1.5 + 2.5 ms per draft
        assert r[4] == f"75% of {4 * int(r[3])}" and r[5:9] == ["2.0", "3.0", "1.5", "2.5"], r
    assert rows[2][-1].startswith("0 texts, 0 decisions of ")  # one speaker on +verify against the first
    assert "buffers (mean" in rows[2][-1]  # and the buffers it showed
    assert any(line.endswith("fullgraph+verify | 16 | 2 | 1 | 0 | 120 of 180 | 0.0031 |")
               for line in lines), "the bench prompts verified against drafted from scratch"
    params["report"]["capacity_targets"] = [{"speakers": 64, "rtt_p99_ms": 300}]  # not a bound the page knows
    (site / "params.yaml").write_text(yaml.safe_dump(params))
    with pytest.raises(AlignattError, match="known bounds are rtt_p50_ms, rtt_p95_ms, lag_max_s"):
        render_all(site)


def test_a_kernel_profile_traces_each_engine_process_at_its_level(short_stream, tmp_path):
    from tests.fakes.replica_fakes import vllm_route_factory

    site = tmp_path / "site"
    options = LoadOptions(seam="vllm_capture", configurations=["vllm_mode=fullgraph,own_process=true"], speakers="1,2", streams=[short_stream],
                          speed=3.0, stagger_s=0.0, capture_cost="off", clients="threads",
                          kernel_profile_speakers="2", kernel_profile_steps=3, kernel_profile_after_s=0.0)
    artifact = run_load(options, site / "outputs" / "cpu" / "load.json", seam_factory=vllm_route_factory)
    alone, two = artifact.levels
    assert alone.step_anatomy is None
    (anatomy,) = two.step_anatomy.values()
    # no CUDA here: the steps are traced, no kernel is; the whole window is idle GPU time
    assert anatomy.steps == 3 and anatomy.gpu_busy_ms == 0 and anatomy.idle_ms > 0 and anatomy.device == "cpu"
    assert anatomy.write_s >= 0  # how long the engine stopped stepping to write it
    # the engine thread's side: no CUDA to wait on, so the whole step is host work
    assert anatomy.gpu_wait_ms == 0 and anatomy.host_ms == pytest.approx(anatomy.step_wall_ms, abs=1e-3)
    assert anatomy.between_steps_ms >= 0 and anatomy.host_ranges_ms == {}  # the stand-in has no vLLM scopes
    text, figures = render_site(site)
    (row,) = [line for line in text.splitlines() if line.startswith("| ") and "fullgraph+process | 2 | 0 | 3 |" in line]
    assert f"| {anatomy.host_ms:.2f} / 0.00 / {anatomy.between_steps_ms:.2f} | — |" in row
    (figure,) = [f for f in figures if f.name.startswith("step_anatomy")]
    assert figure.name == "step_anatomy_cpu"  # a step traced without a GPU is not drawn on the GPU steps' axis
    assert "engine thread" in figure.svg and "host work" in figure.svg
    too_long = run_load(options.model_copy(update={"kernel_profile_steps": 10**6}), None,
                        seam_factory=vllm_route_factory)
    (missing,) = too_long.levels[1].step_anatomy.values()
    assert "ended before 1000000 steps" in missing.missing
    with pytest.raises(AlignattError, match="no engine in a process of its own"):
        in_server = options.model_copy(update={"configurations": [LoadConfiguration(vllm_mode="fullgraph")]})
        run_load(in_server, None, seam_factory=vllm_route_factory)


def test_a_level_that_fails_closes_its_progress_line(tmp_path, short_stream, monkeypatch):
    """An open progress bar keeps printing its heartbeat after the error: the run closes it."""
    import threading

    from alignatt.measure import capacity

    def failing(*args, **kwargs):
        raise RuntimeError("speakers lost")

    monkeypatch.setattr(capacity, "run_speakers", failing)
    seam = StandInBatchSeam(max_batch=8, steps_for=lambda r: 2, step_s=0.002)
    options = LoadOptions(speakers="1,2", streams=[short_stream], speed=4.0, stagger_s=0.0, capture_cost="off")
    with pytest.raises(RuntimeError, match="speakers lost"):
        run_load(options, None, seam_factory=lambda route, heads: seam)
    assert not [t.name for t in threading.enumerate() if t.name.startswith("progress:load") and t.is_alive()]


def test_a_later_configuration_that_fails_is_named_and_the_others_stand(tmp_path, short_stream, monkeypatch):
    """Each configuration runs in a child of its own; one after the first that dies (an engine that
    does not start) is recorded by label and error, and the run keeps the levels of the rest."""
    import alignatt.record.isolated as isolated
    from alignatt.measure.capacity import run_configuration

    def child(target, payload, what):
        configuration = LoadConfiguration.model_validate(payload["configuration"])
        if configuration.quantization:
            raise RuntimeError(f"{what} exited with 1\nTraceback ...")
        return run_configuration(LoadOptions.model_validate(payload["options"]), configuration,
                                 lambda route, heads: StandInBatchSeam(max_batch=8, steps_for=lambda r: 2, step_s=0.002))

    monkeypatch.setattr(isolated, "run_in_child", child)
    options = LoadOptions(seam="vllm_capture", configurations=["vllm_mode=fullgraph", "vllm_mode=fullgraph,quantization=fp8",
                                                               "vllm_mode=compiled"],
                          speakers="1", streams=[short_stream], speed=3.0, stagger_s=0.0, capture_cost="off")
    site = tmp_path / "site"
    artifact = run_load(options, site / "outputs" / "h200" / "load.json")
    assert artifact.config.vllm_modes == ["fullgraph", "compiled"]
    assert [lv.vllm_mode for lv in artifact.levels] == ["fullgraph", "compiled"]
    assert artifact.configurations_failed == ["fullgraph+fp8: RuntimeError: load (fullgraph+fp8) exited with 1"]
    text, _ = render_site(site)
    assert ("A configuration did not run to its end, and has no rows, in `outputs/h200/load.json`: "
            "fullgraph+fp8: RuntimeError") in " ".join(text.split())
    # the first is what the others are compared with: its failure fails the run
    first_fails = options.model_copy(update={"configurations": [LoadConfiguration(vllm_mode="fullgraph", quantization="fp8"),
                                                                LoadConfiguration(vllm_mode="fullgraph")]})
    with pytest.raises(RuntimeError, match="exited with 1"):
        run_load(first_fails, tmp_path / "x.json")
    assert not (tmp_path / "x.json").exists()


@pytest.mark.parametrize("pacing", ["lockstep", "realtime"])
def test_speakers_that_fall_too_far_behind_stop_and_the_level_says_so(tmp_path, short_stream, pacing):
    """A server far slower than the stream: with stop_lag_s each speaker stops once that far behind,
    the level is judged growing, its finals due are those of the words committed before the stop,
    and the page names the stop."""
    seam = StandInBatchSeam(max_batch=4, steps_for=lambda r: 40, step_s=0.01)  # ~0.4 s a draft
    options = LoadOptions(speakers=[2], streams=[short_stream], speed=1.0, stagger_s=0.0, pacing=pacing,
                          capture_cost="off", stop_lag_s=0.2)
    site = tmp_path / "site"
    artifact = run_load(options, site / "outputs" / "cpu" / "load.json", seam_factory=lambda route, heads: seam)
    (lv,) = artifact.levels
    assert artifact.config.stop_lag_s == 0.2
    assert lv.stopped_speakers == 2 and lv.lag_grows and lv.stopped_at_stream_s < 2.2  # the stream is 2.2 s
    assert lv.finals_delivered == lv.finals_expected < 4 and lv.finals_in_order and lv.error_frames == 0
    assert lv.retractions == 0
    text, _ = render_site(site)
    (row,) = [r for r in capacity_table(text) if Path(short_stream).stem in r]
    assert f"stopped behind at {lv.stopped_at_stream_s:g} s" in row
    from alignatt.report.capacity import _judge

    ok, said = _judge(lv, {"lag_max_s": 100.0})  # its lag is under the bound only because it stopped
    assert not ok and "2 speakers stopped behind" in said


def test_a_stopped_speaker_is_due_the_finals_of_the_words_it_committed():
    stream = SmokeStream(words_per_second=2.0, commit_lag_seconds=1.0, text="One two. Three four. Five six.")
    args = (1.0, [{"steps": 0, "batch_sizes": {}}], [{"engine": "0", "steps": 4, "batch_sizes": {"1": 4}}],
            {"coalesced": 0}, (None, None), {})
    whole = RunRecord("native", _events([0.1] * 6, finals=(0, 1, 2)), 1.0, 0.1)
    stopped = RunRecord("native", _events([0.1] * 6, finals=(0,)), 1.0, 0.1, stopped_at_s=2.5, committed_words=3)
    level = summarise_level(2, [whole, stopped], [("s", stream)], *args)
    assert level["finals_expected"] == 3 + 1 and level["finals_delivered"] == 4 and level["finals_in_order"]
    assert level["stopped_speakers"] == 1 and level["stopped_at_stream_s"] == 2.5 and level["lag_grows"]
    assert summarise_level(1, [whole], [("s", stream)], *args)["stopped_speakers"] == 0


def test_a_load_record_from_before_the_stop_reads_as_every_stream_run_to_its_end():
    from alignatt.record.artifacts import load_artifact

    root = Path(__file__).resolve().parents[2]
    assert load_artifact(root / "outputs" / "h200" / "load_verify.json").config.stop_lag_s is None
