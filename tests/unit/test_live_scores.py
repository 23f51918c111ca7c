"""Live scores per target and scenario from the dispatcher's attempts, and live latency kept out of the
ranking's latency scorer (it moves traffic through the bounded weight only), through the real dispatcher."""

from __future__ import annotations

from router.learning.decision import Attempt
from serve_apps.traffic.live_scores import LiveScores
from tests.fakes import FakeClock
from tests.unit.traffic_fixture import TrafficWorld, traffic_config

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def test_scores_and_latency_per_target_and_scenario() -> None:
    clock = FakeClock()
    scores = LiveScores(clock=clock)
    scores.observe("chat", [Attempt("cloud:sim/m", "ok", 0.2) for _ in range(5)])
    scores.observe("digest", [Attempt("cloud:sim/m", "error", 0.0) for _ in range(5)])
    scores.observe("chat", [Attempt("cloud:spare/m", "skipped", 0.0)])
    view = scores.view()
    assert view["cloud:sim/m chat"]["score"] == 100.0
    assert view["cloud:sim/m digest"]["weight"] == 85.0  # one bounded step down from 100
    assert "cloud:spare/m chat" not in view
    assert view["cloud:sim/m chat"]["p95_s"] == 0.2  # measured, for the view and the latency component


async def test_measured_latency_does_not_reorder_the_ranking_at_once() -> None:
    world = TrafficWorld(traffic_config())
    http, parts, _ = world.gateway()
    async with world.client(http) as client:
        await client.post("/v1/spillover/traffic", json={"action": "drain", "target": "local:m"})
        await client.post("/v1/chat/completions", json=CHAT, headers={"x-request-id": "first"})
        await client.post("/v1/chat/completions", json=CHAT, headers={"x-request-id": "second"})
        first = (await client.get("/v1/spillover/decisions/first")).json()
        second = (await client.get("/v1/spillover/decisions/second")).json()
        metrics = (await client.get("/metrics")).text

    def latency_raw(record: dict[str, object]) -> float:
        (sim,) = [c for c in record["candidates"] if c["target"] == "cloud:sim/m"]  # type: ignore[attr-defined]
        return float(sim["scores"]["latency"]["raw"])

    assert latency_raw(first) == 0.5  # nothing configured: neutral
    assert latency_raw(second) == 0.5  # still: a measurement moves traffic through the bounded weight only
    assert parts.traffic.scores.view()["cloud:sim/m default"]["p95_s"] == 0.0  # measured all the same
    assert 'spillover_target_weight{scenario="default",target="cloud:sim/m"} 100.0' in metrics
