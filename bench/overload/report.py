"""The record of one overload run (`bench overload`), written to a directory:

results.json    everything: inputs (knee μ, multiples, modes, duration, drain, SLO, deadline, workload,
                prices, seed), environment, per mode and level the metrics and every request
report.md       for reading: a table per mode, a paragraph comparing burst with local_only, and one
                comparing the measured cloud share with the minimum max(0, (λ − μ)/λ)
*.png           `bench.overload.plots`: p95, SLO attainment and cloud share vs offered load
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from bench.calibrate.report import environment_and_plots
from bench.overload.metrics import LevelMetrics, OverloadLevel, OverloadRun

NEAR_POINTS = 0.05  # a cloud share within 5 points of the minimum is "at the minimum"


def write_overload_report(run: OverloadRun, out_dir: Path) -> dict[str, Path]:
    """Write results.json, report.md and the plots into `out_dir` (created); their paths by name."""
    from bench.overload.plots import write_plots  # matplotlib: only when writing

    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"results.json": out_dir / "results.json", "report.md": out_dir / "report.md"}
    paths["results.json"].write_text(json.dumps(run.to_dict(), indent=2) + "\n")
    plots = write_plots(run, out_dir)
    paths.update(plots)
    paths["report.md"].write_text(render_markdown(run, plots))
    return paths


def _s(value: float | None) -> str:
    return "–" if value is None else f"{value:.3g}"


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{value:.0%}"


def _signed(value: float | None) -> str:
    return "–" if value is None else f"{value:+.3g}"


def _codes(m: LevelMetrics) -> str:
    codes = [f"{code} ×{n}" for code, n in sorted(m.error_codes.items())]
    return ", ".join(codes + ([f"cancelled ×{m.cancelled}"] if m.cancelled else [])) or "none"


def render_markdown(run: OverloadRun, plots: Iterable[str] = ()) -> str:
    w = run.workload
    deadline = (
        f"with `x-spillover-deadline-ms: {run.deadline_ms}`"
        if run.deadline_ms
        else "without a deadline header (the gateway's admission.queue_timeout_s bounds the wait)"
    )
    lines = [
        f"# Overload of `{run.model}` — {run.name}",
        "",
        f"Started {run.started_at}; gateway {run.url}; seed {run.seed}.",
        "",
        f"Open loop: Poisson arrivals at λ = multiple × μ, μ = {run.knee_rps:g} req/s (the measured knee), "
        f"multiples {', '.join(f'{m:g}' for m in run.multiples)}; {run.duration_s:g} s of arrivals per level "
        f"(at most {run.max_requests} requests), then {run.drain_s:g} s to drain (requests still running then are "
        f"cancelled and count as misses). Workload: prompt `{w.prompt}` words, output `{w.output}` tokens. "
        f"SLO: e2e ≤ {run.slo_s:g} s per request; SLO attainment = OK answers within the SLO / offered requests. "
        f"Mode `burst` sends plain requests; mode `local_only` sends `x-spillover-residency: local_only` {deadline}. "
        f"Cloud share = OK answers with `x-spillover-route: cloud` / OK answers; cost at "
        f"${run.price_in:g} / ${run.price_out:g} per 1M input / output tokens of the cloud answers' usage.",
    ]
    for mode in run.modes:
        lines += ["", f"## Mode `{mode}`", "", *_table(run.of(mode))]
    lines += ["", "## Burst vs local_only", "", *compare_modes(run)]
    lines += ["", "## Cloud share vs the minimum", "", *compare_cloud_share(run)]
    lines += environment_and_plots(run.environment, plots)
    return "\n".join(lines) + "\n"


def _table(levels: list[OverloadLevel]) -> list[str]:
    rows = [
        "| multiple | λ (req/s) | offered | measured λ | OK | in SLO | SLO attainment | goodput (req/s) | e2e p50 | "
        "e2e p95 | errors | routes local / cloud / unknown | cloud share | min cloud share | cloud cost (USD) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for level in levels:
        m = level.metrics
        r = m.routes
        cost = f"{m.cost_usd:.4f}" + (f" (+{m.unpriced_cloud} without usage)" if m.unpriced_cloud else "")
        rows.append(
            f"| {level.multiple:g}× | {level.rate_rps:.3g} | {m.offered} | {m.offered_rate_rps:.3g} | {m.ok} | "
            f"{m.in_slo} | {_pct(m.slo_attainment)} | {m.goodput_rps:.3g} | {_s(m.e2e_p50_s)} | {_s(m.e2e_p95_s)} | "
            f"{_codes(m)} | {r['local']} / {r['cloud']} / {r['unknown']} | {_pct(m.cloud_share)} | "
            f"{_pct(m.min_cloud_share)} | {cost} |"
        )
    rows.append("\nLatencies in seconds, over the OK answers; goodput = answers within the SLO per second of arrivals.")
    return rows


def _mean(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known else None


def compare_modes(run: OverloadRun) -> list[str]:
    """A paragraph (and a line per multiple) on SLO attainment and p95 of burst vs local_only."""
    if "burst" not in run.modes or "local_only" not in run.modes:
        return [f"Only mode `{run.modes[0]}` was run: nothing to compare."]
    burst = {lv.multiple: lv.metrics for lv in run.of("burst")}
    local = {lv.multiple: lv.metrics for lv in run.of("local_only")}
    under = [m for m in run.multiples if m <= 1]
    over = [m for m in run.multiples if m > 1]
    text = []
    if under:
        text.append(
            f"At or below the knee (≤ 1×μ) local capacity should suffice: SLO attainment averaged "
            f"{_pct(_mean([burst[m].slo_attainment for m in under]))} with burst and "
            f"{_pct(_mean([local[m].slo_attainment for m in under]))} with local_only."
        )
    if over:
        top = max(over)
        b, lo = burst[top], local[top]
        gain = _mean([burst[m].goodput_rps - local[m].goodput_rps for m in over])
        text.append(
            f"Above the knee a share (λ − μ)/λ of the load cannot be served locally: at {top:g}×μ burst answered "
            f"{_pct(b.slo_attainment)} of the offered requests within the SLO (p95 {_s(b.e2e_p95_s)} s, "
            f"{_pct(b.cloud_share)} from the cloud), local_only {_pct(lo.slo_attainment)} (p95 {_s(lo.e2e_p95_s)} s "
            f"of the answered ones; errors: {_codes(lo)}). Over the levels above the knee bursting changed the "
            f"goodput (answers within the SLO per second) by {_signed(gain)} req/s on average, at a cloud cost of "
            f"${sum(burst[m].cost_usd for m in over):.4f}."
        )
    if not text:
        text.append("No level ran.")
    lines = [" ".join(text), ""]
    for m in run.multiples:
        b, lo = burst[m], local[m]
        delta = (
            "–"
            if b.slo_attainment is None or lo.slo_attainment is None
            else f"{(b.slo_attainment - lo.slo_attainment) * 100:+.0f} points"
        )
        lines.append(
            f"- {m:g}×μ: SLO attainment burst {_pct(b.slo_attainment)} vs local_only {_pct(lo.slo_attainment)} "
            f"({delta}); e2e p95 {_s(b.e2e_p95_s)} s vs {_s(lo.e2e_p95_s)} s; errors {_codes(b)} vs {_codes(lo)}."
        )
    return lines


def compare_cloud_share(run: OverloadRun) -> list[str]:
    """Each burst level's cloud share next to max(0, (λ − μ)/λ), and a check that local_only stayed local."""
    lines = []
    if not run.has_routes:
        lines.append(
            "No answer carried `x-spillover-route`, so every answer's route is unknown and the cloud share is "
            "counted as 0: the URL is not a spillover gateway (or something stripped the header), and the cloud "
            "share cannot be compared with the minimum."
        )
    elif "burst" in run.modes:
        lines.append(
            "With a local capacity of μ req/s, at least max(0, (λ − μ)/λ) of an offered load λ must go to the "
            f"cloud to be answered at all. A share {NEAR_POINTS * 100:.0f}+ points above it means the gateway "
            "spilled requests local could have served (it bursts on saturation signals — admission limit, KV and "
            "queue watermarks — which can trip before throughput reaches μ, e.g. during Poisson bursts); a share "
            "below it means local answered more than μ (μ, an SLO-bound knee, is conservative) or answers queued "
            "past the SLO instead of bursting."
        )
        lines.append("")
        for level in run.of("burst"):
            m = level.metrics
            if m.cloud_share is None:
                verdict = "no OK answer"
            else:
                diff = m.cloud_share - m.min_cloud_share
                side = "at" if abs(diff) <= NEAR_POINTS else ("above" if diff > 0 else "below")
                verdict = f"{diff * 100:+.0f} points, {side} the minimum"
            lines.append(
                f"- {level.multiple:g}×μ (λ = {level.rate_rps:.3g} req/s): cloud share {_pct(m.cloud_share)} vs "
                f"minimum {_pct(m.min_cloud_share)} — {verdict}."
            )
        excess = _mean(
            [lv.metrics.cloud_share - lv.metrics.min_cloud_share for lv in run.of("burst") if lv.metrics.cloud_share]
        )
        if excess is not None:
            lines += ["", f"Mean cloud share above the minimum over the levels that burst: {excess * 100:+.0f} points."]
    else:
        lines.append("Mode `burst` was not run: no cloud share to compare.")
    leaked = sum(lv.metrics.routes["cloud"] for lv in run.of("local_only"))
    if leaked:
        lines += ["", f"**Warning:** {leaked} `local_only` answers were routed to the cloud: residency was broken."]
    elif "local_only" in run.modes and run.has_routes:
        lines += ["", "Every `local_only` answer stayed local (route `local`), as residency requires."]
    return lines
