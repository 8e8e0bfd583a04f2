"""`alignatt eval --engines N`: the in-process streams spread over N engine processes (stand-in
seams in child processes, on CPU)."""

from __future__ import annotations

import json
import multiprocessing
import os

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


def test_two_engine_processes_replay_what_one_engine_does_and_both_draft(runs):
    (one, one_record, _), (two, two_record, progress) = runs[1], runs[2]
    assert len(two.rows) == 4  # gold, none, offline, under load 2
    assert [_replayed(r) for r in two.rows] == [_replayed(r) for r in one.rows]
    assert set(drafts_by_process(one_record)) == {os.getpid()}  # engines 1: the seam in this process
    by_process = drafts_by_process(two_record)
    assert len(by_process) == 2 and os.getpid() not in by_process and all(by_process.values())
    assert next(m for m in progress if "in-process streams" in m).endswith("(engine limit 1)")
    assert "4 streams at once on 2 engines" in next(m for m in progress if "in-process streams" in m)
    # every engine process was closed and reaped
    assert not _engine_processes() and all(_gone(pid) for pid in by_process)


def test_the_config_records_the_engines(runs):
    one, two = runs[1][0], runs[2][0]
    assert one.config.engines == 1 and one.config.engine_processes is None
    assert "one draft scheduler on the variant's engine" in one.config.concurrent_streams
    assert two.config.engines == 2 and "engine i mod 2" in two.config.engine_processes
    assert "each of the variant's 2 engines" in two.config.concurrent_streams
    assert two.config.under_load.endswith("first engine alone")


def test_streams_are_dealt_over_the_engines_and_the_under_load_rows_run_on_the_first_alone(runs):
    _, record, progress = runs[2]
    (first,), (second,) = process_of(record, "a"), process_of(record, "d")
    assert first != second
    # the rows' streams dealt over both engines (one map, by position: the longest first)
    assert set().union(*(process_of(record, t) for t in TAGS)) == {first, second}
    # under load, sentences a and b on the first engine alone, after everything else there
    words = drafts_by_process(record)[first]
    last_other = max(i for i, w in enumerate(words) if w[0] not in "ab")
    assert {w[0] for w in words[last_other + 1:]} == {"a", "b"}
    load_line = next(m for m in progress if "under load, 2 at once" in m)
    assert "2 streams at once:" in load_line and "engines" not in load_line


@pytest.mark.parametrize("update, says", [
    ({"engines": 2, "concurrency": 1}, "need concurrency > 1"),
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
    assert r.output.startswith("error: engines:") and "concurrency > 1" in r.output
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
    assert message.startswith("stream balanced/gold/s2 failed") and "ValueError: stand-in refuses 'c1'" in message, message
    assert "\n" not in message and not out.exists()
    pids = set(drafts_by_process(record))
    assert len(pids) == 2 and not _engine_processes() and all(_gone(pid) for pid in pids)


def test_an_engine_that_cannot_start_fails_the_eval_and_the_started_one_is_closed(test_set, tmp_path):
    with pytest.raises(RuntimeError, match="cannot load"):
        run_eval(_options(test_set, engines=2), None, seam_factory=WithOptions(fail_first_build=str(tmp_path)),
                 progress=lambda m: None)
    assert (tmp_path / "built").exists() and not _engine_processes()
