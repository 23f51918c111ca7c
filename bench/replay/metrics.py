"""What one policy's replay measured, per request and in sum.

Per request (`RequestRow`): the route and target the gateway answered with (`x-spillover-route` /
`x-spillover-target`), TTFT, end-to-end, tokens, the cloud cost (usage × the cloud's prices; a local answer
costs 0 here: the GPUs are paid either way), and whether it met the SLO: answered OK with e2e ≤ the SLO.
A request still unanswered when the policy's time ran out (`cancelled`) or answered with an error misses it.

Per policy (`PolicyMetrics`): SLO attainment = requests in SLO / requests sent (unanswered ones included), cloud
share = cloud answers / OK answers, spend = the sum of the cloud costs, and the latency percentiles of the OK
answers (`bench.load.stats.summarize`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from bench.load.request_result import RequestResult
from bench.load.stats import summarize
from bench.overload.metrics import answered_in_slo, cloud_cost_usd, route_counts, route_of


@dataclass(frozen=True)
class Prices:
    in_per_mtok: float = 0.15
    out_per_mtok: float = 0.60

    def cost(self, result: RequestResult) -> float:
        if not result.ok or route_of(result) != "cloud":
            return 0.0
        return ((result.prompt_tokens or 0) * self.in_per_mtok + result.output_tokens * self.out_per_mtok) / 1e6


@dataclass(frozen=True)
class RequestRow:
    index: int
    request_id: str
    arrival_s: float
    route: str
    target: str | None
    ttft_s: float | None
    e2e_s: float | None
    prompt_tokens: int | None
    output_tokens: int
    cost_usd: float
    slo_met: bool
    error: str | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class PolicyMetrics:
    sent: int
    ok: int
    in_slo: int
    slo_attainment: float
    unanswered: int
    errors: int
    error_codes: dict[str, int]
    routes: dict[str, int]
    cloud_share: float | None
    spend_usd: float
    unpriced_cloud: int
    ttft_p50_s: float | None
    ttft_p95_s: float | None
    e2e_p50_s: float | None
    e2e_p95_s: float | None
    e2e_p99_s: float | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def rows(
    results: Sequence[RequestResult], arrivals: Sequence[float], slo_s: float, prices: Prices, id_prefix: str
) -> list[RequestRow]:
    out = []
    for result in results:
        answered = result.ok
        out.append(
            RequestRow(
                index=result.index,
                request_id=f"{id_prefix}-{result.index}",
                arrival_s=arrivals[result.index],
                route=route_of(result) if answered else "none",
                target=result.target,
                ttft_s=result.ttft_s,
                e2e_s=result.e2e_s if answered else None,
                prompt_tokens=result.prompt_tokens,
                output_tokens=result.output_tokens,
                cost_usd=prices.cost(result),
                slo_met=answered and result.e2e_s <= slo_s,
                error=result.error,
            )
        )
    return out


def measure(results: Sequence[RequestResult], sent: int, slo_s: float, prices: Prices) -> PolicyMetrics:
    """`sent` counts every request of the replay: one the time limit kept from starting is unanswered too."""
    summary = summarize(results)
    in_slo = answered_in_slo(results, slo_s)
    spend, unpriced = cloud_cost_usd(results, prices.in_per_mtok, prices.out_per_mtok)
    routes = route_counts(results)
    answered = sum(routes.values())
    return PolicyMetrics(
        sent=sent,
        ok=summary.ok,
        in_slo=in_slo,
        slo_attainment=in_slo / sent if sent else 0.0,
        unanswered=sent - summary.ok - summary.errors,
        errors=summary.errors,
        error_codes=dict(summary.error_codes),
        routes=routes,
        cloud_share=routes["cloud"] / answered if answered else None,
        spend_usd=spend,
        unpriced_cloud=unpriced,
        ttft_p50_s=summary.ttft_p50_s,
        ttft_p95_s=summary.ttft_p95_s,
        e2e_p50_s=summary.e2e_p50_s,
        e2e_p95_s=summary.e2e_p95_s,
        e2e_p99_s=summary.e2e_p99_s,
    )
