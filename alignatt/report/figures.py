"""The Benchmarks page's figures: SVGs drawn with matplotlib from the artifacts, byte-stable.

A figure function takes the report's inputs and returns `Figure`s (name, the artifact kind it is
drawn from, title, caption, SVG text). This module holds the drawing helpers and the bench
figures; another stage's figures live beside its section (`report/capacity.py`), and the page
lists every function in `alignatt.report.page.FIGURES`. `alignatt report` writes every figure to
`reports/figures/<name>.svg` and removes figures no function makes any more; `report --check`
renders them again and compares bytes, so a stale figure is found like a stale page.

Byte-stable: matplotlib's default style (no user matplotlibrc), text kept as text
(`svg.fonttype: none`, no font files read into the output), a fixed `svg.hashsalt` for element
ids, and no date or version in the metadata. The bytes still depend on the matplotlib version,
which the `pipeline` extra pins.
"""

from __future__ import annotations

import io
import re
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import date

from alignatt.capture.names import HF_EAGER, HF_QK_FAST, VLLM_CAPTURE, VLLM_MODES
from alignatt.core.errors import AlignattError
from alignatt.report.inputs import ReportInputs

FIGURES_DIR = "figures"  # under reports/, beside BENCHMARKS.md
SVG_RC = {"svg.hashsalt": "alignatt-report", "svg.fonttype": "none", "svg.image_inline": True,
          "path.simplify": False}
SVG_METADATA = {"Date": None, "Creator": "alignatt report", "Format": None, "Type": None}
# Okabe & Ito's colour-blind-safe palette (vermillion, blue, bluish green)
SERVED_COLOR = "#000000"  # the served default, drawn heavy, in every figure that shows it
SEAM_COLORS = {HF_EAGER: "#D55E00", HF_QK_FAST: "#0072B2", VLLM_CAPTURE: "#009E73"}
MODE_MARKERS = dict(zip(VLLM_MODES, ("o", "s", "D", "^"), strict=True))  # a new mode needs its marker


@dataclass(frozen=True)
class Figure:
    name: str  # file stem: reports/figures/<name>.svg
    kind: str  # the artifact kind it is drawn from
    title: str
    caption: str
    svg: str

    @property
    def path(self) -> str:
        """Relative to reports/, as the page links it."""
        return f"{FIGURES_DIR}/{self.name}.svg"


FigureFunction = Callable[[ReportInputs], list[Figure]]


def render_figures(inputs: ReportInputs, functions: Sequence[FigureFunction]) -> list[Figure]:
    """Every figure the functions draw, in their order; two figures of one name are an error."""
    figures = [figure for fn in functions for figure in fn(inputs)]
    names = [f.name for f in figures]
    duplicate = next((n for n in names if names.count(n) > 1), None)
    if duplicate:
        raise AlignattError(f"two figures are both named {duplicate!r}")
    return figures


# ---- drawing, byte-stable --------------------------------------------------------------------


def new_figure(width: float = 7.0, height: float = 4.0, nrows: int = 1, ncols: int = 1):
    """A figure and its axes (one, or an nrows x ncols array)."""
    try:
        from matplotlib.figure import Figure as MplFigure
    except ImportError:
        raise AlignattError("the report's figures need matplotlib: pip install 'alignatt[pipeline]'") from None
    fig = MplFigure(figsize=(width, height), layout="constrained")
    return fig, fig.subplots(nrows, ncols, squeeze=nrows == ncols == 1)


def svg_text(fig) -> str:
    """The figure as SVG text with nothing that changes between renders of the same data."""
    import matplotlib

    buf = io.StringIO()
    with matplotlib.rc_context(SVG_RC):
        fig.savefig(buf, format="svg", metadata=SVG_METADATA)
    return stable_ids(buf.getvalue())


# matplotlib names clip paths and markers by a hash of their path data ("p" / "m" + 10 hex digits),
# whose float text differs between installs: the same picture came out as other bytes elsewhere.
_HASHED_ID = re.compile(r'id="([pm][0-9a-f]{10})"')


def stable_ids(svg: str) -> str:
    """The SVG with each hashed id renamed by its kind and order of definition (clip1, marker1, ...),
    so the bytes depend on what the figure shows, not on how an install prints floats."""
    names: dict[str, str] = {}
    for m in _HASHED_ID.finditer(svg):
        kind = "clip" if m[1][0] == "p" else "marker"
        names.setdefault(m[1], f"{kind}{sum(1 for v in names.values() if v.startswith(kind)) + 1}")
    if not names:
        return svg
    return re.sub(r"\b(" + "|".join(names) + r")\b", lambda m: names[m[1]], svg)


def styled(draw: Callable[[], Figure]) -> Figure:
    """Draw under matplotlib's default style, whatever matplotlibrc this machine has."""
    import matplotlib
    import matplotlib.style

    with matplotlib.rc_context():
        matplotlib.style.use("default")
        matplotlib.rcParams.update(SVG_RC)
        return draw()


# ---- bench figures ---------------------------------------------------------------------------


