"""The failover artifact from what `alignatt failover` saw (`options`: its FailoverOptions): per session, the faults, /health, checks.

A speaker's loss is put down to the latest fault before it. The bounds checked: a killed engine's
sessions are told within `KILL_NOTICE_S`; a stopped one's within `step_deadline_s + heartbeat_s +
NOTICE_SLACK_S` (the watcher notices a call outstanding past the deadline, checking every
heartbeat; then the kill and the frames).
"""

from __future__ import annotations

from typing import Any

from alignatt.models.presets import SYNTHETIC_REVISION

from alignatt.record.artifacts import ARTIFACT_SCHEMA_VERSION, Check, FailoverArtifact, FailoverSession
from alignatt.measure.failover_client import SpeakerRecord

KILL_NOTICE_S = 3.0  # a killed engine: its pipe closes at once; room for the join and the close frame
NOTICE_SLACK_S = 3.0  # a stopped engine: past step_deadline_s + heartbeat_s, the kill and the frames


def _fault_before(faults: list[dict], t: float) -> dict | None:
    earlier = [f for f in faults if f["t"] <= t and f["pid"] is not None]
    return max(earlier, key=lambda f: f["t"]) if earlier else None


def session_of(record: SpeakerRecord, faults: list[dict]) -> tuple[FailoverSession, list[tuple[dict, float, float | None]]]:
    """The artifact's view of one speaker, and per loss (its fault, notice delay, resume delay)."""
    losses = []
    for i, lost in enumerate(record.lost_at):
        fault = _fault_before(faults, lost)
        resumed = record.resumed_at[i] if i < len(record.resumed_at) else None
        if fault is not None:
            losses.append((fault, lost - fault["t"], None if resumed is None else resumed - fault["t"]))
    lost_texts, texts = 0, []
    for snapshot in record.shown_at_notice:
        for uid, before in snapshot.items():
            final = record.finals.get(uid)
            if before and (final is None or not final.startswith(before)):
                lost_texts += 1
        if snapshot:
            uid = max(snapshot)
            texts.append({"utterance_id": uid, "shown_before_loss": snapshot[uid], "final": record.finals.get(uid)})
    notice = [d for _, d, _ in losses]
    resumed = [r for _, _, r in losses if r is not None]
    return FailoverSession(
        speaker=record.speaker, connections=record.connections, losses=len(record.lost_at),
        utterances=record.utterances, finals_delivered=sum(1 for u in range(record.utterances) if u in record.finals),
        retractions=record.retractions, committed_lost=lost_texts,
        notice_after_fault_s=round(max(notice), 3) if notice else None,
        resumed_after_fault_s=round(max(resumed), 3) if resumed else None,
        final_wait_s_max=round(max(record.final_waits), 3) if record.final_waits else None,
        refused=record.refused[:20], error=record.error, texts=texts,
    ), losses


