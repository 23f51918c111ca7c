"""PNG plots of an overload run (`bench overload`), with matplotlib's Agg canvas (no pyplot), in the
styles of `bench.calibrate.plots` (the knee μ as `LIMIT_STYLE`, the SLO as `SLO_STYLE`):

    overload_p95.png         e2e p95 of the OK answers vs offered load λ, one line per mode
    overload_slo.png         SLO attainment (share of offered requests answered OK within the SLO) vs λ
    overload_cloud.png       cloud share of the OK answers vs λ per mode, with the minimal share
                             max(0, (λ − μ)/λ) as a curve

The x axis is the offered load in req/s; each point is labelled with its multiple of μ.
"""

from __future__ import annotations

from pathlib import Path

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from bench.calibrate.plots import LIMIT_STYLE, SLO_STYLE
from bench.overload.metrics import OverloadRun, min_cloud_share

MARKERS = {"burst": "o", "local_only": "s"}


def _axes(run: OverloadRun, title: str, ylabel: str) -> tuple[Figure, Axes]:
    fig = Figure(figsize=(7, 4.2), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.axvline(run.knee_rps, **LIMIT_STYLE, label=f"knee μ = {run.knee_rps:.3g} req/s")
    ax.set_xlabel("offered load λ (req/s, Poisson)")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    rates = [level.rate_rps for level in run.levels] + [run.knee_rps]
    ax.set_xlim(0, max(rates) * 1.1)
    return fig, ax


def _series(run: OverloadRun, ax: Axes, value: str) -> None:
    """One line per mode; the multiples labelled once (every mode runs the same ones)."""
    labelled = False
    for mode in run.modes:
        points = [(lv.rate_rps, getattr(lv.metrics, value), lv.multiple) for lv in run.of(mode)]
        points = [p for p in points if p[1] is not None]
        if not points:
            continue
        xs, ys = [p[0] for p in points], [p[1] for p in points]
        ax.plot(xs, ys, marker=MARKERS.get(mode, "o"), label=mode)
        for x, y, multiple in [] if labelled else points:
            ax.annotate(f"{multiple:g}×", (x, y), textcoords="offset points", xytext=(3, 4), fontsize="x-small")
        labelled = True


def plot_p95(run: OverloadRun, path: Path) -> Path:
    fig, ax = _axes(run, "e2e p95 vs offered load", "e2e latency p95 of OK answers (s)")
    _series(run, ax, "e2e_p95_s")
    ax.axhline(run.slo_s, **SLO_STYLE, label=f"SLO {run.slo_s:g} s")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize="small")
    fig.savefig(path)
    return path


def plot_slo_attainment(run: OverloadRun, path: Path) -> Path:
    fig, ax = _axes(run, f"SLO attainment (e2e ≤ {run.slo_s:g} s) vs offered load", "share of offered requests")
    _series(run, ax, "slo_attainment")
    ax.set_ylim(-0.02, 1.05)
    ax.legend(fontsize="small")
    fig.savefig(path)
    return path


def plot_cloud_share(run: OverloadRun, path: Path) -> Path:
    fig, ax = _axes(run, "Cloud share vs offered load", "cloud share of OK answers")
    top = max([level.rate_rps for level in run.levels] + [run.knee_rps]) * 1.1
    xs = [top * i / 200 for i in range(1, 201)]
    ax.plot(xs, [min_cloud_share(x, run.knee_rps) for x in xs], color="tab:gray", linestyle="-.",
            label="minimum max(0, (λ − μ)/λ)")  # fmt: skip
    _series(run, ax, "cloud_share")
    ax.set_ylim(-0.02, 1.05)
    if not run.has_routes:
        ax.text(0.02, 0.95, "no x-spillover-route header: cloud share counted as 0", transform=ax.transAxes,
                fontsize="small", va="top")  # fmt: skip
    ax.legend(fontsize="small", loc="best")
    fig.savefig(path)
    return path


def write_plots(run: OverloadRun, out_dir: Path) -> dict[str, Path]:
    return {
        "overload_p95.png": plot_p95(run, out_dir / "overload_p95.png"),
        "overload_slo.png": plot_slo_attainment(run, out_dir / "overload_slo.png"),
        "overload_cloud.png": plot_cloud_share(run, out_dir / "overload_cloud.png"),
    }
