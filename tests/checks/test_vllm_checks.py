"""The CPU-runnable parts of the vLLM capture checks: draft comparisons, the self-consistency
verdicts (incl. "degenerate activations"), draft variety, check selection per part, and clean
refusals where CUDA or vLLM is missing. (Cross-engine parity: tests/checks/test_vllm_parity.py.)"""

import json

import numpy as np
import pytest
import torch

from alignatt.core.draft import Head
from alignatt.core.errors import AlignattError
from typer.testing import CliRunner

from alignatt.cli import app
from alignatt.checks.compare import compare_batch, compare_drafts, timing_summary
from alignatt.checks.vllm_checks import ALL_CHECKS, PARTS, ChecksOptions, select_checks, summary_word
from alignatt.checks.messages import WorkerResult, WorkerSpec
from alignatt.checks.records import BATCH_IDS, draft_record, draft_variety, identity_probe, summarize_consistency
from tests.support.drafts import make_draft


def _record(pid, draft, repeat=0):
    return draft_record(pid, repeat, draft, decision_heads=2)


def test_compare_drafts_counts_identical_rows_and_names_differences():
    words = "a b c d".split()
    d1 = make_draft(words, [" x", " y", " z"], [0, 1, 2], committed_words=2)
    d2 = make_draft(words, [" x", " y", " z"], [0, 1, 2], committed_words=2)
    d3 = make_draft(words, [" x", " y", " z"], [0, 3, 2], committed_words=2)  # attends to the tail
    a = [_record("p1", d1), _record("p2", d2)]
    b = [_record("p1", d2), _record("p2", d3)]
    cmp = compare_drafts(a, b)
    assert cmp["rows"] == 2 and cmp["identical_drafts"] == 2
    assert cmp["bit_identical_rows"] == 1 and cmp["identical_decisions"] == 1
    assert cmp["differing"] == ["p2#0: decision"]
    assert cmp["max_abs_row_diff"] > 0


def test_compare_batch_wants_each_requests_own_rows():
    words = "a b c d".split()
    alone = [_record("p1", make_draft(words, [" x", " y"], [0, 1])),
             _record("p2", make_draft(words, [" u", " v"], [2, 3]))]
    ok = compare_batch([_record("p1", make_draft(words, [" x", " y"], [0, 1]), -1)], alone)
    assert ok["passed"] and ok["requests"][0]["aligned_agreement"] == 1.0
    swapped = [_record("p1", make_draft(words, [" x", " y"], [2, 3]), -1)]  # p2's attention
    assert not compare_batch(swapped, alone)["passed"]


def test_compare_batch_judges_identity_by_q_and_keys_when_numerics_part_the_drafts():
    from types import SimpleNamespace

    g = np.random.default_rng(0)
    words = "a b c d".split()

    def raw(q, keys):  # a RawCapture-like object: shallowest layer 5 (full: keys from position 0)
        return SimpleNamespace(layers={5: {"q": q, "keys": keys, "key_lo": 0}, 11: {"q": q, "keys": keys, "key_lo": 0}})

    q1, k1 = g.standard_normal((2, 2, 16)), g.standard_normal((12, 2, 16))  # request p1: 2 tokens, 10-token prompt
    q2, k2 = g.standard_normal((2, 2, 16)), g.standard_normal((12, 2, 16))
    alone = _record("p1", make_draft(words, [" x", " y"], [0, 1]))
    alone["probe"] = identity_probe(raw(q1, k1), 10)
    assert alone["probe"]["layer"] == 5 and alone["probe"]["keys"].shape == (10, 2, 16)

    # batched: other numerics -> another second token and other rows, but its own q and keys
    parted = _record("p1", make_draft(words, [" x", " z"], [1, 2]), -1)
    parted["token_ids"][1] = 999
    parted["probe"] = identity_probe(raw(q1 + 1e-3 * g.standard_normal(q1.shape), k1), 10)
    res = compare_batch([parted], [alone])
    entry = res["requests"][0]
    assert res["passed"] and entry["same_token_prefix"] == 1 and entry["q0_min_cos"] > 0.99
    assert not entry["bit_identical_on_prefix"]

    # batched with the other request's q (a slot mix-up) or keys (a block-table mix-up): not its own
    for q, k in ((q2, k1), (q1, k2)):
        mixed = _record("p1", make_draft(words, [" x", " y"], [0, 1]), -1)
        mixed["probe"] = identity_probe(raw(q, k), 10)
        assert not compare_batch([mixed], [alone])["passed"]


def test_timing_summary_defines_per_token_once():
    d = make_draft("a b".split(), [" x", " y", " z"], [0, 1, 1])
    d.timings.prefill_ms, d.timings.decode_ms, d.timings.capture_ms, d.timings.reconstruct_ms = 30, 20, 3, 7
    s = timing_summary([_record("p", d)])
    assert s["per_token_ms"] == 20.0 and s["decode_ms_per_token"] == 10.0
    assert s["fetch_ms"] == 3 and s["reconstruct_ms"] == 7


