"""`bench overload`: offer open-loop Poisson load at multiples of the measured knee μ (req/s, from
`bench calibrate`) through the gateway, with bursting on and off, and measure what each costs.

    1. check the inputs (exit 2 when bad) and that the URL answers `GET models` and serves the model
       (exit 1 when unreachable, 2 when the model is not served there)
    2. for each mode, for each multiple m: λ = m × μ; Poisson arrivals at λ for `duration_s` (at most
       `max_requests` of them), sent whatever is in flight (`LoadGenerator.run_open`); the level ends
       `drain_s` after the last arrival could start (still in flight then: `cancelled`, a miss)
           burst        plain requests: the gateway may send them to the cloud when local is saturated
           local_only   `x-spillover-residency: local_only` on every request (bursting off: a request
                        waits for local room until its deadline, then 429 local_capacity_exhausted),
                        plus `x-spillover-deadline-ms` when `deadline_ms` is set
       both modes see the same arrival times per multiple; every request's prompt is new (no prefix
       cache hits across levels or modes); `cooldown_s` of quiet between levels
    3. per level (`bench.overload.metrics`): completed, errors by code, e2e p50/p95, SLO attainment,
       cloud share next to the minimal share max(0, (λ − μ)/λ), cloud cost from usage and prices
    4. the report directory (`bench.overload.report`): results.json, report.md, PNG plots

Programmatic use: `run_overload(OverloadOptions(...))` → `OverloadOutcome` (raises `OverloadError`,
which carries the exit code). Exit code 0 when something was answered, 1 when nothing was.
"""

from __future__ import annotations

import asyncio
import random
import re
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

import httpx

from bench.calibrate.report import environment
from bench.load.loadgen import BadBaseUrl, LoadGenerator, check_base_url, make_client
from bench.load.progress import LineProgress, NullProgress, ProgressSink
from bench.load.target import BenchError, api_key_from_env, preflight
from bench.load.workload import LengthDist, RequestFactory, WorkloadError, WorkloadSpec, poisson_arrivals
from bench.overload.metrics import MODES, OverloadLevel, OverloadRun, measure_level
from router import headers as hdr

RESIDENCY_HEADER = hdr.RESIDENCY
DEADLINE_HEADER = hdr.DEADLINE
DEFAULT_MULTIPLES = (0.5, 1.0, 1.5, 2.0, 3.0)
TransportFor = Callable[[str], httpx.AsyncBaseTransport | None]


class OverloadError(BenchError):
    pass


@dataclass(frozen=True)
class OverloadOptions:
    url: str
    model: str
    knee_rps: float
    multiples: tuple[float, ...] = DEFAULT_MULTIPLES
    duration_s: float = 30.0
    prompt: str = "fixed:200"
    output: str = "fixed:64"
    slo_p95_s: float = 10.0
    modes: tuple[str, ...] = MODES
    deadline_ms: int | None = None
    drain_s: float | None = None  # None: 2 × the SLO
    cooldown_s: float = 5.0
    max_requests: int = 2000
    price_in: float = 0.15
    price_out: float = 0.60
    out_dir: str | None = None
    seed: int = 0
    progress: bool = True
    request_timeout_s: float = 300.0
    ignore_eos: bool = False
    api_key_env: str | None = None

    @property
    def drain(self) -> float:
        return 2 * self.slo_p95_s if self.drain_s is None else self.drain_s


@dataclass(frozen=True)
class OverloadOutcome:
    run: OverloadRun
    paths: dict[str, Path]

    @property
    def exit_code(self) -> int:
        return 0 if any(level.metrics.ok for level in self.run.levels) else 1


def mode_headers(mode: str, deadline_ms: int | None = None) -> dict[str, str]:
    """The request headers of a mode: none for burst; residency (and the deadline) for local_only."""
    if mode == "burst":
        return {}
    if mode == "local_only":
        return {RESIDENCY_HEADER: "local_only", **({DEADLINE_HEADER: str(deadline_ms)} if deadline_ms else {})}
    raise ValueError(f"unknown mode {mode!r}: use {' or '.join(MODES)}")


def check_options(options: OverloadOptions) -> WorkloadSpec:
    """The workload; raises `OverloadError` (exit 2) for any bad input."""
    problems = []
    if options.knee_rps <= 0:
        problems.append(f"the knee must be > 0 req/s, got {options.knee_rps:g}")
    if not options.multiples or any(m <= 0 for m in options.multiples):
        problems.append("multiples must be > 0")
    elif len(set(options.multiples)) != len(options.multiples):
        problems.append("multiples must not repeat")
    if not options.modes or any(m not in MODES for m in options.modes) or len(set(options.modes)) < len(options.modes):
        problems.append(f"modes must be some of {', '.join(MODES)}, without repeats, got {', '.join(options.modes)}")
    positive = ("duration_s", "slo_p95_s", "request_timeout_s", "max_requests")
    problems += [f"{name} must be > 0" for name in positive if getattr(options, name) <= 0]
    non_negative = ("drain", "cooldown_s", "price_in", "price_out")
    problems += [f"{name} must be >= 0" for name in non_negative if getattr(options, name) < 0]
    if options.deadline_ms is not None and options.deadline_ms < 1:
        problems.append(f"the deadline must be >= 1 ms, got {options.deadline_ms}")
    if problems:
        raise OverloadError("; ".join(problems), 2)
    try:
        return WorkloadSpec(prompt=LengthDist.parse(options.prompt), output=LengthDist.parse(options.output))
    except WorkloadError as exc:
        raise OverloadError(str(exc), 2) from None


