"""`bench replay`: replay a production arrival trace open-loop through the gateway, once per policy, on the
same arrivals, and measure SLO attainment against cloud spend.

    1. read the trace (bench/replay/traces.py) and fit it to the box (bench/replay/scaling.py): exit 2 when
       the trace or a flag is bad, before anything is sent
    2. check that the URL answers and serves the model (exit 1 unreachable, 2 not served)
    3. for each policy (bench/replay/policies.py): every request starts at its arrival time whatever is in
       flight (`LoadGenerator.run_open`); the policy ends `drain_s` after the last arrival, and a request still
       running then is unanswered (a miss); `cooldown_s` of quiet between policies. Every policy sends requests
       of the same lengths at the same offsets, with the same prefix sharing, in words of its own (salted with
       the run's start time and the policy: no policy finds another's, or an earlier run's, prompts in the
       engine's prefix cache; bench/replay/prompts.py)
    4. per request and per policy (bench/replay/metrics.py), then the report directory (bench/replay/report.py),
       with the offline lower bound on the cloud share when `perf_from` gives the fit (bench/replay/bound.py) and,
       for one replica, a clairvoyant schedule's share (bench/replay/clairvoyant.py): the optimum lies between

Programmatic use: `run_replay(ReplayOptions(...))` → `ReplayOutcome` (raises `ReplayError` with the exit code).
The HTTP transport, clock and sleep are injected for tests.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

import httpx
import yaml
from pydantic import ValidationError

from bench.calibrate.report import environment
from bench.load.loadgen import BadBaseUrl, LoadGenerator, check_base_url, make_client
from bench.load.progress import LineProgress, NullProgress, ProgressSink
from bench.load.target import BenchError, api_key_from_env, preflight
from bench.load.workload import WorkItem
from bench.replay.bound import CloudBound, StepTerms, cloud_bound
from bench.replay.clairvoyant import clairvoyant
from bench.replay.metrics import PolicyMetrics, Prices, RequestRow, measure, rows
from bench.replay.policies import POLICIES, Policy, policy, slug
from bench.replay.prompts import PromptBuilder
from bench.replay.scaling import ScaledTrace, Scaling, scale_trace
from bench.replay.traces import ColumnMap, Trace, TraceError, read_trace


class ReplayError(BenchError):
    pass


@dataclass(frozen=True)
class ReplayOptions:
    url: str
    model: str
    trace: str
    format: str | None = None
    columns: ColumnMap | None = None
    scaling: Scaling = field(default_factory=Scaling)
    policies: tuple[str, ...] = ("shipped",)
    label: str | None = None  # the report's name for `shipped`
    slo_s: float = 10.0
    send_deadline: bool = False
    cloud_region: str = "local-sim"
    prices: Prices = field(default_factory=Prices)
    drain_s: float | None = None  # None: 2 × the SLO
    cooldown_s: float = 10.0
    request_timeout_s: float = 300.0
    ignore_eos: bool = True
    out_dir: str | None = None
    progress: bool = True
    api_key_env: str | None = None
    perf_from: str | None = None  # a config or overlay whose models[] entry for `model` has the fitted perf
    replicas: int = 1  # local replicas, for the offline bound

    @property
    def drain(self) -> float:
        return 2 * self.slo_s if self.drain_s is None else self.drain_s

    def check(self) -> None:
        problems = []
        if not self.policies or len(set(self.policies)) != len(self.policies):
            problems.append("--policies must name at least one policy, each once")
        problems += [f"unknown policy {p!r} (use {', '.join(POLICIES)})" for p in self.policies if p not in POLICIES]
        for name in ("slo_s", "request_timeout_s"):
            if not getattr(self, name) > 0:
                problems.append(f"--{name.replace('_', '-')} must be > 0")
        for name in ("drain", "cooldown_s"):
            if not getattr(self, name) >= 0:
                problems.append(f"--{name.replace('_', '-')} must be >= 0")
        if self.prices.in_per_mtok < 0 or self.prices.out_per_mtok < 0:
            problems.append("cloud prices must be >= 0")
        if self.label is not None and not self.label.strip():
            problems.append("--label must not be empty")
        if self.replicas < 1:
            problems.append("--replicas must be >= 1")
        if problems:
            raise ReplayError("; ".join(problems), 2)


@dataclass(frozen=True)
class PolicyRun:
    policy: Policy
    metrics: PolicyMetrics
    rows: tuple[RequestRow, ...]
    wall_s: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "policy": self.policy.name,
            "label": self.policy.label,
            "description": self.policy.description,
            "headers": self.policy.headers,
            "metrics": self.metrics.to_dict(),
            "wall_s": self.wall_s,
        }


@dataclass(frozen=True)
class ReplayRun:
    options: ReplayOptions
    trace: Trace
    scaled: ScaledTrace
    runs: tuple[PolicyRun, ...]
    started_at: str
    environment: dict[str, Any]
    bound: CloudBound | None = None


@dataclass(frozen=True)
class ReplayOutcome:
    run: ReplayRun
    paths: dict[str, Path]

    @property
    def exit_code(self) -> int:
        return 0 if any(r.metrics.ok for r in self.run.runs) else 1


def prepare(options: ReplayOptions) -> tuple[Trace, ScaledTrace]:
    """The trace and its scaled requests; raises `ReplayError` (exit 2) for bad input."""
    options.check()
    try:
        trace = read_trace(options.trace, options.format, options.columns)
        return trace, scale_trace(trace, options.scaling)
    except TraceError as exc:
        raise ReplayError(exc.message, 2) from None


def offline_bound(options: ReplayOptions, scaled: ScaledTrace) -> CloudBound | None:
    """The clairvoyant lower bound on the cloud share (bench/replay/bound.py), from `perf_from`'s fit."""
    if options.perf_from is None:
        return None
    from pydantic import TypeAdapter

    from cluster.config.perf import PerfSection, fit_for, one_or_many
    from cluster.hardware.cpu_caps import read_cpu_caps

    path = Path(options.perf_from)
    try:
        if path.stat().st_size > 1 << 20:
            raise ReplayError(f"--perf-from {path}: larger than 1 MiB, not a config", 2)
        data = yaml.safe_load(path.read_text())
        entry = next(m for m in data["models"] if isinstance(m, dict) and m.get("alias") == options.model)
        fits = one_or_many(entry["perf"], TypeAdapter(list[PerfSection]).validate_python)
        # one fit: the one asked for; several (a config for every CPU class): the one for this machine's CPU
        perf, why = (fits[0], None) if len(fits) == 1 else fit_for(fits, [(read_cpu_caps().cpu_class, None)])
        if perf is None:
            raise ReplayError(f"--perf-from {path}: {why}", 2)
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise ReplayError(f"--perf-from {path}: cannot read it ({type(exc).__name__})", 2) from None
    except (TypeError, KeyError, StopIteration):
        raise ReplayError(f"--perf-from {path}: no models[] entry with alias {options.model!r} and a perf", 2) from None
    except ValidationError as exc:
        raise ReplayError(f"--perf-from {path}: its perf is not valid ({exc.error_count()} errors)", 2) from None
    terms = StepTerms(perf.request_overhead_s, perf.step_s, perf.per_sequence_s, perf.per_prefill_token_s)
    bound = cloud_bound(scaled.requests, terms, options.slo_s, options.replicas)
    if options.replicas > 1:  # the clairvoyant schedule runs one engine
        return bound
    return replace(bound, clairvoyant=clairvoyant(scaled.requests, terms, options.slo_s).to_dict())


