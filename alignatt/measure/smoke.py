"""`alignatt smoke`: the MT server end to end, on loopback, through real WebSocket clients.

Starts the server in-process (loopback, any free port), replays the smoke stream
(`alignatt.replay.stream`) through the `native` client and, when it can be imported, the unmodified
WhisperLiveKit client (`wlk`), and writes a `server_smoke` artifact with provenance. The native
client's numbers are the headline: updates, finals, retractions (must be 0), partial-draft RTT
p50/p95 and the commit-fast-path events with their server-side latency and engine calls; the
WhisperLiveKit run's per-update records (taken server-side) are in `events` with `client: "wlk"`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from alignatt.core.errors import AlignattError
from alignatt.record.artifacts.options import ServedModelOptions, SmokeOptions  # noqa: F401 - the CLI and load import them here
from alignatt.core.progress import timed_bar
from alignatt.replay.events import RunRecord, count_retractions, normalized_erasure, shown_buffer_units_mean
from alignatt.replay.lockstep import replay_native
from alignatt.replay.stream import ends_sentence, load_stream
from alignatt.replay.wlk_client import load_wlk_client, replay_wlk, wlk_available, wlk_version


def percentile(values: list[float], q: float) -> float | None:
    """Linear-interpolated percentile (q in [0, 1]); None for no values."""
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return round(xs[lo] + (xs[hi] - xs[lo]) * (pos - lo), 3)


def _summary(run: RunRecord) -> dict[str, Any]:
    disconnects = sum(1 for e in run.events if e.event == "disconnect")
    ev = [e for e in run.events if e.is_reply]
    partial_drafts = [e for e in ev if e.path == "draft" and not e.final]
    fast = [e for e in ev if e.path == "fast_path"]
    rtt_key = "rtt_ms" if run.client == "native" else "process_ms"  # wlk: the client's process() call
    return {
        "client": run.client,
        "updates": len(ev),
        "finals": sum(1 for e in ev if e.final),
        "errors": sum(1 for e in ev if e.error),
        "disconnects": disconnects,
        "retractions": count_retractions(ev),
        # what the client showed (committed + held draft), in words of the en-de stream's target:
        # the held buffer's mean length per partial and its flicker (Normalized Erasure, Simulstream's);
        # None where the client's events keep no buffer (wlk). Absent from artifacts before them.
        "shown_buffer_words_mean": shown_buffer_units_mean(ev),
        "normalized_erasure": normalized_erasure(ev),
        "partial_drafts": len(partial_drafts),
        "partial_draft_rtt_ms_p50": percentile([getattr(e, rtt_key) for e in partial_drafts], 0.5),
        "partial_draft_rtt_ms_p95": percentile([getattr(e, rtt_key) for e in partial_drafts], 0.95),
        "fast_path_events": len(fast),
        "fast_path_releases": sum(1 for e in fast if e.committed_delta),
        "fast_path_server_ms_p50": percentile([e.server_ms for e in fast], 0.5),
        "fast_path_server_ms_p95": percentile([e.server_ms for e in fast], 0.95),
        "fast_path_engine_calls": sum(e.engine_calls or 0 for e in fast),
        "engine_calls": sum(e.engine_calls or 0 for e in ev),
        "paths": {p: sum(1 for e in ev if e.path == p) for p in sorted({e.path for e in ev if e.path})},
        "wall_s": round(run.wall_s, 2),
        "max_lag_s": round(run.max_lag_s, 2),
    }


def _speech(stream, runs: list[RunRecord], speed: float) -> dict[str, Any] | None:
    """A recognised stream's figures (None for a scripted one): the recogniser's (WER, its tail's
    revisions, its real-time factor) and the caption delay of the lockstep client's committed text."""
    from alignatt.speech.captions import caption_delays

    if not stream.recognised:
        return None
    facts = {k: v for k, v in stream.recognised.items() if k != "word_ends_s"}
    native = next((r for r in runs if r.client == "native"), None)
    ends = stream.recognised.get("word_ends_s") or []
    if native is None or not ends:
        return facts
    delays, uncovered = caption_delays(native.events, ends, speed)
    return {**facts, "caption_delay_s_p50": percentile(delays, 0.5), "caption_delay_s_p95": percentile(delays, 0.95),
            "caption_words": len(delays), "words_never_covered": uncovered}


