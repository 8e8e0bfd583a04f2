"""The Benchmarks page's "Other measurements": the soak, engine failover, replicas behind a balancer,
and every free-form measurement (GPU checks, speed ratios) with its checks, one item each."""

from __future__ import annotations

from typing import Any

from alignatt.report.inputs import ReportInputs
from alignatt.report.rows import machine_of


def soak_item(rel: str, artifact, machine: str) -> dict:
    """The soak as an item of the Benchmarks page's "Other measurements" (report.measurement_items)."""
    sessions = sum(artifact.sessions.values())
    hostile = sessions - artifact.sessions.get("well_formed", 0)
    cfg = artifact.config
    return dict(
        path=rel, name="server_soak", date=artifact.provenance.date, machine=machine,
        description=(f"`alignatt soak`: {cfg.minutes} min of mixed well-formed and hostile "
                     f"sessions on loopback ({cfg.model}, {cfg.seam}, {cfg.clients} clients); targets {'met' if artifact.passed else 'MISSED'}"),
        synthetic=False,
        results=[f"sessions = {sessions} ({hostile} hostile)", f"updates = {artifact.updates}",
                 f"finals = {artifact.finals}", f"load_s = {artifact.load_s}",
                 f"rss_mb = {artifact.rss_start_mb} -> {artifact.rss_end_mb} ({artifact.rss_change_pct:+.2f}%)",
                 f"fds = {artifact.fds_start} -> {artifact.fds_end}",
                 f"server closes = {artifact.server.get('closes', {})}"],
        checks=[("✓" if c.passed else "✗", c.name, c.detail) for c in artifact.checks],
    )


def failover_item(rel: str, artifact, machine: str) -> dict:
    """`alignatt failover` as an item of "Other measurements": engines killed and stopped under load."""
    told = [s for s in artifact.sessions if s.losses]
    worst = {a: max((s.notice_after_fault_s or 0.0 for s in told), default=None) for a in artifact.bounds_s}
    cfg = artifact.config
    statuses = [h.get("status") for h in artifact.health]
    seen = [x for i, x in enumerate(statuses) if x and (i == 0 or statuses[i - 1] != x)]
    return dict(
        path=rel, name="server_failover", date=artifact.provenance.date, machine=machine,
        description=(f"`alignatt failover`: {cfg.engines} engine processes of {cfg.model}/"
                     f"{cfg.seam} on one {cfg.device} device, {cfg.speakers} real-time "
                     f"speakers; " + ", ".join(f"{f['action']} engine {f['engine']} at {f['t_s']:.0f} s "
                                             f"({f['sessions']} sessions)" for f in artifact.faults)
                     + f"; targets {'met' if artifact.passed else 'MISSED'}"),
        synthetic=artifact.synthetic_weights,
        results=[f"sessions told = {len(told)} of {len(artifact.sessions)}",
                 f"finals = {sum(s.finals_delivered for s in artifact.sessions)}/"
                 f"{sum(s.utterances for s in artifact.sessions)}",
                 f"worst notice after a fault = {max((v for v in worst.values() if v is not None), default=0):.2f} s "
                 f"(bounds: " + ", ".join(f"{a} {b:g} s" for a, b in artifact.bounds_s.items()) + ")",
                 f"worst resume after a fault = "
                 f"{max((s.resumed_after_fault_s or 0.0 for s in told), default=0):.2f} s",
                 f"/health = {' -> '.join(seen)}", f"load_s = {artifact.load_s}"],
        checks=[("✓" if c.passed else "✗", c.name, c.detail) for c in artifact.checks],
    )


