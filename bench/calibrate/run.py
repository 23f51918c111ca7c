"""`bench calibrate`: measure the knee of a model and of the layer above it, compare it with the
capacity formula, and write the recommended admission limit as a config overlay.

    1. check the inputs (exit 2 when bad) and that every URL answers `GET models` and serves the
       model (exit 1 when a URL is unreachable, 2 when the model is not served there)
    2. the formula's prediction for the model from the config (`bench.calibrate.formula`, the path of
       `spillover capacity`)
    3. stage "model" against `direct_url` (when given), then stage "gateway" against `url`:
       a closed-loop concurrency sweep each (`bench.calibrate.sweep`), knee per stage (`bench.calibrate.knee`)
    4. recommendation: the knee of the first stage (the model itself)
       divided by the model's replicas; written as an overlay `{"models": [{"alias", "admission_limit"}]}`
       with a comment header saying where it came from
    5. with `fit_shapes`: the compute model fitted from a small design of runs and checked on
       `holdout_shapes` (bench/calibrate/fit.py); the overlay then also carries `perf` (the fitted parameters,
       the SLO and the knees measured), so the gateway's limit follows the workload
    6. the report directory (`bench.calibrate.report`), and a short summary on stdout

Programmatic use: `calibrate(CalibrateOptions(url=..., model=..., ...))` → `CalibrationOutcome`
(raises `CalibrationError`, which carries the exit code); `transport_for(url)` injects an httpx
transport per URL (tests), `now` the wall clock for names and stamps.
"""

from __future__ import annotations

import asyncio
import random
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

import httpx
import yaml

from bench.calibrate.fit import ComputeOutcome, fit_outcome, parse_shapes, perf_overlay, run_fit_design
from bench.calibrate.fit_report import compute_summary
from bench.calibrate.formula import FormulaPrediction, GpuReaderFactory, predict
from bench.calibrate.holdout import resolve_knee, run_holdouts
from bench.calibrate.knee import DEFAULT_MAX_ERROR_RATE
from bench.calibrate.report import CalibrationRun, environment, write_report
from bench.calibrate.sweep import LatencyMetric, StageResult, SweepPlan, run_stage
from bench.load.loadgen import BadBaseUrl, LoadGenerator, check_base_url, make_client
from bench.load.progress import LineProgress, NullProgress, ProgressSink
from bench.load.target import BenchError, api_key_from_env, preflight
from bench.load.workload import LengthDist, RequestFactory, WorkloadError, WorkloadSpec
from cluster.capacity.compute_fit import FitError
from cluster.capacity.engine_sim import EngineLimits, default_limits
from cluster.config.deployment import load_config
from cluster.config.perf import PerfSection
from cluster.hardware.nvml import PynvmlReader
from router.errors import ConfigError

TransportFor = Callable[[str], httpx.AsyncBaseTransport | None]


class CalibrationError(BenchError):
    pass


@dataclass(frozen=True)
class CalibrateOptions:
    url: str
    model: str
    direct_url: str | None = None
    direct_model: str | None = None
    concurrency: tuple[int, ...] = (1, 2, 4, 8)
    requests_per_level: int = 20
    warmup: int = 2
    prompt: str = "fixed:256"
    output: str = "fixed:64"
    prefix_share: float = 0.0
    prefix_count: int = 4
    slo_p95_s: float = 5.0
    slo_metric: LatencyMetric = "e2e"
    max_error_rate: float = DEFAULT_MAX_ERROR_RATE
    config_path: str | None = None
    gpu_mem: str | None = None
    out_dir: str | None = None
    overlay_out: str | None = None
    seed: int = 0
    progress: bool = True
    request_timeout_s: float = 300.0
    level_time_limit_s: float = 600.0
    keep_going: bool = False
    ignore_eos: bool = False
    api_key_env: str | None = None
    extra_body: dict[str, Any] = field(default_factory=dict)
    fit_shapes: str | None = None  # "600x8,50x32": fit the compute model (bench/calibrate/fit.py)
    fit_concurrency: tuple[int, ...] = (1, 2, 4)
    fit_requests_per_level: int = 4
    holdout_shapes: str | None = None  # "150x48,450x24": held out of the fit, knee predicted and measured
    holdout_requests_per_level: int | None = None  # default 8 (and waves × N)
    waves: int | None = None  # requests at N >= waves × N; default: 0 for the main and fit sweeps, 4 held out


