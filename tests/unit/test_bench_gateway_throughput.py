"""`bench overhead --throughput`: closed loops along both paths, the comparison arithmetic, the report.

The simulator is the real cloud-sim app (answering at once, as the bench runs it); the "gateway" here is
a stand-in that forwards to it and records the residency header the real gateway routes by — the bench's
own logic is what is under test, not the gateway (the committed report measures the real one).
"""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any

import httpx
import pytest

from bench.cloud_sim import SimSettings, build_app
from bench.gateway.throughput import (
    LevelResult,
    ThroughputOptions,
    measure_throughput,
    path_targets,
    sustained,
    throughput_comparisons,
    throughput_markdown,
)
from spillover.main import main as spillover

OPTS = ThroughputOptions(
    gateway_url="http://gateway/v1",
    sim_url="http://sim/v1",
    sim_region="bench-sim",
    model="m",
    levels=(1, 3),
    duration_s=0.1,
    warmup_s=0.02,
)


def routed_transport(gateway_status: int = 200) -> tuple[httpx.AsyncBaseTransport, list[str | None]]:
    """One transport for both hosts: `sim` is the cloud-sim app, `gateway` forwards to it (or fails)."""
    sim = build_app(SimSettings(models=("m",), ttft_s=0.0, tokens_per_s=0.0), rng=random.Random(1))
    to_sim = httpx.ASGITransport(app=sim)
    residencies: list[str | None] = []

    class Router(httpx.AsyncBaseTransport):
        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            if request.url.host == "gateway":
                residencies.append(request.headers.get("x-spillover-residency"))
                if gateway_status != 200:
                    return httpx.Response(gateway_status, json={"error": {"message": "down", "code": "x"}})
            return await to_sim.handle_async_request(request)

    return Router(), residencies


async def test_both_paths_are_measured_at_every_level_and_the_gateway_is_sent_to_the_sim_region() -> None:
    transport, residencies = routed_transport()
    async with httpx.AsyncClient(transport=transport) as client:
        results = await measure_throughput(OPTS, lambda _: None, client=client)
    assert [(r.concurrency, r.path) for r in results] == [
        (1, "sim"),
        (1, "gateway-sim"),
        (3, "sim"),
        (3, "gateway-sim"),
    ]
    assert all(r.latencies_s and r.errors == 0 and r.duration_s > 0 for r in results)
    assert residencies and set(residencies) == {"bench-sim"}


async def test_a_failing_gateway_counts_errors_and_has_no_sustained_rate() -> None:
    transport, _ = routed_transport(gateway_status=503)
    async with httpx.AsyncClient(transport=transport) as client:
        results = await measure_throughput(OPTS, lambda _: None, client=client)
    gateway = [r for r in results if r.path == "gateway-sim"]
    assert all(r.errors > 0 and not r.latencies_s for r in gateway)
    assert sustained(results) is None
    assert "no gateway-sim level completed a request" in "\n".join(throughput_markdown(results, OPTS))


def level(path: str, concurrency: int, latencies: list[float], duration_s: float = 2.0) -> LevelResult:
    return LevelResult(path, concurrency, duration_s, latencies)


def test_comparisons_are_ratios_of_rates_and_differences_of_percentiles() -> None:
    results = [
        level("sim", 8, [0.010] * 100),  # 50 req/s
        level("gateway-sim", 8, [0.014] * 80),  # 40 req/s
    ]
    [c] = throughput_comparisons(results)
    assert c["concurrency"] == 8
    assert c["rps_ratio"] == pytest.approx(0.8)
    assert c["added_ms_p50"] == pytest.approx(4.0)
    assert c["added_ms_p99"] == pytest.approx(4.0)
    best = sustained(results)
    assert best is not None and best.requests_per_s == pytest.approx(40.0)
    text = "\n".join(throughput_markdown(results, OPTS))
    assert "**40 req/s**" in text and "+4.0" in text


def test_the_direct_listener_path_is_compared_with_the_simulator_too() -> None:
    results = [
        level("sim", 8, [0.010] * 100),  # 50 req/s
        level("gateway-sim", 8, [0.020] * 50),  # 25 req/s
        level("gateway-direct-sim", 8, [0.012] * 90),  # 45 req/s
    ]
    by_path = {c["path"]: c for c in throughput_comparisons(results)}
    assert by_path["gateway-sim"]["rps_ratio"] == pytest.approx(0.5)
    assert by_path["gateway-direct-sim"]["rps_ratio"] == pytest.approx(0.9)
    assert by_path["gateway-direct-sim"]["added_ms_p50"] == pytest.approx(2.0)
    best = sustained(results, "gateway-direct-sim")
    assert best is not None and best.requests_per_s == pytest.approx(45.0)
    text = "\n".join(throughput_markdown(results, OPTS))
    assert "`gateway-direct-sim`: one gateway replica sustained **45 req/s**" in text and "**25 req/s**" in text
    targets = path_targets(replace(OPTS, direct_url="http://127.0.0.1:8001/v1"))
    assert targets["gateway-direct-sim"][0] == "http://127.0.0.1:8001/v1/chat/completions"


def test_the_flag_needs_the_simulator(capsys: Any) -> None:
    assert spillover(["bench", "overhead", "--model", "m", "--throughput"]) == 2
    assert "--sim-url and --sim-region" in capsys.readouterr().err