def latency_by_prompt_length(inputs: ReportInputs) -> list[Figure]:
    """Per pipeline folder (profile): each seam's median ms/token per prompt against its length."""
    from alignatt.record.artifacts import BENCH_FILE
    from alignatt.report.rows import MODE_ORDER, machine_of

    figures = []
    for session in sorted(inputs.runs):
        by_mode = inputs.runs[session]
        if not all(BENCH_FILE.match(rel.rsplit("/", 1)[-1]) for rel, _ in by_mode.values()):
            continue  # a one-off bench file, not a pipeline folder
        series = []
        for mode in sorted(by_mode, key=lambda m: MODE_ORDER.get(m, 9)):
            _, art = by_mode[mode]
            for seam in art.seams:
                if seam.status != "ok":
                    continue
                series.append((seam.seam, mode, points_by_length(seam)))
        if not series:
            continue
        profile = session.rsplit("/", 1)[-1]
        any_art = next(iter(by_mode.values()))[1]
        machine, day = machine_of(any_art), any_art.provenance.date
        synthetic = " (synthetic weights)" if any_art.synthetic_weights else ""

        def draw(series=series, profile=profile, machine=machine, day=day, model=any_art.config.model,
                 synthetic=synthetic) -> Figure:
            fig, ax = new_figure()
            served = _served_engine([(seam, mode) for seam, mode, _ in series])
            for seam, mode, points in series:
                xs, ys = zip(*points)
                is_served = (seam, mode) == served
                ax.plot(xs, ys, marker=MODE_MARKERS.get(mode, "x"), linestyle="-",
                        linewidth=2.2 if is_served else 1, zorder=3 if is_served else 2,
                        color=SERVED_COLOR if is_served else SEAM_COLORS.get(seam, "#7f7f7f"),
                        label=("served default: " if is_served else "") + f"{seam} ({mode})")
            ax.set_xlabel("prompt length (tokens)")
            ax.set_ylabel("ms per generated token (median)")
            ax.set_ylim(bottom=0)
            ax.grid(True, linewidth=0.3)
            ax.set_title(f"{profile}: {model}{synthetic} on {machine}, {day}", fontsize=9, loc="left")  # wider than the axes
            ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)  # outside the data
            caption = (f"Per-seam latency by prompt length, profile `{profile}` ({day}): each point is the "
                       "median over its measured passes of the prompts of that length; `dvc plots show` has the same data by prompt.")
            return Figure(f"latency_by_prompt_length_{profile}", "bench", f"Latency by prompt length ({profile})",
                          caption, svg_text(fig))

        figures.append(styled(draw))
    return figures


def points_by_length(seam) -> list[tuple[int, float]]:
    """A seam's (prompt tokens, median ms/token) points, one per length: prompts of one length share
    the median of their medians (two points at one x would draw a vertical segment)."""
    tokens: dict[str, int] = {}
    for row in seam.rows:
        tokens.setdefault(row.id, row.prompt_tokens)
    by_length: dict[int, list[float]] = {}
    for pid, stats in seam.by_prompt.items():
        by_length.setdefault(tokens[pid], []).append(stats.median_per_token_ms)
    return sorted((n, statistics.median(ms)) for n, ms in by_length.items())


def _served_engine(series: Sequence[tuple[str, str]]) -> tuple[str, str] | None:
    """The (seam, mode) of a bench's series that `alignatt serve` drafts with by default: vllm_capture
    in its served mode where vLLM ran (CUDA), else the default seam (CPU); None if the bench lacks it."""
    from alignatt.capture.names import DEFAULT_SEAM
    from alignatt.serve.config import SERVED_VLLM_OPTIONS

    if any(seam == VLLM_CAPTURE for seam, _ in series):
        wanted = (VLLM_CAPTURE, SERVED_VLLM_OPTIONS["vllm_mode"])
        return wanted if wanted in series else None
    return next(((seam, mode) for seam, mode in series if seam == DEFAULT_SEAM), None)


def headline_ratio_history(inputs: ReportInputs) -> list[Figure]:
    """The dated history of the headline ratio (HF eager / vLLM, within one row), published + ours."""
    points = [r for r in inputs.rows() if r.speedup is not None]
    if not points:
        return []

    def draw() -> Figure:
        fig, ax = new_figure(7.0, 3.6)
        for historical, corrupt, label in ((True, False, "published"), (True, True, "published, capture corrupt"),
                                           (False, False, "ours"), (False, True, "ours, capture corrupt")):
            group = [r for r in points if r.historical == historical and r.corrupt == corrupt]
            if not group:
                continue
            xs = [date.fromisoformat(r.date) for r in group]
            ys = [r.speedup for r in group]
            color = "#D55E00" if corrupt else ("#0072B2" if historical else "#009E73")
            style = {"marker": "x", "color": color} if corrupt else {
                "marker": "o", "edgecolors": color, "facecolors": "none" if historical else color}
            ax.scatter(xs, ys, s=36, label=label, **style)
            for r, x, y in zip(group, xs, ys):
                mode = "" if r.mode == "not recorded" else f" {r.mode}"
                ax.annotate(f"{y:.2f}×{mode}", (x, y), textcoords="offset points", xytext=(5, 4), fontsize=7)
        ax.axhline(1.0, color="#7f7f7f", linewidth=0.6)
        ax.margins(x=0.12)  # room for the last point's label
        ax.set_ylabel("HF eager ÷ vLLM (same row)")
        ax.set_ylim(bottom=0)
        ax.grid(True, linewidth=0.3)
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)  # outside the data
        fig.autofmt_xdate()
        caption = ("The headline ratio over time: HF eager ms/token divided by vLLM ms/token within one "
                   "results row (one day, one machine); ✗ marks a row whose graphed capture was corrupt, "
                   "so its ratio cannot be claimed. Rows differ in machine and tool: compare within a row.")
        return Figure("headline_ratio_history", "bench", "Headline ratio by date", caption, svg_text(fig))

    return [styled(draw)]
