"""The quality-vs-latency picture of one eval artifact: one point per preset plus the offline baseline.

`quality_latency_svg` draws BLEU against computation-aware LAAL (ms) with matplotlib when it is
installed, with fixed metadata and hash salt so the SVG is byte-stable; it is kept apart from the
report so a figure registry can call it. Without matplotlib the page shows the same points as a
table (`alignatt.evaluate.outputs.quality_latency_points`) and DVC plots the CSV.
"""

from __future__ import annotations

from pathlib import Path

from alignatt.evaluate.outputs import OFFLINE, curve_note, quality_latency_points


def quality_latency_svg(artifact, path: str | Path) -> Path | None:
    """Write the SVG; None (nothing written) when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    matplotlib.rcParams["svg.hashsalt"] = "alignatt-eval"
    fig, ax = plt.subplots(figsize=(6, 4))
    series: dict[tuple[str, str], list[dict]] = {}
    for p in quality_latency_points(artifact):
        key = (p["variant"], OFFLINE if p["driver"] == OFFLINE else f"{p['driver']}, tail {p['tail']}")
        series.setdefault(key, []).append(p)
    for (variant, driver), pts in sorted(series.items()):
        xs = [p["ca_laal_ms"] for p in pts if p["ca_laal_ms"] is not None]
        ys = [p["bleu"] for p in pts if p["ca_laal_ms"] is not None]
        ax.plot(xs, ys, marker="*" if driver == OFFLINE else "o", linestyle="" if driver == OFFLINE else "-",
                label=f"{variant} ({driver})")
        for p in pts:
            if p["ca_laal_ms"] is not None:
                ax.annotate(p["preset"], (p["ca_laal_ms"], p["bleu"]), fontsize=7)
    label = " — latency only (synthetic weights)" if artifact.synthetic_weights else ""
    ax.set_xlabel("LAAL, computation-aware (ms)")
    ax.set_ylabel("BLEU")
    note = curve_note(artifact)  # fewer than 100 sentences: the figure says it is no result
    ax.set_title(f"quality vs latency{label}" + (f"\n{note}" if note else ""), fontsize=8)
    ax.legend(fontsize=7)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fig.savefig(tmp, format="svg", metadata={"Date": None, "Creator": "alignatt"})
    plt.close(fig)
    tmp.replace(path)
    return path