def test_self_consistency_passes_live_outputs_and_names_degenerate_ones():
    g = torch.Generator().manual_seed(0)
    live = torch.randn(20, 2, 256, generator=g)  # unit-RMS outputs, like Gemma-4's normed values
    own = {5: [live.to(torch.bfloat16).float()], 6: [live * 1e-12]}  # layer 6: the dummy weights' ~0
    rebuilt = {5: [live], 6: [live * 1e-12]}
    res = summarize_consistency(own, rebuilt)
    assert res["layers"]["5"]["status"] == "passed" and res["layers"]["5"]["max_rel_err"] < 0.01
    assert res["layers"]["6"]["status"] == "degenerate activations" and res["layers"]["6"]["live_rows"] == 0
    assert res["status"] == "degenerate activations" and not res["passed"] and res["degenerate_layers"] == [6]
    assert summary_word({"passed": False, "degenerate": ["compiled"]}) == "failed (degenerate activations)"

    wrong = summarize_consistency({5: [live.roll(1, dims=0)]}, {5: [live]})  # another token's output
    assert wrong["status"] == "failed" and wrong["layers"]["5"]["min_cos"] < 0.5
    assert summarize_consistency({5: [live]}, {5: [live]})["passed"]


def test_draft_variety_flags_one_token_over_and_over():
    pads = [{"token_ids": [0] * 20} for _ in range(3)]
    assert draft_variety(pads)["degenerate"] and draft_variety(pads)["distinct_tokens"] == 1
    text = [{"token_ids": list(range(i, i + 20))} for i in range(3)]
    v = draft_variety(text)
    assert not v["degenerate"] and v["distinct_tokens"] == 22 and v["tokens"] == 60
    assert draft_variety([])["degenerate"]


def test_the_two_parts_cover_every_check_once():
    a, b = select_checks("all", "", "a"), select_checks("all", "", "b")
    assert sorted(a + b) == sorted(ALL_CHECKS) and not set(a) & set(b)
    assert a[0] == "demo" and b[0] == "compiled"  # part b compares with part a's eager drafts
    assert select_checks("all", "", None) == list(ALL_CHECKS)
    assert select_checks("all", "exact,parity", None) == ["exact", "parity"]
    assert select_checks("parity", "", None) == ["parity"]
    for bad in (("all", "exact", "a"), ("parity", "", "a"), ("all", "exact,bogus", None)):
        with pytest.raises(ValueError):
            select_checks(*bad)
    assert set(PARTS) == {"a", "b"}


def test_demo_check_writes_its_artifact_without_cuda(tmp_path):
    out = tmp_path / "checks.json"
    rc = CliRunner().invoke(app, ["check-vllm", "demo", "--out", str(out), "--workdir", str(tmp_path / "w")]).exit_code
    data = json.loads(out.read_text())
    assert data["kind"] == "measurement" and data["name"] == "vllm_checks"  # the shared schema
    demo = data["results"]["checks"]["demo"]
    assert demo["cpu_replayed"]["fixed"]["ok"] and not demo["cpu_replayed"]["naive_list"]["ok"]
    if not torch.cuda.is_available():
        assert rc == 1 and data["checks"] == [{"name": "demo", "passed": False, "detail": "failed"}]
        assert "no CUDA" in demo["note"]
    assert "provenance" in data


def test_unknown_check_names_are_refused(tmp_path):
    for args in (["all", "--only", "demo,bogus"], ["bogus"], ["all", "--part", "c"]):
        result = CliRunner().invoke(app, ["check-vllm", *args, "--out", str(tmp_path / "x.json")])
        assert result.exit_code == 2 and result.output.startswith("error: ")
        assert not (tmp_path / "x.json").exists()  # nothing half-written


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_vllm_seam_refuses_cleanly_without_cuda():
    from alignatt.capture.registry import make_seam
    from alignatt.capture.vllm.seam import VllmCaptureSeam

    with pytest.raises(AlignattError, match="CUDA"):
        make_seam("vllm_capture", model="gemma4-e4b-synthetic", heads=[Head(11, 3)], vllm_mode="cudagraph")
    with pytest.raises(AlignattError, match="CUDA"):
        VllmCaptureSeam("gemma4-e4b-synthetic", [Head(11, 3)])
    with pytest.raises(AlignattError, match="unknown vllm_mode"):
        VllmCaptureSeam("gemma4-e4b-synthetic", [Head(11, 3)], vllm_mode="turbo")