@dataclass(frozen=True)
class CalibrationOutcome:
    run: CalibrationRun
    paths: dict[str, Path]
    overlay_path: Path | None

    @property
    def exit_code(self) -> int:
        fit_failed = self.run.compute_error is not None
        return 0 if self.run.recommended_limit is not None and not fit_failed else 1


def calibrate(options: CalibrateOptions, **kwargs: Any) -> CalibrationOutcome:
    """Run a calibration (see the module docstring); keyword arguments go to `calibrate_async`."""
    return asyncio.run(calibrate_async(options, **kwargs))


async def calibrate_async(
    options: CalibrateOptions,
    *,
    transport_for: TransportFor = lambda url: None,
    now: Callable[[], datetime] = lambda: datetime.now(UTC),
    stderr: TextIO = sys.stderr,
    gpu_reader: GpuReaderFactory = PynvmlReader,
) -> CalibrationOutcome:
    workload, plan = _inputs(options)
    fit_shapes, holdout_shapes, fit_plan = _fit_inputs(options, plan)
    started = now()
    stages = [("model", options.direct_url, options.direct_model or options.model)] if options.direct_url else []
    stages.append(("gateway", options.url, options.model))
    stages = [(name, _url(url), model) for name, url, model in stages if url]
    prediction = None
    limits = EngineLimits()
    if options.config_path:
        try:
            config = load_config(options.config_path)
        except ConfigError as exc:
            raise CalibrationError(exc.message, 2) from None
        gpu_mem = _gpu_mem(options.gpu_mem)
        prediction = predict(config, options.model, workload, gpu_mem=gpu_mem, gpu_reader=gpu_reader)
        if (spec := config.model(options.model)) is not None:
            limits = default_limits(spec.accelerator, spec.engine_args, gpu_mem / 2**30 if gpu_mem else None)
    api_key = api_key_from_env(options.api_key_env, CalibrationError)
    extra = {**({"ignore_eos": True} if options.ignore_eos else {}), **options.extra_body}
    progress: ProgressSink = LineProgress(stderr) if options.progress else NullProgress()
    factory = RequestFactory(workload, random.Random(options.seed))
    results: list[StageResult] = []
    compute: ComputeOutcome | None = None
    compute_error: str | None = None
    clients = {url: make_client(url, transport=transport_for(url), api_key=api_key) for _, url, _ in stages}
    engine: dict[str, Any] | None = None
    try:
        for _name, url, model in stages:
            await preflight(clients[url], url, model, CalibrationError)
        engine = await engine_of(clients[stages[-1][1]], options.model)
        for name, url, model in stages:
            generator = LoadGenerator(
                clients[url], model, progress=progress, extra_body=extra, request_timeout_s=options.request_timeout_s
            )
            results.append(await run_stage(name, url, model, generator, factory, plan))
        if fit_plan is not None:  # against the last stage's URL: the layer whose admission limit is set
            results[-1] = await resolve_knee(results[-1], generator, factory)
            designed = await run_fit_design(generator, url, model, fit_shapes, fit_plan, options.seed)
            try:
                compute = fit_outcome(designed, (results[-1], workload), plan, limits)
            except FitError as exc:
                compute_error = str(exc)
            if compute is not None and holdout_shapes:
                held = await run_holdouts(
                    generator,
                    url,
                    model,
                    holdout_shapes,
                    plan,
                    compute,
                    requests_per_level=options.holdout_requests_per_level,
                    waves=options.waves,
                    seed=options.seed,
                )
                compute = replace(compute, holdouts=held)
    finally:
        for client in clients.values():
            await client.aclose()
    run_name = f"calibrate-{_slug(options.model)}-{started:%Y%m%d-%H%M%S}"
    out_dir = Path(options.out_dir) if options.out_dir else Path("bench/results") / run_name
    limit, why = _recommend(results, prediction)
    overlay = None
    if limit is not None:
        overlay = Path(options.overlay_out) if options.overlay_out else out_dir / "overlay.yaml"
    run = CalibrationRun(
        name=out_dir.name,
        model=options.model,
        started_at=started.isoformat(timespec="seconds"),
        workload=workload,
        plan=plan,
        stages=tuple(results),
        prediction=prediction,
        seed=options.seed,
        config_path=options.config_path,
        environment={**environment(), **({"engine": engine} if engine else {})},
        recommended_limit=limit,
        recommendation=why,
        overlay_path=str(overlay) if overlay else None,
        compute=compute,
        compute_error=compute_error,
    )
    paths = write_report(run, out_dir)
    if overlay is not None and limit is not None:
        write_overlay(overlay, run, limit, report=paths["report.md"])
    return CalibrationOutcome(run, paths, overlay)