@dataclass(frozen=True)
class BoundOutcome:
    """`--bound-only`: the scaled trace and its offline bound (and clairvoyant schedule), nothing sent."""

    scaled: ScaledTrace
    bound: CloudBound
    exit_code: int = 0


def bound_only(options: ReplayOptions) -> BoundOutcome:
    if options.perf_from is None:
        raise ReplayError("--bound-only needs --perf-from (the fit the bound is computed from)", 2)
    _, scaled = prepare(options)
    bound = offline_bound(options, scaled)
    assert bound is not None
    return BoundOutcome(scaled, bound)


def bound_lines(outcome: BoundOutcome) -> list[str]:
    b, scaled = outcome.bound, outcome.scaled
    lines = [
        f"{len(scaled.requests)} requests over {scaled.window_s:.0f} s: offline lower bound {b.share:.1%} "
        f"({b.requests} requests, {b.alone} too slow alone) — {b.method}"
    ]
    if b.clairvoyant is not None:
        c = b.clairvoyant
        lines.append(f"clairvoyant schedule: {c['share']:.1%} ({c['requests']} requests) — {c['method']}")
    return lines


def prompts(scaled: ScaledTrace, seed: int, salt: str) -> list[WorkItem]:
    """One policy's requests: the trace's lengths and prefix sharing, words of the policy's own (its salt)."""
    builder = PromptBuilder(seed, salt)
    return [builder.item(i, r) for i, r in enumerate(scaled.requests)]


def run_replay(options: ReplayOptions, **kwargs: Any) -> ReplayOutcome:
    return asyncio.run(run_replay_async(options, **kwargs))