def failover_artifact(options: Any, load_s: float, t0: float, faults: list[dict],
                      records: list[SpeakerRecord], samples: list[dict], engines_before: list[dict],
                      engines_after: list[dict]) -> FailoverArtifact:
    from alignatt.record.provenance import collect_provenance, model_identity

    bounds = {"kill": KILL_NOTICE_S, "stop": options.step_deadline_s + options.heartbeat_s + NOTICE_SLACK_S}
    sessions, losses = [], []
    for r in records:
        s, lost = session_of(r, faults)
        sessions.append(s)
        losses += lost
    checks = []
    delivered = sum(s.finals_delivered for s in sessions)
    expected = sum(s.utterances for s in sessions)
    committed_lost = sum(s.committed_lost for s in sessions)
    retractions = sum(s.retractions for s in sessions)
    checks.append(Check(name="nothing committed lost", passed=delivered == expected and not committed_lost
                        and not retractions, detail=f"finals {delivered}/{expected}, texts not extended "
                                                    f"{committed_lost}, retractions {retractions}"))
    late = [(f["action"], d) for f, d, _ in losses if d > bounds[f["action"]]]
    told = {f["t"]: sum(1 for g, _, _ in losses if g is f) for f in faults}
    miscounted = [f"{f['action']}: {told[f['t']]} told, {f['sessions']} on it" for f in faults
                  if f["pid"] is not None and told[f["t"]] != f["sessions"]]
    checks.append(Check(name="every session of a faulted engine told within the bound",
                        passed=not late and not miscounted,
                        detail=f"bounds {bounds}; worst " + ", ".join(
                            f"{a} {max((d for g, d, _ in losses if g['action'] == a), default=0):.2f} s"
                            for a in sorted({f['action'] for f in faults})) + (f"; late {late[:5]}" if late else "")
                        + (f"; {'; '.join(miscounted)}" if miscounted else "")))
    unresumed = [s.speaker for s in sessions if s.losses and s.resumed_after_fault_s is None]
    errors = [f"{s.speaker}: {s.error}" for s in sessions if s.error]
    checks.append(Check(name="every told session answered again after reconnecting",
                        passed=not unresumed and not errors,
                        detail=f"not resumed {unresumed[:10]}; errors {errors[:3]}" if unresumed or errors
                        else f"{sum(1 for s in sessions if s.losses)} sessions resumed"))
    checks.append(_health_check(options, t0, faults, samples, bounds))
    real_faults = [f for f in faults if f["pid"] is not None]
    try:
        model_id, revision = model_identity(options.model)
    except Exception:  # noqa: BLE001 - a stand-in model has no identity
        model_id, revision = options.model, None
    return FailoverArtifact(
        schema_version=ARTIFACT_SCHEMA_VERSION,
        provenance=collect_provenance(model_id=model_id, model_revision=revision),
        config=options, synthetic_weights=revision == SYNTHETIC_REVISION,
        load_s=round(load_s, 2),
        faults=[{**{k: v for k, v in f.items() if k != "t"}, "t_s": round(f["t"] - t0, 3)} for f in real_faults],
        bounds_s=bounds, sessions=sessions, health=samples,
        engines=[{k: e.get(k) for k in ("engine", "pid", "gpu", "state", "admitted", "finished", "failed")}
                 for e in engines_after],
        checks=checks, passed=all(c.passed for c in checks),
    )


def _health_check(options: Any, t0: float, faults: list[dict], samples: list[dict],
                  bounds: dict[str, float]) -> Check:
    """Before the first fault: ok. Once every fault so far is past its bound: engines_alive says it,
    and the status is degraded (or down when none is left), never ok."""
    real = sorted((f for f in faults if f["pid"] is not None), key=lambda f: f["t"])
    wrong = []
    for s in samples:
        t = t0 + s["t_s"]
        settled = [f for f in real if f["t"] + bounds[f["action"]] <= t]
        started = [f for f in real if f["t"] <= t]
        if not started:
            if s["status"] != "ok":
                wrong.append(f"t={s['t_s']}: {s['status']} before any fault")
            continue
        if len(settled) == len(started):  # between a fault and its bound, either answer is the truth
            alive = options.engines - len(settled)
            expected = "down" if alive == 0 else "degraded"
            if s["status"] != expected or s.get("engines_alive") != alive:
                wrong.append(f"t={s['t_s']}: {s['status']} with {s.get('engines_alive')} alive, expected "
                             f"{expected} with {alive}")
    return Check(name="/health tells the truth", passed=bool(samples) and not wrong,
                 detail=f"{len(samples)} samples" + (f"; {len(wrong)} wrong: {wrong[:3]}" if wrong else ""))


def summary_line(artifact: FailoverArtifact) -> str:
    told = [s for s in artifact.sessions if s.losses]
    worst = max((s.notice_after_fault_s or 0.0 for s in told), default=0.0)
    return (f"failover: {len(artifact.sessions)} speakers, {len(artifact.faults)} faults, {len(told)} sessions told "
            f"(worst notice {worst:.2f} s), finals {sum(s.finals_delivered for s in artifact.sessions)}/"
            f"{sum(s.utterances for s in artifact.sessions)}; "
            + ", ".join(f"{c.name}: {'ok' if c.passed else 'FAILED'}" for c in artifact.checks))
