"""bench.load.stats: percentiles (linear interpolation, checked against numpy) and the level summary."""

from __future__ import annotations

import random

import numpy as np
import pytest

from bench.load.request_result import CANCELLED, RequestResult
from bench.load.stats import percentile, summarize


@pytest.mark.parametrize(
    ("values", "p", "expected"),
    [
        ([5.0], 50, 5.0),
        ([5.0], 99, 5.0),
        ([1.0, 2.0], 50, 1.5),
        ([1.0, 2.0, 3.0, 4.0], 50, 2.5),
        ([1.0, 2.0, 3.0, 4.0, 5.0], 0, 1.0),
        ([1.0, 2.0, 3.0, 4.0, 5.0], 100, 5.0),
        ([1.0, 2.0, 3.0, 4.0, 5.0], 95, 4.8),  # rank 0.95 × 4 = 3.8 → 4 + 0.8 × (5 − 4)
        ([10.0, 0.0, 20.0, 30.0], 25, 7.5),  # unsorted input: sorted first
        (list(range(1, 101)), 99, 99.01),
    ],
)
def test_percentile_known_values(values: list[float], p: float, expected: float) -> None:
    assert percentile(values, p) == pytest.approx(expected)


def test_percentile_matches_numpy_linear() -> None:
    rng = random.Random(3)
    for n in (1, 2, 7, 50, 333):
        values = [rng.expovariate(2.0) for _ in range(n)]
        for p in (0, 1, 50, 90, 95, 99, 100):
            assert percentile(values, p) == pytest.approx(float(np.percentile(values, p)))


def test_percentile_of_nothing_and_bad_p() -> None:
    assert percentile([], 50) is None
    with pytest.raises(ValueError, match=r"\[0, 100\]"):
        percentile([1.0], 101)


def r(index: int, start: float, e2e: float, **kw: object) -> RequestResult:
    return RequestResult(index=index, start_s=start, e2e_s=e2e, **kw)  # type: ignore[arg-type]


def test_summary_counts_rates_and_latencies() -> None:
    results = [
        r(0, 0.0, 9.0, ttft_s=1.0, output_tokens=5, warmup=True),  # dropped
        r(1, 10.0, 2.0, ttft_s=0.5, output_tokens=11, prompt_tokens=100, cached_tokens=50, route="local"),
        r(2, 10.5, 3.0, ttft_s=1.0, output_tokens=21, prompt_tokens=100, cached_tokens=0, route="cloud"),
        r(3, 11.0, 1.0, ttft_s=0.2, output_tokens=1, prompt_tokens=100, route="local"),
        r(4, 11.5, 0.1, status=429, error="capacity_exceeded"),
        r(5, 12.0, 2.0, error=CANCELLED),
    ]
    s = summarize(results)
    assert (s.count, s.ok, s.errors, s.cancelled) == (5, 3, 1, 1)
    assert s.error_rate == pytest.approx(1 / 4)  # cancelled ones are not finished requests
    assert s.wall_s == pytest.approx(14.0 - 10.0)  # first start 10.0 → last end 12.0 + 2.0
    assert s.throughput_rps == pytest.approx(3 / 4.0)
    assert s.output_tps == pytest.approx((11 + 21 + 1) / 4.0)
    assert s.ttft_p50_s == pytest.approx(0.5)
    # TPOT: (2 − 0.5) / 10 = 0.15 and (3 − 1) / 20 = 0.1; one output token has none
    assert s.tpot_p50_s == pytest.approx(0.125)
    assert s.e2e_p50_s == pytest.approx(2.0)
    assert s.e2e_p95_s == pytest.approx(2.0 + 0.9 * 1.0)
    assert s.cloud_share == pytest.approx(1 / 3)
    assert s.routes == {"local": 2, "cloud": 1}
    assert s.error_codes == {"capacity_exceeded": 1}
    assert s.mean_prompt_tokens == pytest.approx(100)
    assert s.mean_output_tokens == pytest.approx(11)
    assert s.cached_token_share == pytest.approx(50 / 200)
    assert s.p95_s("ttft") == s.ttft_p95_s
    with pytest.raises(ValueError, match="unknown latency metric"):
        s.p95_s("tpot")


def test_summary_of_nothing_and_of_errors_only() -> None:
    empty = summarize([])
    assert (empty.count, empty.throughput_rps, empty.e2e_p95_s, empty.cloud_share) == (0, 0.0, None, None)
    failed = summarize([r(i, i * 0.1, 0.05, status=500, error="http_500") for i in range(4)])
    assert failed.error_rate == 1.0
    assert failed.throughput_rps == 0.0
    assert failed.e2e_p95_s is None
    assert failed.error_codes == {"http_500": 4}


def test_request_result_round_trips_and_tpot() -> None:
    one = r(7, 1.0, 3.0, ttft_s=1.0, output_tokens=5, route="cloud")
    assert one.tpot_s == pytest.approx(0.5)
    assert RequestResult.from_dict(one.to_dict()) == one
    assert r(1, 0, 1.0, output_tokens=5).tpot_s is None  # no first token seen
