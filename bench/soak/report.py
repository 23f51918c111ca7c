"""The record of a `bench soak` run, written to a directory (bench/calibrate/report.py's conventions):

results.json    everything: options, every request, every process sample, the replicas' numerics per
                sample, the fault episodes, windows, growth per process, verdicts, environment
report.md       the verdict lines, totals, a table per window (requests, errors, lost, wrong, e2e and
                TTFT p50 / p99), a table per process (RSS and FDs in the second and last window and
                their growth), the replicas' precision and numerics over time, the fault episodes
soak_rss.png, soak_fds.png, soak_p99.png   bench/soak/plots.py
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from bench.calibrate.report import environment_and_plots, write_results
from bench.soak.metrics import MIB, Growth, Verdict, Window, growth, verdicts, windows
from bench.soak.run import SoakState


@dataclass(frozen=True)
class SoakRun:
    options: dict[str, Any]
    started_at: str
    state: SoakState
    bounds: list[tuple[float, float]]
    environment: dict[str, Any]

    @cached_property
    def windows(self) -> list[Window]:
        return windows(self.state.requests, self.bounds)

    @cached_property
    def growths(self) -> list[Growth]:
        return growth(self.state.samples, self.bounds, limit=self.options["growth_limit"])

    @cached_property
    def verdicts(self) -> list[Verdict]:
        return verdicts(
            self.windows, self.growths, limit=self.options["growth_limit"], p99_ratio=self.options["p99_ratio"]
        )

    def totals(self) -> dict[str, Any]:
        reqs = self.state.requests
        load = [r for r in reqs if r.kind != "probe"]
        failed = [r for r in reqs if not r.result.ok and not r.result.cancelled]
        return {
            "requests": len(load),
            "streamed": sum(1 for r in load if r.kind == "stream"),
            "cloud_pinned": sum(1 for r in load if r.share == "cloud"),
            "routed_cloud": sum(1 for r in load if r.result.ok and (r.result.route or "").lower() == "cloud"),
            "ok": sum(1 for r in load if r.result.ok),
            "errors": len(failed),
            "error_codes": dict(Counter(r.result.error or "?" for r in failed)),
            "lost": sum(1 for r in reqs if r.lost),
            "cancelled": sum(1 for r in reqs if r.result.cancelled),
            "probes": sum(1 for r in reqs if r.kind == "probe"),
            "wrong": sum(1 for r in reqs if r.wrong),
            "first_probe_answer": next((r.answer for r in reqs if r.kind == "probe" and r.answer is not None), None),
        }

    def to_dict(self) -> dict[str, Any]:
        s = self.state
        return {
            "started_at": self.started_at,
            "options": self.options,
            "end_s": s.end_s,
            "interrupted": s.interrupted,
            "totals": self.totals(),
            "verdicts": [v.to_dict() for v in self.verdicts],
            "windows": [w.to_dict() for w in self.windows],
            "growth": [g.to_dict() for g in self.growths],
            "fault_episodes": [e.to_dict() for e in s.episodes],
            "replicas": s.replicas,
            "samples": [
                {"t": round(p.t, 2), "role": p.role, "pid": p.pid, "rss_bytes": p.rss_bytes, "fds": p.fds}
                for p in s.samples
            ],
            "requests": [r.to_dict() for r in s.requests],
            "environment": self.environment,
        }


def _s(value: float | None) -> str:
    return "–" if value is None else f"{value:.3g}"


def _signed(value: float | None) -> str:
    return "–" if value is None else f"{value:+.1%}"


def _mib(value: float | None) -> str:
    return "–" if value is None else f"{value / MIB:.1f}"


def render_markdown(run: SoakRun, plots: list[str]) -> str:
    o, s, t = run.options, run.state, run.totals()
    mix, faults = o["mix"], o["faults"]
    lines = [
        f"# Soak — `{o['model']}` through {o['url']}",
        "",
        f"Started {run.started_at}; ran {s.end_s:.0f} s of {o['duration_s']:g} s"
        + (f" (stopped by {s.interrupted})" if s.interrupted else "")
        + f". Closed loop of {o['concurrency']} ({o['concurrency_source']}): prompts `{o['prompt']}` words, "
        f"max_tokens `{o['output']}`, {o['prefix_share']:.0%} with a shared system prompt; "
        f"{mix['stream_share']:.0%} streamed; {mix['cloud_share']:.0%} pinned to the cloud region "
        f"`{mix['cloud_region']}` (`x-spillover-residency`), the others plain. A probe (`{mix['probe_prompt']}`, "
        f"temperature 0, local_only) every {o['probe_every_s']:g} s. "
        + (
            f"Faults in the cloud simulator {o['sim_url']}: {', '.join(faults['faults'])} in turn, rate "
            f"{faults['rate']:g} for {faults['duration_s']:g} s every {faults['every_s']:g} s (at most "
            f"{faults['max_episodes']})."
            if o["sim_url"]
            else "No faults (no --sim)."
        )
        + f" Samples every {o['sample_s']:g} s, windows of {o['window_s']:g} s (window 0 is the warm-up).",
        "",
        "## Verdicts",
        "",
        *(f"- **{'PASS' if v.passed else 'FAIL'}** {v.line}" for v in run.verdicts),
        "",
        "Growth: per process, the median of its samples in the last window against the second, RSS and open "
        f"FDs each under {o['growth_limit']:.0%} (or within 8 MiB / 2 descriptors); a process of the stack gone "
        "after the second window fails it. p99: e2e of the OK answers (probes left out), last window ≤ "
        f"×{o['p99_ratio']:g} the second. Lost: no answer and no error (connection refused or reset, timeout, "
        "a body or stream that ended incomplete without an error event). Wrong: a probe answer that differs "
        "from the first.",
        "",
        "## Totals",
        "",
        f"{t['requests']} requests ({t['streamed']} streamed, {t['cloud_pinned']} pinned to the cloud; "
        f"{t['routed_cloud']} answered by the cloud), {t['ok']} OK, {t['errors']} errors"
        + (f" ({', '.join(f'{k} ×{n}' for k, n in sorted(t['error_codes'].items()))})" if t["error_codes"] else "")
        + f", {t['lost']} lost, {t['cancelled']} cancelled at the end; {t['probes']} probes, {t['wrong']} wrong "
        f"(first answer: {t['first_probe_answer']!r}).",
        "",
        "## Windows",
        "",
        "| window | s | requests | OK | errors | lost | probes (wrong) | cloud | e2e p50 | e2e p99 | TTFT p50 | "
        "TTFT p99 | error codes |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for w in run.windows:
        codes = ", ".join(f"{k} ×{n}" for k, n in sorted(w.error_codes.items())) or "–"
        lines.append(
            f"| {w.index} | {w.start_s:.0f}–{w.end_s:.0f} | {w.requests} | {w.ok} | {w.errors} | {w.lost} | "
            f"{w.probes} ({w.wrong}) | {w.cloud} | {_s(w.e2e_p50_s)} | {_s(w.e2e_p99_s)} | "
            f"{_s(w.ttft_p50_s)} | {_s(w.ttft_p99_s)} | {codes} |"
        )
    lines += ["", "Latencies in seconds; a request counts in the window it ended in.", "", "## Processes", ""]
    lines += _process_lines(run)
    lines += ["", "## Replicas: precision and numerics", "", *_replica_lines(s.replicas)]
    if s.episodes:
        lines += ["", "## Fault episodes", "", "| # | fault | from s | to s | control API |", "|---|---|---|---|---|"]
        lines += [
            f"| {e.index} | {e.fault} | {e.start_s:.1f} | {e.end_s:.1f} | {e.error or 'ok'} |" for e in s.episodes
        ]
    lines += environment_and_plots(run.environment, plots)
    return "\n".join(lines) + "\n"


def _process_lines(run: SoakRun) -> list[str]:
    if not run.growths:
        roles = sorted({p.role for p in run.state.samples})
        return [f"Too few windows to judge growth; sampled: {', '.join(roles) or 'nothing'}."]
    lines = [
        "| process | RSS MiB, second window | last | growth | FDs, second | last | growth | verdict |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for g in sorted(run.growths, key=lambda g: -(g.rss_second or 0)):
        verdict = {True: "ok", False: "FAIL", None: "–"}[g.passed] + (
            "" if g.status == "measured" else f" ({g.status})"
        )
        lines.append(
            f"| {g.key} | {_mib(g.rss_second)} | {_mib(g.rss_last)} | {_signed(g.rss_growth)} | "
            f"{_s(g.fds_second)} | {_s(g.fds_last)} | {_signed(g.fds_growth)} | {verdict} |"
        )
    return lines


def _replica_lines(samples: list[dict[str, Any]]) -> list[str]:
    spans: dict[tuple[Any, ...], list[float]] = {}
    for sample in samples:
        for r in sample["replicas"]:
            key = (r.get("replica_id"), r.get("precision"), r.get("cpu_class"), r.get("numerics"), r.get("fault"))
            spans.setdefault(key, []).append(sample["t"])
    if not spans:
        return ["Not readable from `GET /v1/spillover/cluster` (no replica of the model listed)."]
    lines = [
        "| replica | precision | CPU class | numerics | fault | seen from s | to s | samples |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for (rid, precision, cpu, numerics, fault), ts in sorted(spans.items(), key=lambda kv: min(kv[1])):
        lines.append(
            f"| {rid} | {precision or '–'} | {cpu or '–'} | {numerics or '–'} | {fault or '–'} | "
            f"{min(ts):.0f} | {max(ts):.0f} | {len(ts)} |"
        )
    return lines


def write_soak_report(run: SoakRun, out_dir: Path) -> dict[str, Path]:
    from bench.soak.plots import write_plots  # matplotlib: only when writing

    out_dir.mkdir(parents=True, exist_ok=True)
    plots = write_plots(run, out_dir)
    paths = write_results(out_dir, run.to_dict(), render_markdown(run, list(plots)))
    return {**paths, **plots}


def summary_lines(outcome: Any) -> list[str]:
    run: SoakRun = outcome.run
    t = run.totals()
    lines = [
        f"soak {run.options['model']}: {run.state.end_s:.0f} s, {t['requests']} requests, {t['errors']} errors, "
        f"{t['lost']} lost, {t['probes']} probes, {t['wrong']} wrong"
    ]
    lines += [f"  {'PASS' if v.passed else 'FAIL'} {v.line}" for v in run.verdicts]
    lines.append(f"  report: {outcome.paths['report.md']}")
    return lines