def run_smoke(options: SmokeOptions, out: str | Path | None = "outputs/server_smoke.json",
              seam_factory=None):
    """Start the server in-process on loopback, replay the stream, write the artifact."""
    from alignatt.record.artifacts import (ARTIFACT_SCHEMA_VERSION, FastPathEvent, ServerSmokeArtifact, SmokeRecord,
                                          write_artifact)
    from alignatt.record.provenance import collect_provenance, model_identity
    from alignatt.serve.server import ServerThread
    from alignatt.serve.config import resolve_preset, server_config
    from alignatt.serve.protocol import ProtocolError

    try:
        preset = resolve_preset(options.preset).name
    except ProtocolError as e:
        raise AlignattError(e.message) from None
    stream = load_stream(options.stream)
    speed = options.speed or stream.replay_speed
    clients = {"native": ["native"], "wlk": ["wlk"], "both": ["native", "wlk"],
               "auto": ["native", "wlk"] if wlk_available() else ["native"]}[options.client]
    if "wlk" in clients:
        load_wlk_client()  # a clear error before loading any model
    # What `alignatt serve` builds from the same options (its served defaults: settling and the
    # engine's own process on CUDA), with one engine whatever the host's GPUs: one client.
    config = server_config(host="127.0.0.1", port=0, model=options.model, seam=options.seam, preset=preset,
                           heads=options.heads, top_k=options.top_k, device=options.device,
                           dtype=options.dtype, vllm_mode=options.vllm_mode, engines=1)
    runs: list[RunRecord] = []
    with ServerThread(config, seam_factory) as handle:
        engine = handle.server.registry.engines[0]
        heads = [[h.layer, h.head] for h in engine.heads]
        replay_s = (len(stream.words) / stream.words_per_second + stream.commit_lag_seconds) / speed
        for client in clients:
            with timed_bar(replay_s, f"smoke: {client} client replays the stream at {speed:g}x"):
                if client == "native":
                    runs.append(replay_native(handle.url, stream, speed, preset))
                else:
                    conn = handle.server.stats.connections + 1
                    log = lambda: handle.call(  # noqa: E731
                        lambda: [s for s in handle.server.step_log if s["connection"] >= conn])
                    runs.append(replay_wlk(handle.url, stream, speed, preset, options.wlk_latency, log))
    summaries = [_summary(r) for r in runs]
    primary, head = runs[0], summaries[0]
    try:
        model_id, revision = model_identity(options.model)
    except Exception:  # identity is best effort (a local path without metadata)
        model_id, revision = options.model, None
    artifact = ServerSmokeArtifact(
        schema_version=ARTIFACT_SCHEMA_VERSION,
        provenance=collect_provenance(model_id=model_id, model_revision=revision),
        config=SmokeRecord(
            **options.model_dump(exclude={"preset", "stream"}), preset=preset,
            stream=options.stream or "alignatt/data/mt_server_smoke_stream.json",
            engine_heads=heads, seam_options=config.directions["en-de"].seam_options,
            # how the server ran it: the served defaults that server_config chose
            settle_buffer_tokens=config.settle_buffer_tokens, engine_process=config.replicas.own_process,
            replay_speed=speed, stream_words=len(stream.words),
            stream_sentences=sum(1 for w in stream.words if ends_sentence(w)),
            words_per_second=stream.words_per_second, commit_lag_seconds=stream.commit_lag_seconds,
            clients=clients, headline_client=primary.client, pacing="lockstep (native)",
            whisperlivekit=wlk_version() if "wlk" in clients else None,
            summaries=summaries, speech=_speech(stream, runs, speed),
        ),
        updates=head["updates"],
        finals=head["finals"],
        retractions=sum(s["retractions"] for s in summaries),
        rtt_ms_p50=head["partial_draft_rtt_ms_p50"],
        rtt_ms_p95=head["partial_draft_rtt_ms_p95"],
        fast_path_events=[
            FastPathEvent(seq=e.seq, utterance_id=e.utterance_id, latency_ms=e.server_ms,
                          engine_calls=e.engine_calls, released_text=e.committed_delta or "")
            for e in primary.events if e.path == "fast_path"
        ],
        events=[e for r in runs for e in r.events],
    )
    if out is not None:
        write_artifact(out, artifact)
    return artifact


def summary_line(artifact) -> str:
    parts = []
    for s in artifact.config.summaries:
        parts.append(
            f"[{s.client}] updates {s.updates}, finals {s.finals}, retractions {s.retractions}, "
            f"errors {s.errors}, disconnects {s.disconnects}; partial-draft RTT p50 {s.partial_draft_rtt_ms_p50} ms / p95 "
            f"{s.partial_draft_rtt_ms_p95} ms; fast path {s.fast_path_events} events, "
            f"{s.fast_path_releases} releases, p50 {s.fast_path_server_ms_p50} ms server-side, "
            f"{s.fast_path_engine_calls} engine calls; engine calls {s.engine_calls}; "
            f"shown buffer {s.shown_buffer_words_mean} words, normalized erasure {s.normalized_erasure}; "
            f"wall {s.wall_s} s, max lag {s.max_lag_s} s"
        )
    speech = artifact.config.speech
    if speech:
        parts.append(f"[speech] recogniser real-time factor {speech.get('real_time_factor')}, committed WER "
                     f"{speech.get('wer_committed')} (live tail {speech.get('wer_tail')}), tail revised in "
                     f"{(speech.get('tail_revisions') or {}).get('revised_share')} of its steps; caption delay "
                     f"p50 {speech.get('caption_delay_s_p50')} s / p95 {speech.get('caption_delay_s_p95')} s over "
                     f"{speech.get('caption_words')} words ({speech.get('words_never_covered')} never covered)")
    return "\n".join(parts)