def replicas_item(rel: str, artifact, machine: str) -> dict:
    """`alignatt replicas` as an item of "Other measurements": replicas behind HAProxy, one killed and
    one drained under load."""
    cfg, rtt = artifact.config, artifact.rtt
    worst = max(artifact.reopen_s, default=0.0)
    return dict(
        path=rel, name="server_replicas", date=artifact.provenance.date, machine=machine,
        description=(f"`alignatt replicas`: {len(artifact.replicas)} `alignatt serve` replicas of {cfg.model}/"
                     f"{cfg.seam} on {cfg.device} behind {artifact.balancer.get('version', '').split(' - ')[0]}"
                     f" ({'with' if cfg.health_check else 'WITHOUT'} its /health check), "
                     f"{cfg.speakers} real-time speakers through it; "
                     + ", ".join(f"{f['action']} {f['replica']} at {f['t_s']:.0f} s ({f['sessions']} sessions)"
                                 for f in artifact.faults)
                     + f"; targets {'met' if artifact.passed else 'MISSED'}"),
        synthetic=artifact.synthetic_weights,
        results=[f"finals = {sum(s.finals_delivered for s in artifact.sessions)}/"
                 f"{sum(s.utterances for s in artifact.sessions)}",
                 f"committed text lost = {sum(s.committed_lost for s in artifact.sessions)}, retractions = "
                 f"{sum(s.retractions for s in artifact.sessions)}",
                 f"reconnects = {len(artifact.reopen_s)}, notice -> in session again: worst {worst:.2f} s "
                 f"(bound {artifact.bounds_s.get('reconnect', 0):g} s); -> a translation again: worst "
                 f"{max(artifact.answered_again_s, default=0.0):.2f} s (adds the engine's queue)",
                 f"balancer's added round trip (WebSocket ping, p50 of {rtt.probes}) = {rtt.ping_added_ms_p50:.3f} ms "
                 f"({rtt.ping_direct_ms_p50:.3f} direct, {rtt.ping_balanced_ms_p50:.3f} balanced)",
                 f"session open p50 = {rtt.open_direct_ms_p50:.1f} ms direct, {rtt.open_balanced_ms_p50:.1f} ms "
                 f"balanced",
                 f"longest wait for a final = {max((s.final_wait_s_max or 0.0 for s in artifact.sessions), default=0):.1f}"
                 f" s (a speaker waits {artifact.finals_wait_s:g} s past its stream's end: the engines' queue)",
                 f"load_s = {artifact.load_s}"],
        checks=[("✓" if c.passed else "✗", c.name, c.detail) for c in artifact.checks],
    )


def measurement_items(inputs: ReportInputs) -> list[dict[str, Any]]:
    items = []
    for rel, a in inputs.of_kind("failover"):
        items.append(failover_item(rel, a, machine_of(a)))
    for rel, a in inputs.of_kind("replicas"):
        items.append(replicas_item(rel, a, machine_of(a)))
    # the soak is not a MeasurementArtifact, but the page shows it with them
    for rel, a in sorted(inputs.measurements + inputs.of_kind("soak"), key=lambda t: t[0]):
        if a.kind == "soak":  # its own fields, shown like a measurement
            items.append(soak_item(rel, a, machine_of(a)))
            continue
        scalars = {k: v for k, v in a.results.items() if isinstance(v, (int, float, str, bool))}
        items.append(dict(
            path=rel, name=a.name, date=a.provenance.date, machine=machine_of(a),
            description=a.description, synthetic=a.synthetic_weights,
            results=[f"{k} = {v:.4g}" if isinstance(v, float) else f"{k} = {v}" for k, v in scalars.items()],
            checks=[("✓" if c.passed else "✗", c.name, _check_detail(c.detail, a.results, c.name)) for c in a.checks],
        ))
    return items


def eager_comparisons(check: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(graphed mode, its comparison) for each `<mode>_vs_eager` entry of a check's results."""
    return [(k.removesuffix("_vs_eager"), v) for k, v in check.items()
            if k.endswith("_vs_eager") and isinstance(v, dict) and "rows" in v]


def _check_detail(detail: str | None, results: dict[str, Any], name: str) -> str | None:
    """The check's verdict, a graphed mode's comparison with eager (bit-identical drafts), and the
    figures it recorded at its top level (ratios, times)."""
    raw = (results.get("checks") or {}).get(name)
    if not isinstance(raw, dict):
        return detail
    compared = [f"{mode} vs eager: {v['bit_identical_rows']}/{v['rows']} bit-identical"
                for mode, v in eager_comparisons(raw)]
    figures = [f"{k} {v:.4g}" for k, v in raw.items()
               if isinstance(v, (int, float)) and not isinstance(v, bool)][:8]
    return "; ".join(x for x in [detail, *compared, ", ".join(figures)] if x) or None
