"""`alignatt eval --settle-buffer-tokens`: the eval drafts as `alignatt serve` settles drafts, and says so."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

pytest.importorskip("omnisteval")

from alignatt.cli import app  # noqa: E402
from alignatt.core.draft import DraftRequest  # noqa: E402
from alignatt.core.policy import PolicyConfig  # noqa: E402
from alignatt.core.settle import SETTLED, cut, rule_for  # noqa: E402
from alignatt.evaluate.outputs import not_served_default, report_section, scored_configuration  # noqa: E402
from alignatt.evaluate.run import EvalOptions, run_eval  # noqa: E402
from alignatt.evaluate.variant import variant_settle  # noqa: E402
from alignatt.record.artifacts import EvalArtifact, load_artifact  # noqa: E402
from alignatt.serve.config import SERVED_SETTLE_BUFFER_TOKENS  # noqa: E402
from tests.fakes.batch_fakes import StandInBatchSeam  # noqa: E402
from tests.fakes.mt_fakes import FakeSeam  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
# Every in-process stream kind: sentences with a tail (drafts that hold tokens), a talk, offline.
OPTIONS = dict(limit=3, max_source_words=10, presets=["balanced"], tails=["gold"], longform_talks=1,
               longform_max_pairs=2, bootstrap=10, variants=["vllm_capture"])


class SettlingSeam(FakeSeam):
    """A stand-in for vllm_capture's settling: a draft with a settle rule stops where its answer is
    known (`core.settle.cut`), as the engine stops it; it counts the tokens it drafted."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.drafted = 0

    def draft(self, request):
        d = cut(super().draft(request))
        with self._lock:
            self.drafted += len(d.tokens)
        return d


def _run(settle, concurrency=1, **update):
    seam = SettlingSeam()
    engine = seam
    if concurrency > 1:  # the draft scheduler over a batching engine, as `alignatt serve` drafts
        engine = StandInBatchSeam(max_batch=8)
        engine.inner = seam
    options = EvalOptions(**{**OPTIONS, **update}, concurrency=concurrency, settle_buffer_tokens=settle)
    artifact = run_eval(options, None, seam_factory=lambda route, heads: engine, progress=lambda m: None)
    return artifact, seam


def test_auto_resolves_as_serve_does_whole_drafts_on_cpu():
    assert EvalOptions().settle_buffer_tokens == "auto"
    assert variant_settle(EvalOptions(), "hf_qk_fast") is None
    assert variant_settle(EvalOptions(device="cpu"), "vllm_capture") is None  # CPU: serve drafts whole
    assert variant_settle(EvalOptions(device="cuda"), "vllm_capture") == SERVED_SETTLE_BUFFER_TOKENS
    assert variant_settle(EvalOptions(device="cuda"), "hf_qk_fast") is None
    assert variant_settle(EvalOptions(device="cuda", settle_buffer_tokens="none"), "vllm_capture") is None
    assert variant_settle(EvalOptions(settle_buffer_tokens="3"), "hf_qk_fast") == 3
    for bad in ("-1", "two"):
        with pytest.raises(ValueError, match="settle_buffer_tokens"):
            EvalOptions(settle_buffer_tokens=bad)


@pytest.mark.parametrize("concurrency", [1, 2])
def test_n_reaches_every_session_and_stops_drafts_where_serve_would(concurrency):
    extra = {"load_levels": [2], "load_sentences": 2} if concurrency > 1 else {}
    whole, whole_seam = _run("none", concurrency, **extra)
    settled, seam = _run(0, concurrency, **extra)
    partials = [r for r in seam.requests if not r.final]
    assert partials and all(r.settle is not None and r.settle.buffer_tokens == 0 for r in partials)
    assert all(r.settle is None for r in seam.requests if r.final)  # a final is never settled, as in serve
    assert all(r.settle is None for r in whole_seam.requests)
    # settling stopped drafts early: fewer tokens drafted, and some drafts ended `settled`
    assert seam.drafted < whole_seam.drafted
    # what the client is shown as committed does not change (settle.py); only the buffer is shorter
    assert [r.hypotheses for r in settled.rows] == [r.hypotheses for r in whole.rows]
    kinds = {(r.form, r.role, r.preset) for r in settled.rows}
    assert ("longform", "quality", "balanced") in kinds and ("sentence", "quality", "offline") in kinds
    if concurrency > 1:
        assert ("sentence", "under_load", "balanced") in kinds
    assert settled.config.scored_settle_buffer_tokens == 0 and whole.config.scored_settle_buffer_tokens is None


def test_the_stand_in_stops_a_draft_where_its_answer_is_known():
    request = DraftRequest(source_words=["a", "b", "c", "d"], committed_words=1, target_prefix="", max_new_tokens=16,
                           source_lang="en", target_lang="de", settle=rule_for(PolicyConfig(), 0))
    d = SettlingSeam().draft(request)
    assert d.stop_reason == SETTLED and len(d.tokens) < 4


