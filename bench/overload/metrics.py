"""What one level of an overload run measured (`bench overload`): pure functions over `RequestResult`s.

    offered              requests sent at the level (Poisson arrivals within the duration)
    SLO attainment       OK answers with e2e ≤ SLO / offered: errors (429 local_capacity_exhausted, ...)
                         and requests cut at the level's time limit count as misses
    route                `x-spillover-route` of an OK answer: "local", "cloud", or "unknown" (no such
                         header, e.g. a plain OpenAI-compatible server)
    cloud share          OK answers routed "cloud" / OK answers ("unknown" counts as not cloud)
    minimal cloud share  max(0, (λ − μ) / λ): with local capacity μ req/s (the knee), at least that share
                         of an offered load λ cannot be served locally, whatever the router does
    cloud cost           Σ over OK cloud answers of prompt_tokens × price_in + output_tokens × price_out,
                         prices in USD per 1M tokens; cloud answers without usage are counted, not priced

Latency percentiles, errors by code and the cancelled count come from `bench.load.stats.summarize` (over
the OK answers; cancelled requests are not errors there, but they are misses here).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from bench.load.request_result import RequestResult
from bench.load.stats import summarize
from bench.load.workload import WorkloadSpec

MODES = ("burst", "local_only")
ROUTES = ("local", "cloud", "unknown")


def min_cloud_share(rate_rps: float, knee_rps: float) -> float:
    """max(0, (λ − μ) / λ): the smallest share of an offered load λ that must leave a local capacity μ."""
    if rate_rps <= 0 or knee_rps <= 0:
        raise ValueError(f"offered load and knee must be > 0 req/s, got λ={rate_rps}, μ={knee_rps}")
    return max(0.0, (rate_rps - knee_rps) / rate_rps)


def offered(results: Sequence[RequestResult]) -> list[RequestResult]:
    return [r for r in results if not r.warmup]


def answered_in_slo(results: Sequence[RequestResult], slo_s: float) -> int:
    return sum(1 for r in offered(results) if r.ok and r.e2e_s <= slo_s)


def slo_attainment(results: Sequence[RequestResult], slo_s: float) -> float | None:
    """Share of the offered requests answered OK within `slo_s` (e2e); None when nothing was offered."""
    sent = offered(results)
    return answered_in_slo(sent, slo_s) / len(sent) if sent else None


def route_of(result: RequestResult) -> str:
    route = (result.route or "").strip().lower()
    return route if route in ("local", "cloud") else "unknown"


def route_counts(results: Sequence[RequestResult]) -> dict[str, int]:
    """OK answers by route: local, cloud, unknown (a missing or unrecognised header)."""
    counts = Counter(route_of(r) for r in offered(results) if r.ok)
    return {route: counts.get(route, 0) for route in ROUTES}


def cloud_share(results: Sequence[RequestResult]) -> float | None:
    """OK answers routed to the cloud / OK answers; None when nothing was answered OK."""
    counts = route_counts(results)
    answered = sum(counts.values())
    return counts["cloud"] / answered if answered else None


def cloud_cost_usd(results: Sequence[RequestResult], price_in: float, price_out: float) -> tuple[float, int]:
    """(USD for the OK cloud answers that carried usage, number of OK cloud answers without usage)."""
    cost, unpriced = 0.0, 0
    for r in offered(results):
        if not r.ok or route_of(r) != "cloud":
            continue
        if r.prompt_tokens is None:
            unpriced += 1
            continue
        cost += (r.prompt_tokens * price_in + r.output_tokens * price_out) / 1e6
    return cost, unpriced


@dataclass(frozen=True)
class LevelMetrics:
    offered: int
    offered_rate_rps: float
    ok: int
    errors: int
    cancelled: int
    error_codes: dict[str, int]
    e2e_p50_s: float | None
    e2e_p95_s: float | None
    in_slo: int
    slo_attainment: float | None
    goodput_rps: float
    routes: dict[str, int]
    cloud_share: float | None
    min_cloud_share: float
    cost_usd: float
    unpriced_cloud: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def measure_level(
    results: Sequence[RequestResult],
    *,
    rate_rps: float,
    knee_rps: float,
    slo_s: float,
    duration_s: float,
    price_in: float = 0.15,
    price_out: float = 0.60,
) -> LevelMetrics:
    """The metrics of one level (see the module docstring); rates per second of `duration_s`."""
    summary = summarize(results)
    sent = offered(results)
    good = answered_in_slo(sent, slo_s)
    cost, unpriced = cloud_cost_usd(sent, price_in, price_out)
    return LevelMetrics(
        offered=len(sent),
        offered_rate_rps=len(sent) / duration_s,
        ok=summary.ok,
        errors=summary.errors,
        cancelled=summary.cancelled,
        error_codes=dict(summary.error_codes),
        e2e_p50_s=summary.e2e_p50_s,
        e2e_p95_s=summary.e2e_p95_s,
        in_slo=good,
        slo_attainment=good / len(sent) if sent else None,
        goodput_rps=good / duration_s,
        routes=route_counts(sent),
        cloud_share=cloud_share(sent),
        min_cloud_share=min_cloud_share(rate_rps, knee_rps),
        cost_usd=cost,
        unpriced_cloud=unpriced,
    )


@dataclass(frozen=True)
class OverloadLevel:
    mode: str
    multiple: float
    rate_rps: float
    metrics: LevelMetrics
    results: tuple[RequestResult, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "multiple": self.multiple,
            "rate_rps": self.rate_rps,
            "metrics": self.metrics.to_dict(),
            "requests": [r.to_dict() for r in self.results],
        }


@dataclass(frozen=True)
class OverloadRun:
    name: str
    model: str
    url: str
    started_at: str
    knee_rps: float
    multiples: tuple[float, ...]
    modes: tuple[str, ...]
    duration_s: float
    drain_s: float
    slo_s: float
    workload: WorkloadSpec
    seed: int
    levels: tuple[OverloadLevel, ...]
    price_in: float = 0.15
    price_out: float = 0.60
    deadline_ms: int | None = None
    max_requests: int | None = None
    environment: dict[str, Any] = field(default_factory=dict)

    def of(self, mode: str) -> list[OverloadLevel]:
        return [level for level in self.levels if level.mode == mode]

    @property
    def has_routes(self) -> bool:
        return any(r.route for level in self.levels for r in level.results)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "model": self.model,
            "url": self.url,
            "started_at": self.started_at,
            "seed": self.seed,
            "knee_rps": self.knee_rps,
            "multiples": list(self.multiples),
            "modes": list(self.modes),
            "duration_s": self.duration_s,
            "drain_s": self.drain_s,
            "slo_p95_s": self.slo_s,
            "deadline_ms": self.deadline_ms,
            "max_requests_per_level": self.max_requests,
            "cloud_price_per_mtok": {"in": self.price_in, "out": self.price_out},
            "workload": self.workload.to_dict(),
            "environment": self.environment,
            "levels": [level.to_dict() for level in self.levels],
        }
