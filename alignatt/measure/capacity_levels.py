"""One load level summarised: what its speakers saw (RTT, lag and whether it grows, finals in order,
retractions, errors), what each engine did in it (`Engine.stats()` after less before), and how its
updates compare with the same stream served alone, or by the run's first configuration.

Lockstep replays send the same updates in the same order at any load, so updates match by stream
and seq.
"""

from __future__ import annotations

import statistics

from alignatt.measure.smoke import percentile
from alignatt.record.events import ReplayEvent
from alignatt.replay.events import RunRecord, count_retractions
from alignatt.replay.stream import SmokeStream, ends_sentence

LAG_GROWTH_S = 0.25  # last third's mean lag over the first third's beyond this: the lag grows


def _thirds(events: list[ReplayEvent]) -> tuple[list[float], list[float]]:
    lags = [e.lag_s for e in events]
    k = max(len(lags) // 3, 1)
    return lags[:k], lags[-k:]


def _finals_in_order(events: list[ReplayEvent], expected: int) -> tuple[int, bool]:
    finals = [e for e in events if e.final and not e.error]
    ids = [e.utterance_id for e in finals]
    ordered = all(isinstance(a, int) and isinstance(b, int) and b > a for a, b in zip(ids, ids[1:]))
    return len(finals), ordered and len(finals) == expected


def signature(events: list[ReplayEvent]) -> dict[int, tuple]:
    """Per update: its committed text; its decision (path, released text); the buffer it showed."""
    return {e.seq: (e.committed_text, e.path, e.committed_delta, e.buffer_text or "") for e in events}


def summarise_level(n: int, runs: list[RunRecord | BaseException], streams: list[tuple[str, SmokeStream]],
                    wall_s: float, engines_before: list[dict], engines_after: list[dict], server_delta: dict,
                    memory: tuple[float | None, float | None], alone: dict[str, dict[int, tuple]]) -> dict:
    """The `LoadLevel` fields of one level (a dict), from its speakers' records and every engine's
    `Engine.stats()` before and after it."""
    events, errors = [], 0
    retractions = finals_expected = finals_delivered = 0
    in_order = True
    first, last = [], []
    texts_diff = decisions_diff = 0
    compared = False
    stopped_at: list[float] = []
    for i, run in enumerate(runs):
        name, stream = streams[i % len(streams)]
        # a speaker that stopped behind (`stop_lag_s`) is due the finals of the words it committed
        words = stream.words if isinstance(run, BaseException) or run.stopped_at_s is None \
            else stream.words[:run.committed_words]
        expected = sum(1 for w in words if ends_sentence(w))
        finals_expected += expected
        if isinstance(run, BaseException):
            errors += 1
            in_order = False
            continue
        if run.stopped_at_s is not None:
            stopped_at.append(run.stopped_at_s)
        ev = run.events
        events += ev
        errors += sum(1 for e in ev if e.error)
        retractions += count_retractions(ev)
        delivered, ordered = _finals_in_order(ev, expected)
        finals_delivered += delivered
        in_order = in_order and ordered
        a, b = _thirds(ev)
        first += a
        last += b
        if name in alone and n > 1:
            compared = True
            diff = configuration_difference({name: alone[name]}, {name: signature(ev)})
            texts_diff += diff["texts_differing_from_first_configuration"]
            decisions_diff += diff["decisions_differing_from_first_configuration"]
    partial = [e.rtt_ms for e in events if e.path == "draft" and not e.final]
    partial_server = [e.server_ms for e in events if e.path == "draft" and not e.final and e.server_ms is not None]
    finals = [e.rtt_ms for e in events if e.final]
    lag_first = statistics.fmean(first) if first else 0.0
    lag_last = statistics.fmean(last) if last else 0.0
    engines = [engine_level(b, a) for b, a in zip(engines_before, engines_after)]
    sizes: dict[str, int] = {}
    for e in engines:
        for k, v in e["batch_sizes"].items():
            sizes[k] = sizes.get(k, 0) + v
    return dict(
        speakers=n,
        streams=[streams[i % len(streams)][0] for i in range(n)],
        wall_s=round(wall_s, 2),
        updates=len(events),
        partial_drafts=len(partial),
        partial_rtt_ms_p50=percentile(partial, 0.5),
        partial_rtt_ms_p95=percentile(partial, 0.95),
        partial_rtt_ms_p99=percentile(partial, 0.99),
        partial_server_ms_p50=percentile(partial_server, 0.5),
        partial_server_ms_p95=percentile(partial_server, 0.95),
        final_rtt_ms_p50=percentile(finals, 0.5),
        final_rtt_ms_p95=percentile(finals, 0.95),
        lag_s_max=round(max((e.lag_s for e in events), default=0.0), 3),
        lag_s_first_third=round(lag_first, 3),
        lag_s_last_third=round(lag_last, 3),
        lag_grows=lag_last - lag_first > LAG_GROWTH_S or bool(stopped_at),  # stopped: it fell behind
        stopped_speakers=len(stopped_at),
        stopped_at_stream_s=round(min(stopped_at), 1) if stopped_at else None,
        fast_path_events=sum(1 for e in events if e.path == "fast_path"),
        engine_steps=sum(e["steps"] if e["child_steps"] is None else e["child_steps"] for e in engines),
        engine_batch_sizes=dict(sorted(sizes.items(), key=lambda kv: int(kv[0]))),
        engines=engines,
        superseded=server_delta.get("coalesced", 0),
        peak_gpu_memory_mib=memory[0],
        gpu_memory_used_mib=memory[1],
        retractions=retractions,
        finals_expected=finals_expected,
        finals_delivered=finals_delivered,
        finals_in_order=in_order,
        error_frames=errors,
        texts_differing_from_alone=texts_diff if compared else None,
        decisions_differing_from_alone=decisions_diff if compared else None,
    )


# What each front end counts of an engine it shares with the others (`serve.front_ends`) adds up; what
# the engine's process reports as of its last reply (its steps, time, seam's parts, collector) is one
# figure, the latest of which the front end that heard last holds.
_ENGINE_WIDE = ("child_steps", "child_drafts", "child_step_s", "child_cpu_s", "child_gc_s")


def merge_front_ends(stats: list[dict]) -> list[dict]:
    """`Engine.stats` entries as each front end drives an engine, one per engine (by name): counters,
    times and batch sizes summed (steps: those each front end took part in; batch sizes: each one's
    own drafts at them), the engine process's own figures taken once (`child_steps`: its real steps).
    One front end's entries come back as they are."""
    merged: dict[str, dict] = {}
    for entry in stats:
        entry = {k: v for k, v in entry.items() if k != "front_end"}
        into = merged.get(entry["engine"])
        if into is None:
            merged[entry["engine"]] = entry
            continue
        for key, value in entry.items():
            if key == "batch_sizes":
                into[key] = {k: into[key].get(k, 0) + value.get(k, 0) for k in {*into[key], *value}}
            elif key == "step_phases_s":
                into[key] = {k: max((into.get(key) or {}).get(k, 0.0), v) for k, v in (value or {}).items()}
            elif key in _ENGINE_WIDE:
                into[key] = max(into.get(key, 0.0), value)
            elif isinstance(value, (int, float)) and not isinstance(value, bool) and key not in ("pid", "max_batch"):
                into[key] = into.get(key, 0) + value
    return list(merged.values())


def engine_level(before: dict, after: dict) -> dict:
    """One engine's `LoadEngine` fields over a level: what `Engine.stats()` counted in between."""
    sizes_before = before.get("batch_sizes", {})
    sizes = {k: v - sizes_before.get(k, 0) for k, v in after.get("batch_sizes", {}).items()}
    steps = after.get("steps", 0) - before.get("steps", 0)
    finished = after.get("finished", 0) - before.get("finished", 0)

    def per(key: str, count: int) -> float | None:
        """The level's growth of `key` per step or per draft, in ms (None: none counted)."""
        if not count or key not in after:
            return None
        return round((after[key] - before.get(key, 0.0)) / count * 1e3, 3)

    # An engine in its own process counts its real steps: with several front ends, one of them serves
    # every front end's waiting drafts, and the child's figures are per such step.
    child_steps = after["child_steps"] - before.get("child_steps", 0) if "child_steps" in after else None
    own_steps = steps if child_steps is None else child_steps
    child_drafts = after.get("child_drafts", 0) - before.get("child_drafts", 0)
    phases_before = before.get("step_phases_s") or {}
    phases = {k: round((v - phases_before.get(k, 0.0)) / own_steps * 1e3, 3)
              for k, v in (after.get("step_phases_s") or {}).items()} if own_steps else {}
    return dict(
        engine=str(after.get("engine")),
        gpu=after.get("gpu"),
        alive=bool(after.get("alive", True)),
        sessions=after.get("admitted", 0) - before.get("admitted", 0),
        steps=steps,
        batch_sizes={k: v for k, v in sorted(sizes.items(), key=lambda kv: int(kv[0])) if v},
        step_ms_mean=per("step_s", steps),
        step_cpu_ms_mean=per("step_cpu_s", steps),
        child_steps=child_steps,
        child_batch_mean=round(child_drafts / child_steps, 2) if child_steps else None,
        child_step_ms_mean=per("child_step_s", own_steps),
        child_cpu_ms_mean=per("child_cpu_s", own_steps),
        gc_ms_mean=per("gc_s", steps),
        child_gc_ms_mean=per("child_gc_s", own_steps),
        step_phase_ms=phases or None,
        draft_queued_ms_mean=per("queued_s", finished),
        draft_in_engine_ms_mean=per("in_engine_s", finished),
        failed=after.get("failed", 0) - before.get("failed", 0),
    )


def configuration_difference(reference: dict[str, dict], other: dict[str, dict]) -> dict:
    """How one speaker alone is served by another configuration than the first (verification on
    against off, say), or a speaker under load against the same stream alone (`summarise_level`):
    updates whose committed text differs, whose path or released text differs,
    and whose shown buffer differs (a settled draft shows a shorter one by design), with the mean
    words of buffer each configuration showed, matched by stream and seq (a lockstep replay sends
    the same updates in the same order)."""
    texts = decisions = buffers = compared = 0
    words, reference_words = [], []
    for name, sigs in other.items():
        ref = reference.get(name, {})
        for seq, sig in sigs.items():
            want = ref.get(seq)
            if want is None:
                continue
            compared += 1
            texts += sig[0] != want[0]
            decisions += sig[1:3] != want[1:3]
            buffers += sig[3] != want[3]
            words.append(len(sig[3].split()))
            reference_words.append(len(want[3].split()))
    mean = (lambda xs: round(statistics.fmean(xs), 2) if xs else None)  # noqa: E731
    return {"updates_compared_with_first_configuration": compared,
            "texts_differing_from_first_configuration": texts,
            "decisions_differing_from_first_configuration": decisions,
            "buffers_differing_from_first_configuration": buffers,
            "buffer_words_mean": mean(words),
            "first_configuration_buffer_words_mean": mean(reference_words)}


def level_line(level: dict) -> str:
    mode = f"[{level['vllm_mode']}] " if level.get("vllm_mode") else ""
    return (f"{mode}N={level['speakers']}: partial RTT p50 {level['partial_rtt_ms_p50']} / p95 {level['partial_rtt_ms_p95']}"
            f" / p99 {level['partial_rtt_ms_p99']} ms, final p95 {level['final_rtt_ms_p95']} ms, lag max "
            f"{level['lag_s_max']} s ({'growing' if level['lag_grows'] else 'not growing'})"
            + (f", {level['stopped_speakers']} speakers stopped behind (the first at {level['stopped_at_stream_s']} s "
               "of stream)" if level.get("stopped_speakers") else "")
            + ", retractions "
            f"{level['retractions']}, finals {level['finals_delivered']}/{level['finals_expected']}"
            f"{' in order' if level['finals_in_order'] else ' NOT all in order'}, errors {level['error_frames']}, "
            f"batch sizes {level['engine_batch_sizes']}"
            + (f", GPU busy {level['gpu_busy_share']:.0%}" if level.get("gpu_busy_share") is not None else "")
            + (f", host CPU busy {level['host_cpu_busy_share']:.0%} (steal {level['host_cpu_steal_share']:.1%})"
               if level.get("host_cpu_busy_share") is not None else "")
            + (f", server loop CPU {level['server_loop_cpu_share']:.1%} of a core (process "
               f"{level['server_process_cpu_cores']:.2f} cores)" if level.get("server_loop_cpu_share") is not None else "")
            + (f", threads {level['server_thread_cpu_cores']}" if level.get("server_thread_cpu_cores") else "")
            + (f", other front ends {level['front_end_cpu_cores']} cores" if level.get("front_end_cpu_cores") else "")
            + (f", partial in server p50 {level['partial_server_ms_p50']} / p95 {level['partial_server_ms_p95']} ms"
               if level.get("partial_server_ms_p50") is not None else "")
            + "".join(f", engine {e['engine']} step {e['step_ms_mean']} ms (CPU {e['step_cpu_ms_mean']}"
                      + (f"; child {e['child_step_ms_mean']}, CPU {e['child_cpu_ms_mean']}"
                         if e.get("child_step_ms_mean") is not None else "")
                      + (f", {e['child_steps']} steps of {e['child_batch_mean']} drafts"
                         if e.get("child_batch_mean") is not None else "")
                      + (f"; GC {e['gc_ms_mean']}" if e.get("gc_ms_mean") is not None else "")
                      + (f", child GC {e['child_gc_ms_mean']}" if e.get("child_gc_ms_mean") is not None else "")
                      + (f"; parts {e['step_phase_ms']}" if e.get("step_phase_ms") else "")
                      + (f"; per draft queued {e['draft_queued_ms_mean']}, in engine {e['draft_in_engine_ms_mean']} ms)"
                         if e.get("draft_in_engine_ms_mean") is not None else ")")
                      for e in level.get("engines", []) if e.get("step_ms_mean") is not None))
