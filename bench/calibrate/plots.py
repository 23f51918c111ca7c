"""PNG plots of a calibration run, drawn with matplotlib's Agg canvas (no pyplot, no display,
no global backend switch).

    throughput.png    successful req/s vs concurrency, one line per stage; the knee of each stage
                      marked; the formula's predicted admission limit as a vertical line
    latency.png       p95 latency (the SLO's metric) vs concurrency, the SLO as a horizontal line,
                      the predicted admission limit as a vertical line
    burst_<stage>.png share of successful requests routed to the cloud over time (stages whose
                      responses carried `x-spillover-route`), concurrency levels shaded

The concurrency axis is log2, so a prediction far beyond the sweep still fits on it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Final, TypedDict

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from bench.calibrate.sweep import StageResult


class LineStyle(TypedDict):
    """Keywords of a reference line (`Axes.axvline` / `axhline`), passed as `**style`."""

    color: str
    linestyle: str
    linewidth: float


LIMIT_STYLE: Final[LineStyle] = {"color": "tab:red", "linestyle": "--", "linewidth": 1.2}
SLO_STYLE: Final[LineStyle] = {"color": "tab:orange", "linestyle": ":", "linewidth": 1.5}


def _figure() -> Figure:
    fig = Figure(figsize=(7, 4.2), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _concurrency_axis(ax: Axes, stages: Sequence[StageResult], limit: int | None) -> None:
    xs = [lv.concurrency for s in stages for lv in s.levels] + ([limit] if limit else [])
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _pos: f"{value:g}"))
    if xs:
        ax.set_xlim(min(xs) / 1.5, max(xs) * 1.5)
    ax.set_xlabel("concurrency (requests in flight)")
    ax.grid(True, which="both", alpha=0.3)


def plot_throughput(stages: Sequence[StageResult], predicted_limit: int | None, path: Path) -> Path:
    fig = _figure()
    ax = fig.add_subplot()
    for stage in stages:
        xs = [lv.concurrency for lv in stage.levels]
        ys = [lv.summary.throughput_rps for lv in stage.levels]
        (line,) = ax.plot(xs, ys, marker="o", label=f"{stage.name} ({stage.url})")
        if stage.knee.point is not None:
            knee = stage.knee.point
            label = f"{stage.name} knee {knee.concurrency}"
            color = line.get_color()
            ax.plot([knee.concurrency], [knee.throughput_rps], marker="*", markersize=14, color=color, label=label)
    if predicted_limit:
        ax.axvline(predicted_limit, **LIMIT_STYLE, label=f"formula admission limit {predicted_limit}")
    _concurrency_axis(ax, stages, predicted_limit)
    ax.set_ylabel("throughput (successful req/s)")
    ax.set_title("Throughput vs concurrency")
    ax.legend(fontsize="small")
    fig.savefig(path)
    return path


def plot_latency(
    stages: Sequence[StageResult], predicted_limit: int | None, slo_p95_s: float, metric: str, path: Path
) -> Path:
    fig = _figure()
    ax = fig.add_subplot()
    for stage in stages:
        pairs = [(lv.concurrency, lv.summary.p95_s(metric)) for lv in stage.levels]
        xs = [c for c, p in pairs if p is not None]
        ys = [p for _, p in pairs if p is not None]
        ax.plot(xs, ys, marker="o", label=f"{stage.name} {metric} p95")
    ax.axhline(slo_p95_s, **SLO_STYLE, label=f"SLO p95 {slo_p95_s:g} s")
    if predicted_limit:
        ax.axvline(predicted_limit, **LIMIT_STYLE, label=f"formula admission limit {predicted_limit}")
    _concurrency_axis(ax, stages, predicted_limit)
    ax.set_ylabel(f"{metric} latency p95 (s)")
    ax.set_ylim(bottom=0)
    ax.set_title(f"p95 {metric} latency vs concurrency")
    ax.legend(fontsize="small")
    fig.savefig(path)
    return path


def plot_burst_share(stage: StageResult, path: Path, *, bins: int = 30) -> Path:
    """Cloud share of successful requests per time bin, over the whole stage."""
    done = [r for lv in stage.levels for r in lv.results if r.ok and r.route]
    fig = _figure()
    ax = fig.add_subplot()
    if done:
        t0 = min(r.start_s for lv in stage.levels for r in lv.results)
        t1 = max(r.start_s for r in done)
        width = max((t1 - t0) / bins, 1e-3)
        counts: dict[int, list[int]] = {}
        for r in done:
            cell = counts.setdefault(int((r.start_s - t0) / width), [0, 0])
            cell[0] += r.route == "cloud"
            cell[1] += 1
        keys = sorted(counts)
        shares = [counts[k][0] / counts[k][1] for k in keys]
        ax.bar([k * width for k in keys], shares, width=width, align="edge", color="tab:purple", alpha=0.8)
        for i, lv in enumerate(stage.levels):
            starts = [r.start_s - t0 for r in lv.results]
            if starts:
                ax.axvspan(min(starts), max(starts), alpha=0.08 if i % 2 else 0.16, color="tab:blue")
                ax.annotate(f"c={lv.concurrency}", (min(starts), 1.02), fontsize="x-small")
    ax.set_ylim(0, 1.08)
    ax.set_xlabel("time since the stage started (s)")
    ax.set_ylabel("cloud share of requests")
    ax.set_title(f"Burst (cloud) share over time: {stage.name}")
    ax.grid(True, alpha=0.3)
    fig.savefig(path)
    return path