def _inputs(options: CalibrateOptions) -> tuple[WorkloadSpec, SweepPlan]:
    try:
        workload = WorkloadSpec(
            prompt=LengthDist.parse(options.prompt),
            output=LengthDist.parse(options.output),
            prefix_share=options.prefix_share,
            prefix_count=options.prefix_count,
        )
        plan = SweepPlan(
            concurrency=tuple(options.concurrency),
            requests_per_level=options.requests_per_level,
            warmup=options.warmup,
            slo_p95_s=options.slo_p95_s,
            slo_metric=options.slo_metric,
            max_error_rate=options.max_error_rate,
            level_time_limit_s=options.level_time_limit_s,
            stop_after_breach=not options.keep_going,
            waves=options.waves or 0,
        )
    except (WorkloadError, ValueError) as exc:
        raise CalibrationError(str(exc), 2) from None
    return workload, plan


def _fit_inputs(
    options: CalibrateOptions, plan: SweepPlan
) -> tuple[tuple[str, ...], tuple[str, ...], SweepPlan | None]:
    if options.fit_shapes is None:
        if options.holdout_shapes is not None:
            raise CalibrationError("--holdout-shapes needs --fit-shapes (held-out shapes check a fit)", 2)
        return (), (), None
    try:
        fit_shapes = parse_shapes(options.fit_shapes)
        holdout = parse_shapes(options.holdout_shapes) if options.holdout_shapes is not None else ()
        fit_plan = SweepPlan(
            concurrency=tuple(options.fit_concurrency),
            requests_per_level=options.fit_requests_per_level,
            warmup=min(plan.warmup, 1),
            slo_p95_s=plan.slo_p95_s,
            slo_metric=plan.slo_metric,
            max_error_rate=plan.max_error_rate,
            level_time_limit_s=plan.level_time_limit_s,
            stop_after_breach=False,
            waves=plan.waves,
        )
    except (WorkloadError, ValueError) as exc:
        raise CalibrationError(str(exc), 2) from None
    if set(holdout) & set(fit_shapes):
        raise CalibrationError("a held-out shape must not also be a fit shape", 2)
    return fit_shapes, holdout, fit_plan


def _url(url: str) -> str:
    try:
        return check_base_url(url)
    except BadBaseUrl as exc:
        raise CalibrationError(str(exc), 2) from None


def _gpu_mem(text: str | None) -> int | None:
    from cluster.capacity.memory import parse_bytes

    try:
        return None if text is None else parse_bytes(text)
    except ValueError as exc:
        raise CalibrationError(f"--gpu-mem: {exc}", 2) from None