async def run_replay_async(
    options: ReplayOptions,
    *,
    transport: httpx.AsyncBaseTransport | None = None,
    now: Callable[[], datetime] = lambda: datetime.now(UTC),
    stderr: TextIO = sys.stderr,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> ReplayOutcome:
    trace, scaled = prepare(options)
    bound = offline_bound(options, scaled)
    try:
        url = check_base_url(options.url)
    except BadBaseUrl as exc:
        raise ReplayError(str(exc), 2) from None
    api_key = api_key_from_env(options.api_key_env, ReplayError)
    started = now()
    run_id = f"{started:%H%M%S}"
    progress: ProgressSink = LineProgress(stderr, log_every_s=10.0) if options.progress else NullProgress()
    arrivals = [r.arrival_s for r in scaled.requests]
    deadline_ms = round(options.slo_s * 1000) if options.send_deadline else None
    chosen = [
        policy(
            name,
            cloud_region=options.cloud_region,
            label=options.label if name == "shipped" else None,
            deadline_ms=deadline_ms,
        )
        for name in options.policies
    ]
    stderr.write(
        f"replaying {len(scaled.requests)} requests of {options.trace} over {scaled.window_s:.0f} s "
        f"({scaled.rate_rps:.2f} req/s) per policy: {', '.join(p.label for p in chosen)}\n"
    )
    client = make_client(url, transport=transport, api_key=api_key, read_timeout_s=options.request_timeout_s)
    runs: list[PolicyRun] = []
    try:
        await preflight(client, url, options.model, ReplayError)
        base_headers = dict(client.headers)
        for chosen_policy in chosen:
            if runs and options.cooldown_s > 0:
                await sleep(options.cooldown_s)
            client.headers = {**base_headers, **chosen_policy.headers}
            items = prompts(scaled, options.scaling.seed, salt=f"{started:%Y%m%d%H%M%S}:{chosen_policy.label}")
            runs.append(await _one_policy(client, options, chosen_policy, items, arrivals, progress, run_id))
    finally:
        await client.aclose()
    out_dir = Path(options.out_dir) if options.out_dir else Path("bench/results") / f"replay-{started:%Y%m%d-%H%M%S}"
    run = ReplayRun(options, trace, scaled, tuple(runs), started.isoformat(timespec="seconds"), environment(), bound)
    from bench.replay.report import write_replay_report  # matplotlib: only when writing

    return ReplayOutcome(run, write_replay_report(run, out_dir))


async def _one_policy(
    client: httpx.AsyncClient,
    options: ReplayOptions,
    chosen: Policy,
    items: list[WorkItem],
    arrivals: list[float],
    progress: ProgressSink,
    run_id: str,
) -> PolicyRun:
    extra = {"ignore_eos": True} if options.ignore_eos else {}
    prefix = request_id_prefix(run_id, chosen.label)
    generator = LoadGenerator(
        client,
        options.model,
        progress=progress,
        extra_body=extra,
        request_timeout_s=options.request_timeout_s,
        request_id_prefix=prefix,
    )
    limit = arrivals[-1] + options.drain
    loop = asyncio.get_running_loop()
    began = loop.time()
    results = await generator.run_open(items, arrivals, time_limit_s=limit, label=f"replay {chosen.label}")
    wall = loop.time() - began
    metrics = measure(results, len(items), options.slo_s, options.prices)
    return PolicyRun(chosen, metrics, tuple(rows(results, arrivals, options.slo_s, options.prices, prefix)), wall)


def request_id_prefix(run_id: str, label: str) -> str:
    """`replay-<run>-<policy>`: request i of the policy is `<prefix>-<i>` (an `x-request-id` the gateway keeps)."""
    return f"replay-{run_id}-{slug(label)}"


def summary_lines(outcome: ReplayOutcome) -> list[str]:
    run = outcome.run
    lines = [
        f"replay of {run.options.trace} ({run.trace.format}): {len(run.scaled.requests)} requests over "
        f"{run.scaled.window_s:.0f} s, SLO e2e <= {run.options.slo_s:g} s"
    ]
    for policy_run in run.runs:
        m = policy_run.metrics
        share = "-" if m.cloud_share is None else f"{m.cloud_share:.0%}"
        lines.append(
            f"  {policy_run.policy.label}: SLO attainment {m.slo_attainment:.1%} ({m.in_slo}/{m.sent}), "
            f"cloud share {share}, spend ${m.spend_usd:.4f}, unanswered {m.unanswered}, errors {m.errors}"
        )
    if run.bound is not None:
        lines.append(f"  offline lower bound on the cloud share: {run.bound.share:.1%} ({run.bound.requests} requests)")
        if run.bound.clairvoyant is not None:
            schedule = run.bound.clairvoyant
            share, count = schedule["share"], schedule["requests"]
            lines.append(f"  a clairvoyant schedule's cloud share: {share:.1%} ({count} requests)")
    lines.append(f"  report: {outcome.paths['report.md']}")
    return lines
