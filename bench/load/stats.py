"""Percentiles and the summary of one load level (a list of `RequestResult`s).

Percentiles interpolate linearly between the two nearest ranks (`router.percentile.linear_percentile`,
numpy's default "linear"); an empty list has no percentile (None).

`summarize` counts over the measured requests (warm-up requests are dropped first):

    errors       requests with an error, `cancelled` ones excluded (they were cut by the time limit)
    error rate   errors / (count − cancelled)
    wall time    first start → last end over the measured requests
    throughput   successful requests / wall time; output tok/s = their output tokens / wall time
    latencies    TTFT, TPOT (see `RequestResult.tpot_s`) and e2e over the successful requests only
    cloud share  successful requests with route "cloud" / successful requests that carry a route
                 (None when no response carried `x-spillover-route`)
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from bench.load.request_result import RequestResult
from router.percentile import linear_percentile as percentile

__all__ = ["Summary", "percentile", "summarize"]


@dataclass(frozen=True)
class Summary:
    count: int
    ok: int
    errors: int
    cancelled: int
    error_rate: float
    wall_s: float
    throughput_rps: float
    output_tps: float
    ttft_p50_s: float | None
    ttft_p95_s: float | None
    tpot_p50_s: float | None
    tpot_p95_s: float | None
    e2e_p50_s: float | None
    e2e_p95_s: float | None
    e2e_p99_s: float | None
    cloud_share: float | None
    mean_prompt_tokens: float | None
    mean_output_tokens: float | None
    cached_token_share: float | None
    routes: dict[str, int] = field(default_factory=dict)
    error_codes: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def p95_s(self, metric: str = "e2e") -> float | None:
        """p95 of "e2e" or "ttft" (the latency the SLO is written against)."""
        if metric not in ("e2e", "ttft"):
            raise ValueError(f"unknown latency metric {metric!r}: use e2e or ttft")
        return self.e2e_p95_s if metric == "e2e" else self.ttft_p95_s


def summarize(results: Sequence[RequestResult]) -> Summary:
    """The summary of the measured (non-warm-up) requests in `results`."""
    measured = [r for r in results if not r.warmup]
    good = [r for r in measured if r.ok]
    cancelled = sum(1 for r in measured if r.cancelled)
    errors = [r for r in measured if not r.ok and not r.cancelled]
    wall = (max(r.end_s for r in measured) - min(r.start_s for r in measured)) if measured else 0.0
    finished = len(measured) - cancelled
    out_tokens = sum(r.output_tokens for r in good)
    routed = [r.route for r in good if r.route]
    ttfts = [r.ttft_s for r in good if r.ttft_s is not None]
    tpots = [t for t in (r.tpot_s for r in good) if t is not None]
    e2es = [r.e2e_s for r in good]
    prompts = [r.prompt_tokens for r in good if r.prompt_tokens is not None]
    cached = [(r.cached_tokens, r.prompt_tokens) for r in good if r.cached_tokens is not None and r.prompt_tokens]
    return Summary(
        count=len(measured),
        ok=len(good),
        errors=len(errors),
        cancelled=cancelled,
        error_rate=len(errors) / finished if finished else 0.0,
        wall_s=wall,
        throughput_rps=len(good) / wall if wall > 0 else 0.0,
        output_tps=out_tokens / wall if wall > 0 else 0.0,
        ttft_p50_s=percentile(ttfts, 50),
        ttft_p95_s=percentile(ttfts, 95),
        tpot_p50_s=percentile(tpots, 50),
        tpot_p95_s=percentile(tpots, 95),
        e2e_p50_s=percentile(e2es, 50),
        e2e_p95_s=percentile(e2es, 95),
        e2e_p99_s=percentile(e2es, 99),
        cloud_share=sum(1 for r in routed if r == "cloud") / len(routed) if routed else None,
        mean_prompt_tokens=sum(prompts) / len(prompts) if prompts else None,
        mean_output_tokens=out_tokens / len(good) if good else None,
        cached_token_share=sum(c for c, _ in cached) / sum(p for _, p in cached) if cached else None,
        routes=dict(Counter(routed)),
        error_codes=dict(Counter(r.error or "" for r in errors)),
    )