def _recommend(stages: list[StageResult], prediction: FormulaPrediction | None) -> tuple[int | None, str]:
    first = stages[0]
    knee = first.knee.concurrency
    if knee is None:
        return None, f"stage {first.name}: {first.knee.explanation}"
    replicas = prediction.replicas if prediction and prediction.ok else 1
    per_replica = max(1, knee // replicas)
    why = f"knee {knee} of stage {first.name} ({first.url})"
    if replicas > 1:
        why += f" ÷ {replicas} replicas"
    return per_replica, why


async def engine_of(client: httpx.AsyncClient, model: str) -> dict[str, Any] | None:
    """The precision and CPU class the gateway's replica of `model` reports (None: not a spillover gateway,
    no such replica, or the operator route is refused)."""
    try:
        base = str(client.base_url).rstrip("/").removesuffix("/v1")
        response = await client.get(f"{base}/v1/spillover/cluster", timeout=10)
        replicas = response.json().get("replicas", []) if response.status_code == 200 else []
    except (httpx.HTTPError, ValueError, AttributeError):
        return None
    for replica in replicas:
        if replica.get("model") == model and replica.get("precision") and not replica.get("stale"):
            return {"precision": replica["precision"], "cpu_class": replica.get("cpu_class")}
    return None


def write_overlay(path: Path, run: CalibrationRun, limit: int, *, report: Path | None = None) -> Path:
    """The YAML overlay `{"models": [{"alias": model, "admission_limit": limit}]}` with a header."""
    plan, w = run.plan, run.workload
    predicted = run.prediction.admission_limit if run.prediction else None
    header = [
        f"# admission-limit overlay written by `python -m bench calibrate` at {run.started_at}",
        f"# {run.model}: {run.recommendation}",
        f"# SLO {plan.slo_metric} p95 <= {plan.slo_p95_s:g} s, error rate <= {plan.max_error_rate:.1%}; "
        f"workload prompt {w.prompt}, output {w.output}, prefix share {w.prefix_share:g}; seed {run.seed}",
        f"# formula's admission limit per replica: {predicted if predicted is not None else 'none (no prediction)'}",
        f"# report: {report or '(not written)'}; merge into the models[] entry with this alias",
    ]
    entry: dict[str, Any] = {"alias": run.model, "admission_limit": limit}
    if run.compute is not None:
        cpus = run.environment.get("cpu_count", "?")
        fitted = f"bench calibrate {run.started_at}, {cpus} CPUs, report {report or run.name}"
        entry["perf"] = perf_overlay(run.compute, run.stages[-1], fitted)
        # where it was measured: the gateway uses a fit only on replicas of that CPU class and precision
        engine, cpu = run.environment.get("engine") or {}, run.environment.get("cpu") or {}
        if cpu_class := engine.get("cpu_class") or cpu.get("class"):
            entry["perf"]["cpu"] = cpu_class
        if engine.get("precision"):
            entry["perf"]["precision"] = engine["precision"]
        PerfSection.model_validate(entry["perf"])  # what it writes must load
        header.append("# perf: the fitted compute model; with it the gateway's limit follows the live workload")
    body = yaml.safe_dump({"models": [entry]}, sort_keys=False, allow_unicode=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(header) + "\n" + body)
    return path


def summary_lines(outcome: CalibrationOutcome) -> list[str]:
    run = outcome.run
    lines = [f"calibrate {run.model}:"]
    for stage in run.stages:
        knee = stage.knee
        lines.append(f"  stage {stage.name} ({stage.url}): knee {knee.concurrency} [bound: {knee.bound}]")
        lines.append(f"    {knee.explanation}")
    prediction = run.prediction
    if prediction is not None and prediction.report is not None:
        lines.append(
            f"  formula: admission limit {prediction.admission_limit_total} "
            f"(KV max {prediction.kv_limit_total}, {prediction.replicas} replica(s), "
            f"KV budget from {prediction.report.kv_source})"
        )
        for stage in run.stages:
            lines.append(f"    {stage.name}: {run.comparison(stage).sentence} Binding bound: {run.bound(stage)}.")
    elif prediction is not None:
        lines.append(f"  formula: no prediction ({prediction.status}): {'; '.join(prediction.notes)}")
    lines += compute_summary(run.compute, run.compute_error)
    if run.recommended_limit is not None:
        lines.append(f"  recommended admission_limit: {run.recommended_limit} per replica ({run.recommendation})")
        lines.append(f"  overlay: {outcome.overlay_path}")
    else:
        lines.append(f"  no admission limit recommended: {run.recommendation}")
    lines.append(f"  report: {outcome.paths['report.md']}")
    return lines


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-") or "model"