@pytest.mark.filterwarnings("ignore:connect\\(\\) must be used:DeprecationWarning")
def test_the_websocket_driver_drafts_through_a_server_that_settles(tmp_path):
    artifact, seam = _run(1, drivers=["inprocess", "websocket"], longform_talks=0, offline_baseline=False, limit=2)
    by_thread = [r for r in seam.requests if not r.final]
    assert by_thread and all(r.settle is not None and r.settle.buffer_tokens == 1 for r in by_thread)
    assert all(c.passed for c in artifact.checks), artifact.checks  # in-process = WebSocket emissions


def test_the_recorded_configuration_round_trips_and_the_page_says_what_was_scored(tmp_path):
    out = tmp_path / "outputs" / "eval.json"
    options = EvalOptions(**{**OPTIONS, "longform_talks": 0}, settle_buffer_tokens=2)
    run_eval(options, out, seam_factory=lambda route, heads: SettlingSeam(), progress=lambda m: None)
    loaded = load_artifact(out)
    assert isinstance(loaded, EvalArtifact)
    cfg = loaded.config
    assert (cfg.scored_settle_buffer_tokens, cfg.settle_buffer_tokens) == (2, 2)
    assert cfg.served_settle_buffer_tokens == {"vllm_capture": None}  # on the CPU serve drafts whole
    # the recorded option runs the same drafts again
    assert variant_settle(EvalOptions(settle_buffer_tokens=cfg.settle_buffer_tokens), "vllm_capture") == 2
    (section,) = report_section(tmp_path, [("outputs/eval.json", loaded)])
    assert section["scored"] == "drafts settled 2 tokens past the first held token"
    assert section["not_served"]  # settled on the CPU, where serve drafts whole
    # on CUDA, vllm_capture: 2 is the served default, whole drafts are not; auto records what it resolved to
    gpu = cfg.model_copy(update={"device": "cuda"})
    assert not not_served_default(gpu, "NVIDIA H200")
    assert not_served_default(gpu.model_copy(update={"scored_settle_buffer_tokens": None}), "NVIDIA H200")
    mixed = gpu.model_copy(update={"variants": ["vllm_capture", "hf_qk_fast"],
                                   "scored_settle_buffer_tokens": {"vllm_capture": 2, "hf_qk_fast": None}})
    assert not not_served_default(mixed, "NVIDIA H200")
    assert scored_configuration(mixed) == ("vllm_capture: drafts settled 2 tokens past the first held token; "
                                           "hf_qk_fast: whole drafts (max_new_tokens)")


def test_the_cli_passes_the_option_and_refuses_a_bad_one(tmp_path):
    out = tmp_path / "e.json"
    r = CliRunner().invoke(app, ["eval", "--settle-buffer-tokens", "soon", "--out", str(out)])
    assert r.exit_code == 2 and "settle_buffer_tokens" in r.output and not out.exists()


@pytest.mark.parametrize("path", sorted(p.relative_to(ROOT).as_posix() for folder in ("h200", "cpu")
                                        for p in (ROOT / "outputs" / folder).glob("eval*.json")
                                        if not p.name.endswith("_metrics.json")))
def test_committed_eval_artifacts_still_load_and_say_what_they_scored(path):
    artifact = load_artifact(ROOT / path)
    (section,) = report_section(ROOT, [(path, artifact)])
    settle = artifact.config.scored_settle_buffer_tokens
    assert section["scored"] == ("whole drafts (max_new_tokens)" if settle is None
                                 else f"drafts settled {settle} tokens past the first held token")
    on_gpu_vllm = bool(artifact.provenance.gpu_name) and any(
        str(v).startswith("vllm_capture") for v in artifact.config.variants)
    # whole drafts on the CPU are what serve serves there; on CUDA vllm_capture it settles 2 tokens
    assert section["not_served"] == (on_gpu_vllm and settle != SERVED_SETTLE_BUFFER_TOKENS)


def test_the_headline_quality_line_says_when_the_eval_did_not_score_the_served_default(tmp_path):
    """The page's first lines score what the server serves, or say they do not (the brief)."""
    import shutil

    import yaml

    from alignatt.report.headline import headline
    from alignatt.report.inputs import collect_inputs

    root = Path(__file__).resolve().parents[2]
    (tmp_path / "outputs" / "h200").mkdir(parents=True)
    shutil.copy(root / "outputs" / "h200" / "eval.json", tmp_path / "outputs" / "h200" / "eval.json")
    (tmp_path / "outputs" / "published").mkdir()
    params = yaml.safe_load((root / "params.yaml").read_text())

    def quality_line() -> str:
        return next(i["result"] for i in headline(collect_inputs(tmp_path, params)) if i["what"].startswith("Quality"))

    assert "not the served default" not in quality_line()  # drafts settled as served, on the H200
    path = tmp_path / "outputs" / "h200" / "eval.json"
    data = json.loads(path.read_text())
    data["config"]["settle_buffer_tokens"] = None  # as if run with --settle-buffer-tokens none
    data["config"]["scored_settle_buffer_tokens"] = None
    path.write_text(json.dumps(data))
    assert "not the served default" in quality_line()
