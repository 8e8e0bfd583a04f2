"""`alignatt eval --engines N`: the in-process streams spread over N replay processes, each with an
engine process of its own (stand-in seams in child processes, on CPU)."""

from __future__ import annotations

import json
import multiprocessing
import os
import re

import pytest
from pydantic import ValidationError
from typer.testing import CliRunner

pytest.importorskip("omnisteval")

from alignatt.cli import app  # noqa: E402
from alignatt.core.draft import Head  # noqa: E402
from alignatt.core.errors import AlignattError  # noqa: E402
from alignatt.evaluate.engines import engine_specs  # noqa: E402
from alignatt.evaluate.run import EvalOptions, run_eval  # noqa: E402
from alignatt.serve.config import DirectionRoute  # noqa: E402
from tests.fakes.replica_fakes import (  # noqa: E402, F401 - no_leaked_processes: autouse here
    WithOptions, drafts_by_process, no_leaked_processes, process_of, vllm_route_factory)

# Sentence i's words all start with TAGS[i] ("b0 b1 b2."), so a record of first source words says
# which sentence each engine process drafted for.
TAGS = "abcdef"
CONCURRENCY = 4
LOAD = dict(load_levels=[2], load_sentences=2)  # under load: sentences a and b, two at once


@pytest.fixture(scope="module")
def test_set(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("set") / "tagged.jsonl"
    lines = [{"id": f"s{i}", "source": " ".join(f"{t}{j}" for j in range(3 + i % 3)) + ".",
              "reference": f"Satz {t} eins zwei."} for i, t in enumerate(TAGS)]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return str(path)


def _options(test_set: str, **update) -> EvalOptions:
    return EvalOptions(**{"test_set": test_set, "presets": ["balanced"], "tails": ["gold", "none"],
                          "bootstrap": 10, "concurrency": CONCURRENCY, **update})


def _engine_processes() -> list:
    return [p for p in multiprocessing.active_children() if p.name.startswith("alignatt-engine-eval")]


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.fixture(scope="module")
def runs(test_set, tmp_path_factory):
    """The same eval (with an under-load level) on one engine in this process and on two engine
    processes; each stand-in records the first source word of every draft, per process."""
    got = {}
    for engines in (1, 2):
        record = tmp_path_factory.mktemp(f"drafts{engines}")
        progress: list[str] = []
        artifact = run_eval(_options(test_set, engines=engines, **LOAD), None,
                            seam_factory=WithOptions(record_dir=str(record)), progress=progress.append)
        got[engines] = artifact, record, progress
    return got


def _replayed(row):
    return (row.role, row.preset, row.tail, row.driver, row.concurrency, row.hypotheses, row.read_words,
            [[e[:3] for e in stream] for stream in row.emissions], row.updates, row.engine_calls, row.paths)


def _load_engine(record) -> int:
    """The engine process that drafted only sentences a and b: the under-load rows' own."""
    (pid,) = [pid for pid, words in drafts_by_process(record).items() if {w[0] for w in words} == {"a", "b"}]
    return pid


def test_two_replay_processes_replay_what_one_engine_does_and_both_draft(runs):
    (one, one_record, _), (two, two_record, progress) = runs[1], runs[2]
    assert len(two.rows) == 4  # gold, none, offline, under load 2
    assert [_replayed(r) for r in two.rows] == [_replayed(r) for r in one.rows]
    assert set(drafts_by_process(one_record)) == {os.getpid()}  # engines 1: the seam in this process
    by_process = drafts_by_process(two_record)
    rows_engines = set(by_process) - {_load_engine(two_record)}
    assert len(rows_engines) == 2 and os.getpid() not in by_process and all(by_process.values())
    line = next(m for m in progress if "in-process streams" in m)
    assert "4 streams at once on 2 engines" in line and line.endswith("(engine limit 1)")
    # every replay and engine process was closed and reaped
    assert not _engine_processes() and all(_gone(pid) for pid in by_process)
    assert not [p for p in multiprocessing.active_children() if p.name.startswith("alignatt-eval-shard")]


def test_the_config_records_the_engines(runs):
    one, two = runs[1][0], runs[2][0]
    assert one.config.engines == 1 and one.config.engine_processes is None
    assert "one draft scheduler on the variant's engine" in one.config.concurrent_streams
    assert two.config.engines == 2 and "process i mod 2" in two.config.engine_processes
    assert "each of the variant's 2 engines" in two.config.concurrent_streams
    assert two.config.under_load.endswith("one fresh engine process alone")


def test_streams_are_dealt_over_the_engines_and_the_under_load_rows_run_on_a_fresh_one(runs):
    _, record, progress = runs[2]
    load = _load_engine(record)
    (first,), (second,) = process_of(record, "c"), process_of(record, "d")
    assert len({first, second, load}) == 3
    # the rows' streams dealt over both engines (one map, by position: the longest first)
    assert set().union(*(process_of(record, t) for t in TAGS)) - {load} == {first, second}
    # under load, sentences a and b, two at once on the fresh engine alone
    load_line = next(m for m in progress if "under load, 2 at once" in m)
    assert "2 streams at once:" in load_line and "engines" not in load_line


@pytest.mark.parametrize("update, says", [
    ({"engines": 2, "concurrency": 1}, "need concurrency >= 2"),
    ({"engines": 2, "drivers": ["inprocess", "websocket"]}, "inprocess driver only"),
    ({"engines": 0}, "greater than or equal to 1"),
])
def test_engines_without_concurrent_inprocess_streams_are_refused(test_set, update, says):
    with pytest.raises(ValidationError) as refused:
        _options(test_set, **update)
    assert refused.value.errors()[0]["loc"] == ("engines",) and says in str(refused.value)


def test_the_cli_refuses_engines_without_concurrency_in_one_line(tmp_path):
    out = tmp_path / "eval.json"
    r = CliRunner().invoke(app, ["eval", "--engines", "2", "--limit", "1", "--out", str(out)])
    assert r.exit_code == 2, r.output
    assert r.output.startswith("error: engines:") and "concurrency >= 2" in r.output
    assert len(r.output.strip().splitlines()) == 1 and not out.exists()


@pytest.mark.parametrize("device, visible, says", [("cuda:0", "0", "must be 'cuda'"),
                                                   ("cuda", "", "0 CUDA GPUs are visible")])
def test_engines_on_a_device_they_cannot_be_dealt_to_fail_before_any_process(test_set, monkeypatch, device,
                                                                             visible, says):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    with pytest.raises(AlignattError, match=says):
        run_eval(_options(test_set, engines=2, device=device), None, seam_factory=WithOptions(),
                 progress=lambda m: None)
    assert not _engine_processes()


def test_vllm_engines_sharing_a_gpu_each_ask_for_their_share_of_its_memory(monkeypatch):
    heads = [Head(0, 0)]
    route = DirectionRoute(model="gemma3-270m", seam="vllm_capture", device="cuda",
                           seam_options={"vllm_mode": "eager", "max_num_seqs": 4})
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    shared = engine_specs(vllm_route_factory, route, heads, 2)
    assert [s.cuda_device for s in shared] == ["0", "0"]
    # the variant's options as given (no served defaults), plus the memory share
    assert [s.route.seam_options for s in shared] == [{"vllm_mode": "eager", "max_num_seqs": 4,
                                                       "engine_kwargs": {"gpu_memory_utilization": 0.45}}] * 2
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")  # one engine per GPU: each may ask for the default
    assert [(s.cuda_device, s.route) for s in engine_specs(vllm_route_factory, route, heads, 2)] == [("0", route),
                                                                                                      ("1", route)]
    cpu = route.model_copy(update={"device": "cpu"})
    assert [(s.cuda_device, s.route) for s in engine_specs(vllm_route_factory, cpu, heads, 2)] == [(None, cpu)] * 2


def test_a_failing_draft_fails_the_eval_in_one_line_and_ends_every_engine_process(test_set, tmp_path):
    record, out = tmp_path / "drafts", tmp_path / "eval.json"
    record.mkdir()
    with pytest.raises(AlignattError) as failed:
        run_eval(_options(test_set, engines=2), out, seam_factory=WithOptions(record_dir=str(record), fail_word="c1"),
                 progress=lambda m: None)
    message = str(failed.value)
    # s2 drafts 'c1' under every tail, and which of its streams fails first is the engines' race
    assert re.match(r"stream balanced/\w+/s2 failed", message) and "ValueError: stand-in refuses 'c1'" in message, message
    assert "\n" not in message and not out.exists()
    pids = set(drafts_by_process(record))
    assert len(pids) == 2 and not _engine_processes() and all(_gone(pid) for pid in pids)


def test_an_engine_that_cannot_start_fails_the_eval_and_the_started_one_is_closed(test_set, tmp_path):
    with pytest.raises(RuntimeError, match="cannot load"):
        run_eval(_options(test_set, engines=2), None, seam_factory=WithOptions(fail_first_build=str(tmp_path)),
                 progress=lambda m: None)
    assert (tmp_path / "built").exists() and not _engine_processes()


def test_the_streams_at_once_are_dealt_over_the_replay_processes():
    from alignatt.evaluate.shards import shares

    assert shares(128, 4) == [32, 32, 32, 32]
    assert shares(5, 2) == [3, 2] and sum(shares(7, 3)) == 7


def test_jobs_replay_longest_first_and_talks_before_sentences():
    from alignatt.evaluate.jobs import by_row, ordered, variant_jobs
    from alignatt.evaluate.testsets import TestPair

    pairs = [TestPair(id=f"s{i}", source=" ".join(["w"] * (2 + i)) + ".", reference="r") for i in range(3)]
    jobs = variant_jobs(["balanced"], ["balanced"], ["gold"], [("gold", "punctuation")], pairs, [pairs], offline=True)
    assert [j.key for j in jobs] == [("balanced", "gold")] * 3 + [("balanced", "gold", "punctuation")] + [("offline",)] * 3
    order = ordered(jobs)
    assert order[0] == 3 and [jobs[j].words for j in order] == sorted((j.words for j in jobs), reverse=True)
    rows = by_row(jobs, {j: f"out{j}" for j in range(len(jobs))})
    assert rows["balanced", "gold"] == ["out0", "out1", "out2"] and rows["offline",] == ["out4", "out5", "out6"]


def test_an_eval_interrupted_while_its_shards_replay_stops_and_reaps_them(test_set, tmp_path):
    from alignatt.evaluate.jobs import Replayer, ordered, variant_jobs
    from alignatt.evaluate.replay import Schedule
    from alignatt.evaluate.shards import replay_in_shards
    from alignatt.evaluate.tails import TailModel
    from alignatt.evaluate.testsets import load_test_set

    pairs = load_test_set(test_set, None).pairs
    jobs = variant_jobs(["balanced"] * 40, [], ["gold"], [], pairs, [], offline=True)  # 246 streams
    replayer = Replayer("en", "de", None, Schedule(), {"gold": TailModel("gold")})
    route = DirectionRoute(model="gemma3-270m", seam="fake", device="cpu")
    specs = engine_specs(WithOptions(record_dir=str(tmp_path)), route, [Head(0, 0)], 2)

    def interrupted(n: int) -> None:
        raise KeyboardInterrupt  # the first stream's end: as a Ctrl-C in the eval's process

    with pytest.raises(KeyboardInterrupt):
        replay_in_shards(specs, jobs, ordered(jobs), replayer, 2, interrupted)
    assert not [p for p in multiprocessing.active_children() if p.name.startswith("alignatt-eval-shard")]
    assert not _engine_processes()
    # stopped: only the streams already running ended (about a dozen drafts, of over 800)
    assert sum(len(words) for words in drafts_by_process(tmp_path).values()) < 100


def test_one_engine_replays_where_alignatt_serve_runs_it():
    """`alignatt serve` runs a vLLM route's one engine on CUDA in a process of its own, so the eval
    replays through an engine process there too (served = scored); elsewhere, or when a protocol
    driver's server must borrow the seam, the seam stays in the eval's process."""
    from alignatt.evaluate.engines import config_notes, own_processes

    vllm = DirectionRoute(model="gemma3-270m", seam="vllm_capture", device="cuda")
    cpu = DirectionRoute(model="gemma3-270m", seam="hf_qk_fast", device="cpu")
    assert own_processes(1, vllm, ["inprocess"])
    assert not own_processes(1, vllm, ["inprocess", "websocket"])
    assert not own_processes(1, cpu, ["inprocess"]) and own_processes(2, cpu, ["inprocess"])
    assert config_notes(1, False) == {} and "process of its own" in config_notes(1, True)["engine_processes"]
