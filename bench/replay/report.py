"""The record of one replay (`bench replay`), written to a directory:

results.json          the inputs (trace, format, scaling, SLO, prices, policies), the environment, and per policy
                      its metrics and every request (route, target, TTFT, e2e, tokens, cost, SLO met)
requests-<label>.csv  the same requests of one policy, one row each, for a spreadsheet
report.md             the trace and how it was scaled, one table row per policy, the plot
replay_curve.png      SLO attainment against cloud spend, one point per policy (labelled with its cloud share)
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from bench.calibrate.report import environment_and_plots
from bench.replay.metrics import RequestRow
from bench.replay.policies import slug
from bench.replay.run import ReplayRun

ROW_FIELDS = tuple(RequestRow.__dataclass_fields__)


def results_dict(run: ReplayRun) -> dict[str, Any]:
    o, s = run.options, run.scaled
    bound = None
    if run.bound is not None:
        bound = {**run.bound.to_dict(), "perf_from": o.perf_from, "replicas": o.replicas}
    return {
        "started_at": run.started_at,
        "url": o.url,
        "model": o.model,
        "trace": {
            "path": o.trace,
            "format": run.trace.format,
            "requests": len(run.trace.requests),
            "skipped_zero_output": run.trace.skipped,
            "duration_s": run.trace.duration_s,
        },
        "scaling": o.scaling.to_dict(),
        "window": {"start_s": s.window_start_s, "length_s": s.window_s, "requests": len(s.requests)},
        "prompts_capped": s.capped,
        "slo_s": o.slo_s,
        "send_deadline": o.send_deadline,
        "drain_s": o.drain,
        "prices": {"in_per_mtok": o.prices.in_per_mtok, "out_per_mtok": o.prices.out_per_mtok},
        "environment": run.environment,
        "offline_bound": bound,
        "policies": [{**r.to_dict(), "requests": [row.to_dict() for row in r.rows]} for r in run.runs],
    }


def write_replay_report(run: ReplayRun, out_dir: Path) -> dict[str, Path]:
    return write_results(results_dict(run), out_dir)


def write_results(results: dict[str, Any], out_dir: Path) -> dict[str, Path]:
    """results.json, one CSV per policy, the plot and report.md, all from `results` (one run's, or merged ones')."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"results.json": out_dir / "results.json", "report.md": out_dir / "report.md"}
    paths["results.json"].write_text(json.dumps(results, indent=2) + "\n")
    for policy_run in results["policies"]:
        path = out_dir / f"requests-{slug(policy_run['label'])}.csv"
        with path.open("w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=ROW_FIELDS)
            writer.writeheader()
            writer.writerows(policy_run["requests"])
        paths[path.name] = path
    paths["replay_curve.png"] = plot_curve(results, out_dir / "replay_curve.png")
    paths["report.md"].write_text(render_markdown(results, ["replay_curve.png"]))
    return paths


def _s(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}"


def render_markdown(r: dict[str, Any], plots: list[str]) -> str:
    sc, t, w, prices = r["scaling"], r["trace"], r["window"], r["prices"]
    window = "the whole trace" if sc["window_s"] is None else f"{sc['window_s']:g} s from {w['start_s']:.1f} s"
    if sc["window_s"] is not None and sc["window_at"] == "busiest":
        window += " (the busiest window)"
    rate = w["requests"] / w["length_s"] if w["length_s"] > 0 else 0.0
    lines = [
        f"# Replay of `{Path(t['path']).name}` — `{r['model']}`",
        "",
        f"Started {r['started_at']} against {r['url']}. Trace: {t['format']}, {t['requests']} requests over "
        f"{t['duration_s']:.0f} s ({t['skipped_zero_output']} rows with 0 output tokens skipped).",
        "",
        f"Scaling (bench/replay/scaling.py, seed {sc['seed']}): timestamps spread over {sc['spread_s']:g} s buckets; "
        f"window {window}; keep {sc['keep']:g} of the requests; time × {sc['stretch']:g}; prompt tokens × "
        f"{sc['input_scale']:g} (cap {sc['max_input'] or '–'}), output tokens × {sc['output_scale']:g} (cap "
        f"{sc['max_output'] or '–'}), within a {sc['context_window']}-token window ({r['prompts_capped']} prompts "
        f"capped). Replayed: **{w['requests']} requests over {w['length_s']:.0f} s ({rate:.2f} req/s)**, every "
        "policy requests of the same lengths and prefix sharing at the same offsets (words of its own, so no policy "
        f"finds another's prompts in the prefix cache), each ending {r['drain_s']:g} s after the last arrival.",
        "",
        f"SLO: end-to-end ≤ {r['slo_s']:g} s"
        + (f", sent as `x-spillover-deadline-ms: {round(r['slo_s'] * 1000)}`" if r["send_deadline"] else "")
        + f". Cloud prices: ${prices['in_per_mtok']:g} / ${prices['out_per_mtok']:g} per million tokens in / out; "
        "a local answer costs nothing here.",
        "",
        "| policy | what | sent | in SLO | SLO attainment | cloud share | cloud spend $ | unanswered | errors "
        "| TTFT p50 s | e2e p50 s | e2e p95 s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for p in r["policies"]:
        m = p["metrics"]
        share = "–" if m["cloud_share"] is None else f"{m['cloud_share']:.1%}"
        codes = ", ".join(f"{code} ×{n}" for code, n in sorted(m["error_codes"].items())) or "0"
        lines.append(
            f"| {p['label']} | {p['description']} | {m['sent']} | {m['in_slo']} | {m['slo_attainment']:.1%} | "
            f"{share} | {m['spend_usd']:.5f} | {m['unanswered']} | {codes} | {_s(m['ttft_p50_s'])} | "
            f"{_s(m['e2e_p50_s'])} | {_s(m['e2e_p95_s'])} |"
        )
    b = r["offline_bound"]
    if b is not None:
        where = f" (the window {b['window'][0]:.1f}–{b['window'][1]:.1f} s asks the most)" if b["window"] else ""
        lines += [
            "",
            f"Offline lower bound (bench/replay/bound.py, the fit in `{b['perf_from']}`, {b['replicas']} replica(s)): "
            f"no scheduler meets the SLO for every request with fewer than **{b['requests']} requests "
            f"({b['share']:.1%})** in the cloud — {b['too_slow_alone']} too slow even alone{where}; {b['method']}.",
        ]
        schedule = b.get("clairvoyant")
        if schedule is not None:
            lines += [
                "",
                f"A clairvoyant schedule (bench/replay/clairvoyant.py: {schedule['method']}) meets the SLO with "
                f"**{schedule['requests']} requests ({schedule['share']:.1%})** in the cloud: the fewest any scheduler "
                f"needs under this fit lies between {b['share']:.1%} and {schedule['share']:.1%}.",
            ]
    lines += [
        "",
        "SLO attainment counts every request sent: an error or a request unanswered when its policy's time ran "
        "out misses. Per-request rows: `requests-<policy>.csv` and results.json.",
    ]
    if r.get("merged_from"):
        lines += [
            "",
            "Merged (`bench replay --merge`) from the runs in: " + ", ".join(f"`{m}`" for m in r["merged_from"]),
        ]
    lines += environment_and_plots(r["environment"], plots)
    return "\n".join(lines) + "\n"


def plot_curve(r: dict[str, Any], path: Path) -> Path:
    fig = Figure(figsize=(7, 4.2), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for p in r["policies"]:
        m = p["metrics"]
        ax.scatter([m["spend_usd"]], [m["slo_attainment"]], s=40)
        share = "–" if m["cloud_share"] is None else f"{m['cloud_share']:.0%}"
        ax.annotate(f"{p['label']} (cloud {share})", (m["spend_usd"], m["slo_attainment"]),
                    textcoords="offset points", xytext=(4, 4), fontsize="small")  # fmt: skip
    ax.set_xlabel("cloud spend (USD)")
    ax.set_ylabel(f"SLO attainment (e2e ≤ {r['slo_s']:g} s)")
    ax.set_title(f"SLO attainment vs cloud spend — {r['window']['requests']} requests")
    ax.set_ylim(-0.02, 1.05)
    ax.set_xlim(left=0)
    ax.grid(True, alpha=0.3)
    fig.savefig(path)
    return path