def test_parent_side_of_every_check_with_stand_in_workers(monkeypatch, tmp_path):
    """The checks' own logic (what they ask of workers, how they judge and write the artifact)
    with workers replaced by stand-ins shaped like the real ones' results."""
    import pickle

    import alignatt.checks.vllm_checks as vc

    words = "a b c d".split()
    live = torch.randn(40, 1, 64)
    good = summarize_consistency({5: [live]}, {5: [live]})
    asked = []

    def drafts(n_repeats):
        recs = []
        for rep in range(n_repeats):
            for i in range(16):
                r = _record(f"p{i}" if i >= 3 else BATCH_IDS[i], make_draft(words, [" x", " y"], [i % 4, 1]), rep)
                r["token_ids"] = [7 + i, 9]
                r["timings"] = {"prefill_ms": 30.0, "decode_ms": 5.0, "capture_ms": 1.0, "reconstruct_ms": 2.0}
                recs.append(r)
        return recs

    def fake_run_worker(spec: WorkerSpec, workdir, timeout_s) -> WorkerResult:
        asked.append((spec.name, spec.mode, spec.dtype, spec.env.get("TRITON_F32_DEFAULT"),
                      spec.kv_cache_memory_gib, spec.capture_output, spec.quantization))
        if spec.task == "drafts":
            res = WorkerResult(ok=True, describe={"vllm_mode": spec.mode}, tokenizer="t", drafts=drafts(spec.repeats))
            if spec.capture_output:
                res.self_consistency = good
            if spec.batch_check:
                res.batch = [dict(r, repeat=-1) for r in res.drafts[:3]]
                res.batch_self_consistency = good
            return res
        if spec.task == "parity_vllm":
            res = WorkerResult(ok=True, runs=[{"id": "p3", "token_ids": [1, 2]}], self_consistency=good,
                               describe={}, checkpoint={}, triton_f32_default=spec.env.get("TRITON_F32_DEFAULT"))
            (workdir / f"{spec.name}.pkl").write_bytes(pickle.dumps(res))
            return res
        assert spec.task == "parity_hf" and spec.vllm_fp32 and spec.vllm_bf16
        return WorkerResult(ok=True, fp32={"passed": True, "layers": {}}, bf16={"layers": {}}, hf_qk_fast_seam={})

    monkeypatch.setattr(vc, "run_worker", fake_run_worker)
    args = ChecksOptions(workdir=str(tmp_path / "w"), tokens=20, repeats=3, tokenizer="auto", budget_s=1e9,
                              worker_timeout=1.0, worker_timeout_compiled=1.0)
    out = tmp_path / "a.json"
    checks = ["exact", "parity", "speed", "compiled_reduced", "compiled", "exact_fullgraph", "fp8"]
    art = vc.run_checks(checks, out, args)
    assert art["summary"] == {c: "passed" for c in checks}, json.dumps(art["checks"], indent=1, default=str)
    data = json.loads(out.read_text())["results"]
    assert data["checks"]["exact"]["cudagraph_vs_eager"]["bit_identical_rows"] == 48
    assert data["checks"]["compiled"]["compiled_vs_eager"]["rows"] == 48  # read part a's eager drafts
    assert data["checks"]["compiled_reduced"]["compiled"]["identical_drafts_vs_eager"] == "1/1"
    # the strict parity run is fp32 with IEEE Triton dots; both E4B exact runs keep the attention output
    assert ("parity_vllm_fp32", "eager", "float32", "ieee", 0.5, False, None) in asked
    # FP8 weights run the served mode, quantized, and are held to self-consistency beside eager's drafts
    assert ("fp8", "fullgraph", "bfloat16", None, asked[-1][4], True, "fp8") == asked[-1]
    assert data["checks"]["fp8"]["fp8_vs_eager"]["rows"] == 48
    assert [a[:2] for a in asked if a[0].startswith("exact_")] == [
        ("exact_eager", "eager"), ("exact_cudagraph", "cudagraph"), ("exact_fullgraph", "fullgraph")]
    assert all(a[5] for a in asked if a[0].startswith("exact_"))
    # the served mode is held to the same bit-for-bit rule, against exact's eager drafts
    assert data["checks"]["exact_fullgraph"]["fullgraph_vs_eager"]["bit_identical_rows"] == 48
    assert data["checks"]["exact_fullgraph"]["eager"]["source"].startswith("from the exact check")
    # alone (a fresh work dir), it drafts eager itself
    asked.clear()
    alone = vc.run_checks(["exact_fullgraph"], tmp_path / "c.json", args.model_copy(update={"workdir": str(tmp_path / "w2")}))
    assert alone["summary"] == {"exact_fullgraph": "passed"}
    assert [a[0] for a in asked] == ["exact_eager", "exact_fullgraph"]

    # degenerate activations fail loudly, by name
    bad = summarize_consistency({5: [live * 1e-12]}, {5: [live * 1e-12]})
    good.update(bad)
    art = vc.run_checks(["exact"], tmp_path / "b.json", args)
    assert art["summary"]["exact"] == "failed (degenerate activations)"
