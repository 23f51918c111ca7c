"""PNG plots of a soak run (`bench soak`), with matplotlib's Agg canvas (no pyplot), in the styles of
`bench.calibrate.plots`; window boundaries are dotted vertical lines, the warm-up window is shaded:

    soak_rss.png    RSS (MiB, log scale: a relative growth looks the same for every size) of every sampled
                    process over time, one line per process (largest first)
    soak_fds.png    open file descriptors of every sampled process over time
    soak_p99.png    e2e p50 / p99 and stream TTFT p99 per window
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from bench.soak.metrics import MIB, ProcSample

if TYPE_CHECKING:
    from bench.soak.report import SoakRun

MAX_LINES = 14  # more processes than this: the smallest share one "others (sum)" line
MAX_LABEL = 52


def _figure(run: SoakRun, title: str, ylabel: str) -> tuple[Figure, Axes]:
    fig = Figure(figsize=(11, 5), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.set_title(title)
    ax.set_xlabel("time since the start (s)")
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    if run.bounds:
        ax.axvspan(run.bounds[0][0], run.bounds[0][1], color="tab:gray", alpha=0.12, label="warm-up window")
        for start, _ in run.bounds[1:]:
            ax.axvline(start, color="tab:gray", linestyle=":", linewidth=0.8)
    return fig, ax


def _series(samples: list[ProcSample], value: Callable[[ProcSample], float]) -> dict[str, list[tuple[float, float]]]:
    by_key: dict[str, list[tuple[float, float]]] = {}
    for s in samples:
        by_key.setdefault(s.key, []).append((s.t, value(s)))
    return by_key


def _label(key: str) -> str:
    """`ServeReplica:spillover:SpilloverLLMServer:smollm2-135m-instruct [9920]` without its app, then shortened
    in the middle when still long."""
    if key.startswith("ServeReplica:") and key.count(":") >= 2:
        key = key.split(":", 2)[2]
    return key if len(key) <= MAX_LABEL else key[: MAX_LABEL - 12] + "…" + key[-11:]


def _plot_processes(
    run: SoakRun, path: Path, value: Callable[[ProcSample], float], title: str, ylabel: str, *, log: bool = False
) -> Path:
    fig, ax = _figure(run, title, ylabel)
    series = _series(run.state.samples, value)
    ranked = sorted(series, key=lambda k: -max(v for _, v in series[k]))
    for key in ranked[:MAX_LINES]:
        points = series[key]
        ax.plot(
            [t for t, _ in points], [v for _, v in points], marker=".", markersize=3, linewidth=1, label=_label(key)
        )
    rest = ranked[MAX_LINES:]
    if rest:
        totals: dict[float, float] = {}
        for key in rest:
            for t, v in series[key]:
                totals[t] = totals.get(t, 0.0) + v
        times = sorted(totals)
        ax.plot(times, [totals[t] for t in times], linestyle="--", color="black", label=f"{len(rest)} others (sum)")
    if log and series:
        ax.set_yscale("log")
    else:
        ax.set_ylim(bottom=0)
    if series:
        ax.legend(fontsize="x-small", loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.savefig(path)
    return path


def plot_p99(run: SoakRun, path: Path) -> Path:
    fig, ax = _figure(run, "Latency per window", "seconds")
    mids = [(w.start_s + w.end_s) / 2 for w in run.windows]
    for name, label, style in (
        ("e2e_p50_s", "e2e p50", "-"),
        ("e2e_p99_s", "e2e p99", "-"),
        ("ttft_p99_s", "TTFT p99 (streams)", "--"),
    ):
        points = [(x, getattr(w, name)) for x, w in zip(mids, run.windows, strict=True) if getattr(w, name) is not None]
        if points:
            ax.plot([x for x, _ in points], [y for _, y in points], marker="o", linestyle=style, label=label)
    if len(run.windows) >= 3 and run.windows[1].e2e_p99_s is not None:
        limit = run.options["p99_ratio"] * run.windows[1].e2e_p99_s
        ax.axhline(
            limit,
            color="tab:red",
            linestyle="-.",
            linewidth=1,
            label=f"stable-p99 limit (×{run.options['p99_ratio']:g} window 1)",
        )
    ax.set_ylim(bottom=0)
    ax.legend(fontsize="small")
    fig.savefig(path)
    return path


def write_plots(run: SoakRun, out_dir: Path) -> dict[str, Path]:
    return {
        "soak_rss.png": _plot_processes(
            run,
            out_dir / "soak_rss.png",
            lambda s: s.rss_bytes / MIB,
            "RSS per process",
            "RSS (MiB, log scale)",
            log=True,
        ),
        "soak_fds.png": _plot_processes(
            run, out_dir / "soak_fds.png", lambda s: float(s.fds), "Open file descriptors per process", "open FDs"
        ),
        "soak_p99.png": plot_p99(run, out_dir / "soak_p99.png"),
    }
