"""The replicas artifact from what `alignatt replicas` saw: sessions, reconnects, rotation, checks.

A speaker's loss is put down to the latest fault before it (`failover_record.session_of`). Bounds:
a killed replica's sessions learn it at once (their sockets close through the balancer:
`KILL_NOTICE_S`); a drained one's within `drain_s` plus `NOTICE_SLACK_S`; every told session must
be in session again (init_ok on another replica) within `reconnect_bound_s` of its notice, and get a
translation there (how long that takes is recorded: it adds the engine's queue, which on an
overloaded host is the larger part); a drained replica must exit 0 within `drain_s`
plus `EXIT_SLACK_S`.
"""

from __future__ import annotations

import hashlib
from typing import Any

from alignatt.measure.failover_client import DRAIN_S as FINALS_WAIT_S, SpeakerRecord
from alignatt.measure.failover_record import KILL_NOTICE_S, NOTICE_SLACK_S, session_of
from alignatt.models.presets import SYNTHETIC_REVISION
from alignatt.record.artifacts import ARTIFACT_SCHEMA_VERSION, BalancerRtt, Check, ReplicasArtifact

EXIT_SLACK_S = 5.0  # a drained replica: past drain_s, its sockets' close and the engine's shutdown


def _after_notice(record: SpeakerRecord, times: list[float]) -> list[float]:
    """Per loss that was followed by `times` (a new session, or its first translation): seconds after the notice."""
    return [round(t - lost, 3) for lost, t in zip(record.lost_at, times)]


IN_ROTATION = ("UP", "no check")  # HAProxy's status of a server that takes new sessions


def _rotation_check(options: Any, t0: float, faults: list[dict], rotation: list[dict]) -> Check:
    """A killed or drained replica is out of rotation from its fault + the checks' time on; a restarted
    one is out of rotation while it restarts, and in again at the end."""
    settle_s = options.check_interval_ms / 1000.0 + 1.0  # fall 1: one check, plus its own time and sampling
    wrong = []
    for f in faults:
        name = f"{f['replica']} ({f['action']})"
        if f["action"] == "restart":
            back = f["t"] + f["back_after_s"] if f.get("back_after_s") is not None else float("inf")
            during = [s for s in rotation if f["t"] <= t0 + s["t_s"] <= back + settle_s]
            if not any(s.get(f["replica"]) not in IN_ROTATION for s in during):
                wrong.append(f"{name}: never out of rotation while it restarted")
            if not rotation or rotation[-1].get(f["replica"]) != "UP":
                wrong.append(f"{name}: not back in rotation at the end ({rotation[-1].get(f['replica']) if rotation else None})")
            continue
        after = [s for s in rotation if t0 + s["t_s"] >= f["t"] + settle_s]
        in_rotation = [s["t_s"] for s in after if s.get(f["replica"]) in IN_ROTATION]
        if not after or in_rotation:
            wrong.append(f"{name}: " + (f"in rotation at t={in_rotation[0]} s ({after[0].get(f['replica'])})"
                                        if in_rotation else "not sampled after its fault"))
    return Check(name="the balancer takes each faulted replica out of rotation",
                 passed=bool(faults) and not wrong,
                 detail=f"within {settle_s:g} s of the fault; {len(rotation)} samples"
                        + (f"; {'; '.join(wrong)}" if wrong else ""))


