"""One stage of a calibration: a closed-loop sweep over concurrency levels against one URL.

For each level (in increasing order): `warmup` + `requests_at(N)` = max(`requests_per_level`,
`waves` × N) requests from the stage's `RequestFactory` at that concurrency (all N clients start
together, each sending its next request when its previous one ends), summarized (`bench.load.stats`).
The sweep watches latency and errors as it raises concurrency: after the first level that breaks the SLO or the
error limit it stops, unless `stop_after_breach` is off. The stage's knee is then found over the
levels measured (`bench.calibrate.knee.find_knee`).

Stages (a two-stage test): "model" (the engine directly, e.g. Ray's ingress or vLLM's
server) and then "gateway" (the layer above, our router).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from bench.calibrate.knee import DEFAULT_MAX_ERROR_RATE, Knee, LoadPoint, find_knee
from bench.load.loadgen import LoadGenerator
from bench.load.request_result import RequestResult
from bench.load.stats import Summary, summarize
from bench.load.workload import RequestFactory
from cluster.capacity.engine_sim import Protocol

LatencyMetric = Literal["e2e", "ttft"]


@dataclass(frozen=True)
class SweepPlan:
    concurrency: tuple[int, ...]
    requests_per_level: int
    warmup: int = 2
    slo_p95_s: float = 5.0
    slo_metric: LatencyMetric = "e2e"
    max_error_rate: float = DEFAULT_MAX_ERROR_RATE
    level_time_limit_s: float | None = 600.0
    stop_after_breach: bool = True
    waves: int = 0  # requests at N are at least waves × N, so every level runs that many rounds of N

    @property
    def protocol(self) -> Protocol:
        """The closed loop this plan runs, as the engine simulation (cluster/capacity/engine_sim.py) takes it."""
        return Protocol(self.requests_per_level, self.waves)

    def requests_at(self, concurrency: int) -> int:
        return self.protocol.requests(concurrency)

    def __post_init__(self) -> None:
        if not self.concurrency or any(c < 1 for c in self.concurrency):
            raise ValueError("concurrency levels must be whole numbers >= 1")
        if list(self.concurrency) != sorted(set(self.concurrency)):
            raise ValueError("concurrency levels must be increasing, without repeats")
        if self.requests_per_level < 1 or self.warmup < 0 or self.waves < 0:
            raise ValueError("requests per level must be >= 1, warm-up and waves >= 0")
        if self.slo_p95_s <= 0:
            raise ValueError("the SLO must be > 0 s")
        if not 0 <= self.max_error_rate < 1:
            raise ValueError("the error-rate limit must be in [0, 1)")

    def to_dict(self) -> dict[str, Any]:
        return {
            "concurrency": list(self.concurrency),
            "requests_per_level": self.requests_per_level,
            "warmup": self.warmup,
            "slo_p95_s": self.slo_p95_s,
            "slo_metric": self.slo_metric,
            "max_error_rate": self.max_error_rate,
            "level_time_limit_s": self.level_time_limit_s,
            "stop_after_breach": self.stop_after_breach,
            "waves": self.waves,
        }


@dataclass(frozen=True)
class LevelResult:
    concurrency: int
    summary: Summary
    results: tuple[RequestResult, ...]

    def point(self, metric: LatencyMetric) -> LoadPoint:
        s = self.summary
        return LoadPoint(self.concurrency, s.throughput_rps, s.p95_s(metric), s.error_rate)

    def to_dict(self) -> dict[str, Any]:
        return {
            "concurrency": self.concurrency,
            "summary": self.summary.to_dict(),
            "requests": [r.to_dict() for r in self.results],
        }


@dataclass(frozen=True)
class StageResult:
    name: str
    url: str
    model: str
    plan: SweepPlan
    levels: tuple[LevelResult, ...]
    knee: Knee
    stopped_early: str | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)

    def points(self) -> list[LoadPoint]:
        return [level.point(self.plan.slo_metric) for level in self.levels]

    @property
    def has_routes(self) -> bool:
        return any(r.route for level in self.levels for r in level.results)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "url": self.url,
            "model": self.model,
            "knee": self.knee.to_dict(),
            "stopped_early": self.stopped_early,
            "notes": list(self.notes),
            "points": [vars(p) for p in self.points()],
            "levels": [level.to_dict() for level in self.levels],
        }


def breach(summary: Summary, plan: SweepPlan) -> str | None:
    """Why this level breaks the SLO or the error limit, or None."""
    p95 = summary.p95_s(plan.slo_metric)
    if p95 is None:
        return "no request succeeded"
    if p95 > plan.slo_p95_s:
        return f"{plan.slo_metric} p95 {p95:.3g} s > SLO {plan.slo_p95_s:g} s"
    if summary.error_rate > plan.max_error_rate:
        return f"error rate {summary.error_rate:.1%} > {plan.max_error_rate:.1%}"
    return None


async def run_stage(
    name: str, url: str, model: str, generator: LoadGenerator, factory: RequestFactory, plan: SweepPlan
) -> StageResult:
    levels: list[LevelResult] = []
    stopped: str | None = None
    for i, concurrency in enumerate(plan.concurrency):
        items = factory.take(plan.warmup + plan.requests_at(concurrency))
        results = await generator.run_closed(
            items,
            concurrency,
            warmup=plan.warmup,
            time_limit_s=plan.level_time_limit_s,
            label=f"{name} c={concurrency}",
        )
        summary = summarize(results)
        levels.append(LevelResult(concurrency, summary, tuple(results)))
        why = breach(summary, plan)
        rest = plan.concurrency[i + 1 :]
        if why and plan.stop_after_breach and rest:
            stopped = f"stopped after concurrency {concurrency} ({why}); not run: {', '.join(map(str, rest))}"
            break
    notes = [
        f"concurrency {lv.concurrency}: {lv.summary.cancelled} request(s) cut by the level time limit"
        for lv in levels
        if lv.summary.cancelled
    ]
    short = [lv.concurrency for lv in levels if lv.concurrency > plan.requests_at(lv.concurrency)]
    if short:
        notes.append(
            f"concurrency {', '.join(map(str, short))} above {plan.requests_per_level} requests per level: "
            "those levels never had that many requests in flight; send more requests per level"
        )
    knee = find_knee([lv.point(plan.slo_metric) for lv in levels], plan.slo_p95_s, max_error_rate=plan.max_error_rate)
    return StageResult(name, url, model, plan, tuple(levels), knee, stopped, tuple(notes))
