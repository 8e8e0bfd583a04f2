"""The served mode's criterion (alignatt/report/served.py): a mode that is served and not bit-identical
with eager is scored when its rows are self-consistent, each batched request reads its own rows, and
it departs from eager no more than eager departs from itself in a batch."""

import copy
from types import SimpleNamespace

from alignatt.report.page import graph_exactness
from alignatt.report.served import served_criterion as judge

PASS = {"passed": True}
CHECK = {
    "fullgraph_vs_eager": {"rows": 48, "identical_drafts": 42, "bit_identical_rows": 42, "max_abs_row_diff": 0.0},
    "self_consistency": {"fullgraph": PASS, "fullgraph_batch": PASS, "eager": PASS},
    "batch": {"fullgraph": {"passed": True},
              "eager": {"passed": True, "requests": [
                  {"tokens": 20, "same_token_prefix": 0},
                  {"tokens": 20, "same_token_prefix": 10, "row_max_abs": 0.004}]}},
}


def inputs(raw, date="2026-12-01"):
    artifact = SimpleNamespace(results={"checks": {"exact_fullgraph": raw}}, provenance=SimpleNamespace(date=date))
    return SimpleNamespace(measurements=[("outputs/h200/vllm_checks_exact_fullgraph.json", artifact)])


def served_criterion(inputs, mode):
    """As the page judges it: on the latest check `graph_exactness` finds for the mode."""
    return judge(graph_exactness(inputs), mode)


def test_a_self_consistent_mode_within_eagers_batch_noise_passes():
    got = served_criterion(inputs(CHECK), "fullgraph")
    assert got["passed"] and got["agreement"] == 42 / 48 and got["band"] == 0.25 and got["row_band"] == 0.004
    assert served_criterion(inputs(CHECK), "cudagraph") is None  # no check of that mode


def test_it_fails_on_rows_that_are_not_the_models_or_on_more_than_eagers_noise():
    broken = copy.deepcopy(CHECK)
    broken["self_consistency"]["fullgraph_batch"] = {"passed": False}
    assert not served_criterion(inputs(broken), "fullgraph")["passed"]
    foreign = copy.deepcopy(CHECK)
    foreign["batch"]["fullgraph"]["passed"] = False  # a batched request read another's q
    assert not served_criterion(inputs(foreign), "fullgraph")["passed"]
    apart = copy.deepcopy(CHECK)
    apart["fullgraph_vs_eager"]["identical_drafts"] = 6  # 12 % of drafts, below eager's own 25 %
    assert not served_criterion(inputs(apart), "fullgraph")["passed"]
    rows = copy.deepcopy(CHECK)
    rows["fullgraph_vs_eager"]["max_abs_row_diff"] = 0.01  # more than eager's rows moved in a batch
    assert not served_criterion(inputs(rows), "fullgraph")["passed"]
    unmeasured = copy.deepcopy(CHECK)
    del unmeasured["batch"]["eager"]  # no band to judge against: not passed
    assert not served_criterion(inputs(unmeasured), "fullgraph")["passed"]