def replicas_artifact(options: Any, load_s: float, t0: float, faults: list[dict], records: list[SpeakerRecord],
                      rtt: dict[str, Any], rotation: list[dict], replicas: list[dict],
                      balancer: dict[str, Any]) -> ReplicasArtifact:
    from alignatt.record.provenance import collect_provenance, model_identity

    drained_bound = options.drain_s + NOTICE_SLACK_S
    bounds = {"kill": KILL_NOTICE_S, "drain": drained_bound, "restart": drained_bound,
              "reconnect": options.reconnect_bound_s}
    sessions, losses, reopened, answered = [], [], [], []
    for r in records:
        s, lost = session_of(r, faults)
        sessions.append(s)
        losses += lost
        reopened += _after_notice(r, r.reopened_at)
        answered += _after_notice(r, r.resumed_at)
    delivered = sum(s.finals_delivered for s in sessions)
    expected = sum(s.utterances for s in sessions)
    errors = [f"{s.speaker}: {s.error}" for s in sessions if s.error]
    committed_lost = sum(s.committed_lost for s in sessions)
    retractions = sum(s.retractions for s in sessions)
    told = sum(s.losses for s in sessions)
    late = [(f["action"], round(d, 2)) for f, d, _ in losses if d > bounds[f["action"]]]
    slow = [t for t in reopened if t > options.reconnect_bound_s]
    unresumed = [s.speaker for s in sessions if s.losses and s.resumed_after_fault_s is None]
    drained = [f for f in faults if f["action"] in ("drain", "restart")]
    checks = [
        Check(name="every speaker finishes its stream", passed=expected > 0 and delivered == expected and not errors,
              detail=f"finals {delivered}/{expected}" + (f"; errors {errors[:3]}" if errors else "")),
        Check(name="nothing committed lost or retracted", passed=not committed_lost and not retractions,
              detail=f"texts not extended {committed_lost}, retractions {retractions}"),
        Check(name=f"every told session is in session again within {options.reconnect_bound_s:g} s of its "
                   "notice, and answered there",
              passed=told > 0 and len(reopened) == told and not slow and not unresumed and not late,
              detail=f"{told} losses, {len(reopened)} sessions again (worst {max(reopened, default=0):.2f} s), "
                     f"{len(answered)} answered again (worst {max(answered, default=0):.2f} s)"
                     + (f"; over the bound {slow[:5]}" if slow else "") + (f"; not answered {unresumed[:5]}" if unresumed
                                                                           else "")
                     + (f"; told late {late[:5]}" if late else "")),
        _rotation_check(options, t0, faults, rotation),
        Check(name="a drained (or restarted) replica exits cleanly within drain_s",
              passed=bool(drained) and all(f["exit_code"] == 0 and f["exited_after_s"] is not None and
                                           f["exited_after_s"] <= options.drain_s + EXIT_SLACK_S for f in drained),
              detail=", ".join(f"{f['replica']}: exit {f['exit_code']} after {f['exited_after_s']} s"
                               + (f", listening again after {f['back_after_s']} s" if "back_after_s" in f else "")
                               for f in drained) or "no drain"),
    ]
    try:
        model_id, revision = model_identity(options.model)
    except Exception:  # noqa: BLE001 - a stand-in model has no identity
        model_id, revision = options.model, None
    text = balancer["config"]
    return ReplicasArtifact(
        schema_version=ARTIFACT_SCHEMA_VERSION,
        provenance=collect_provenance(model_id=model_id, model_revision=revision),
        config=options, synthetic_weights=revision == SYNTHETIC_REVISION,
        balancer={**balancer, "config_sha256": hashlib.sha256(text.encode()).hexdigest()},
        load_s=round(load_s, 2),
        faults=[{**{k: v for k, v in f.items() if k != "t"}, "t_s": round(f["t"] - t0, 3)} for f in faults],
        bounds_s=bounds, sessions=sessions, finals_wait_s=FINALS_WAIT_S,
        reopen_s=sorted(reopened), answered_again_s=sorted(answered),
        rtt=BalancerRtt(**rtt),
        rotation=rotation, replicas=replicas, checks=checks, passed=all(c.passed for c in checks),
    )


def summary_line(artifact: ReplicasArtifact) -> str:
    worst = max(artifact.reopen_s, default=0.0)
    return (f"replicas: {len(artifact.replicas)} behind {artifact.balancer.get('version', 'haproxy').split(' - ')[0]}, "
            f"{len(artifact.sessions)} speakers, "
            + ", ".join(f"{f['action']} {f['replica']} at {f['t_s']:.0f} s" for f in artifact.faults)
            + f"; finals {sum(s.finals_delivered for s in artifact.sessions)}/"
              f"{sum(s.utterances for s in artifact.sessions)}, {len(artifact.reopen_s)} reconnects (worst "
              f"{worst:.2f} s to a session, {max(artifact.answered_again_s, default=0.0):.2f} s to a translation), balancer adds {artifact.rtt.ping_added_ms_p50:.3f} ms a round trip; "
            + ", ".join(f"{c.name}: {'ok' if c.passed else 'FAILED'}" for c in artifact.checks))