def run_overload(options: OverloadOptions, **kwargs: Any) -> OverloadOutcome:
    """Run an overload test (see the module docstring); keyword arguments go to `run_overload_async`."""
    return asyncio.run(run_overload_async(options, **kwargs))


async def run_overload_async(
    options: OverloadOptions,
    *,
    transport: httpx.AsyncBaseTransport | None = None,
    now: Callable[[], datetime] = lambda: datetime.now(UTC),
    stderr: TextIO = sys.stderr,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> OverloadOutcome:
    workload = check_options(options)
    try:
        url = check_base_url(options.url)
    except BadBaseUrl as exc:
        raise OverloadError(str(exc), 2) from None
    api_key = api_key_from_env(options.api_key_env, OverloadError)
    started = now()
    progress: ProgressSink = LineProgress(stderr) if options.progress else NullProgress()
    extra = {"ignore_eos": True} if options.ignore_eos else {}
    factory = RequestFactory(workload, random.Random(options.seed))
    levels: list[OverloadLevel] = []
    client = make_client(url, transport=transport, api_key=api_key, read_timeout_s=options.request_timeout_s)
    try:
        await preflight(client, url, options.model, OverloadError)
        base_headers = dict(client.headers)
        for mode in options.modes:
            client.headers = {**base_headers, **mode_headers(mode, options.deadline_ms)}
            for i, multiple in enumerate(options.multiples):
                if levels and options.cooldown_s > 0:
                    await sleep(options.cooldown_s)
                levels.append(await _level(client, options, factory, progress, extra, mode, i, multiple))
    finally:
        await client.aclose()
    name = f"overload-{_slug(options.model)}-{started:%Y%m%d-%H%M%S}"
    out_dir = Path(options.out_dir) if options.out_dir else Path("bench/results") / name
    run = OverloadRun(
        name=out_dir.name,
        model=options.model,
        url=url,
        started_at=started.isoformat(timespec="seconds"),
        knee_rps=options.knee_rps,
        multiples=tuple(options.multiples),
        modes=tuple(options.modes),
        duration_s=options.duration_s,
        drain_s=options.drain,
        slo_s=options.slo_p95_s,
        workload=workload,
        seed=options.seed,
        levels=tuple(levels),
        price_in=options.price_in,
        price_out=options.price_out,
        deadline_ms=options.deadline_ms,
        max_requests=options.max_requests,
        environment=environment(),
    )
    from bench.overload.report import write_overload_report  # matplotlib: only when writing

    return OverloadOutcome(run, write_overload_report(run, out_dir))


async def _level(
    client: httpx.AsyncClient,
    options: OverloadOptions,
    factory: RequestFactory,
    progress: ProgressSink,
    extra: dict[str, Any],
    mode: str,
    index: int,
    multiple: float,
) -> OverloadLevel:
    rate = multiple * options.knee_rps
    rng = random.Random(f"{options.seed}:arrivals:{index}")  # the same arrivals for every mode
    arrivals = poisson_arrivals(rate, rng, duration_s=options.duration_s, count=options.max_requests)
    items = factory.take(len(arrivals))
    generator = LoadGenerator(
        client, options.model, progress=progress, extra_body=extra, request_timeout_s=options.request_timeout_s
    )
    label = f"{mode} {multiple:g}×μ λ={rate:.3g}/s"
    results = await generator.run_open(items, arrivals, time_limit_s=options.duration_s + options.drain, label=label)
    metrics = measure_level(
        results,
        rate_rps=rate,
        knee_rps=options.knee_rps,
        slo_s=options.slo_p95_s,
        duration_s=options.duration_s,
        price_in=options.price_in,
        price_out=options.price_out,
    )
    return OverloadLevel(mode, multiple, rate, metrics, tuple(results))


def _share(value: float | None) -> str:
    return "–" if value is None else f"{value:.0%}"


def summary_lines(outcome: OverloadOutcome) -> list[str]:
    run = outcome.run
    lines = [f"overload {run.model} at {run.url}: knee μ = {run.knee_rps:g} req/s, SLO e2e ≤ {run.slo_s:g} s"]
    for mode in run.modes:
        lines.append(f"  mode {mode}:")
        for level in run.of(mode):
            m = level.metrics
            p95 = "–" if m.e2e_p95_s is None else f"{m.e2e_p95_s:.3g} s"
            codes = ", ".join(f"{code} ×{n}" for code, n in sorted(m.error_codes.items()))
            lines.append(
                f"    {level.multiple:g}×μ λ={level.rate_rps:.3g}/s: {m.offered} offered, {m.ok} ok"
                f"{f' ({codes})' if codes else ''}, p95 {p95}, SLO attainment {_share(m.slo_attainment)}, "
                f"cloud {_share(m.cloud_share)} (min {_share(m.min_cloud_share)}), ${m.cost_usd:.4f}"
            )
    if not run.has_routes:
        lines.append("  no answer carried x-spillover-route: cloud share counted as 0 (not a spillover gateway?)")
    lines.append(f"  report: {outcome.paths['report.md']}")
    return lines


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-") or "model"
