"""The live routing weight moves traffic: a degraded first candidate keeps its weight's share of new
requests, the share moves by at most 15 points per 10 s interval and comes back the same way, cost
and contract violations lower it, and without live evidence the order is today's. On a fake clock,
with the real LiveScores, WeightRouting and (last test) the real dispatcher and Traffic."""

from __future__ import annotations

import itertools
import re

import httpx
import pytest
from starlette.applications import Starlette

from router.learning.decision import Attempt
from router.routing.capabilities import Registry, Target
from router.routing.weight_split import kept_share, reordered, weigh
from serve_apps.http.edge import HttpEdge
from serve_apps.resilience.routes import OpsRoutes
from serve_apps.traffic.live_scores import LiveScores
from serve_apps.traffic.weight_routing import WeightRouting
from tests.fakes import FakeClock
from tests.unit.traffic_fixture import TrafficWorld, traffic_config

CONFIG = traffic_config()
LOCAL, SIM, SPARE = Registry.from_config(CONFIG.models, CONFIG.cloud.providers).for_alias("m")
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def _order(*targets: Target) -> list[tuple[Target, str]]:
    return [(t, "planned" if i == 0 else "") for i, t in enumerate(targets)]


def test_the_rule_keeps_exactly_the_weights_share() -> None:
    moved = [weigh("a", 85.0, 80.0, n, alternative="b").moved for n in range(100)]
    assert sum(moved) == 15  # exactly 15 in 100 move
    assert weigh("a", 85.0, 80.0, 6, alternative="b").note == "weight: a 85 (score 80) keeps 85%: moved to b"
    assert not any(weigh("a", 40.0, 40.0, n, alternative=None).moved for n in range(10))  # nowhere to go
    assert weigh("a", 100.0, 100.0, 0, alternative="b").note == ""


def test_a_local_model_is_never_weighed() -> None:
    # its latency follows its load and the request sizes by design; saturation and health route it
    assert not any(weigh("local:m", 10.0, 10.0, n, alternative="cloud:a/m").weighed for n in range(100))
    assert kept_share(-5) == 0.0 and kept_share(150) == 1.0
    assert reordered([(1, "x"), (2, ""), (3, "")], "why") == [(2, "why"), (1, ""), (3, "")]


def test_no_live_evidence_leaves_the_order_unchanged() -> None:
    clock = FakeClock()
    scores = LiveScores(clock=clock)
    routing = WeightRouting(scores)
    order = _order(SIM, SPARE)
    assert routing.arrange("default", order) == (order, "")
    scores.observe("default", [Attempt(SIM.id, "error", 0.0) for _ in range(4)])  # fewer than min_samples
    assert all(routing.arrange("default", order) == (order, "") for _ in range(50))
    scores.observe("other", [Attempt(SIM.id, "error", 0.0) for _ in range(10)])  # another scenario's evidence
    assert routing.arrange("default", order) == (order, "")


def _run(clock: FakeClock, scores: LiveScores, routing: WeightRouting, slow_s: float) -> float:
    """One 10 s interval of 100 requests, `SIM` answering in `slow_s`, `SPARE` in 1 s: SIM's share."""
    first = 0
    for _ in range(100):
        (target, _), *_ = routing.arrange("chat", _order(SIM, SPARE))[0]
        first += target is SIM
        scores.observe("chat", [Attempt(target.id, "ok", slow_s if target is SIM else 1.0)])
        clock.advance(0.1)
    return first / 100


def test_a_target_whose_latency_triples_loses_share_in_bounded_steps_and_regains_it() -> None:
    clock = FakeClock()
    scores = LiveScores(clock=clock, prices={SIM.id: 0.5, SPARE.id: 0.5})
    routing = WeightRouting(scores)
    shares = [_run(clock, scores, routing, 1.0) for _ in range(3)]  # the baseline: 1 s
    assert shares == [1.0, 1.0, 1.0]
    weights = []
    for _ in range(4):  # the latency triples: p95 3 s against 1.8 x 1 s
        shares.append(_run(clock, scores, routing, 3.0))
        weights.append(scores.weight(SIM.id, "chat")[0])
    assert weights == pytest.approx([85.0, 83.33, 83.33, 83.33], abs=0.01)  # 15 points, then the score
    # the first slow interval steps once p95 crosses the bound (~5% of the window slow), then 85%, ~83%
    assert shares[3:] == pytest.approx([0.88, 0.83, 0.83, 0.84], abs=0.011)
    for _ in range(14):  # it recovers: the slow answers leave the 120 s window, then +15 per interval
        shares.append(_run(clock, scores, routing, 1.0))
        weights.append(scores.weight(SIM.id, "chat")[0])
    assert weights[-1] == 100.0 and shares[-1] == 1.0
    steps = [b - a for a, b in itertools.pairwise([100.0, *weights])]
    assert max(abs(s) for s in steps) <= 15.0
    assert all(abs(b - a) <= 0.15 + 0.011 for a, b in itertools.pairwise(shares))
    assert any(0 < s <= 15 for s in steps)  # it did climb back in steps, not at once


def test_failures_take_the_share_down_15_points_per_interval_never_faster() -> None:
    clock = FakeClock()
    scores = LiveScores(clock=clock)
    routing = WeightRouting(scores)
    scores.observe("chat", [Attempt(SIM.id, "error", 0.0) for _ in range(50)])
    seen = []
    for _ in range(4):
        for _ in range(20):  # many reads within one interval: one step at most
            routing.arrange("chat", _order(SIM, SPARE))
            scores.observe("chat", [Attempt(SIM.id, "error", 0.0)])
        seen.append(scores.weight(SIM.id, "chat")[0])
        clock.advance(10)
    assert seen == [85.0, 70.0, 55.0, 50.0]  # 50: no success at all


def test_cost_and_violations_lower_the_weight() -> None:
    clock = FakeClock()
    scores = LiveScores(clock=clock, prices={SIM.id: 0.5, SPARE.id: 2.5})
    scores.observe("chat", [Attempt(SIM.id, "ok", 1.0) for _ in range(5)])
    scores.observe("chat", [Attempt(SPARE.id, "ok", 1.0) for _ in range(5)])
    assert scores.cost(SIM.id, "chat") == 1.0 and scores.cost(SPARE.id, "chat") == pytest.approx(0.2)
    assert scores.weight(SIM.id, "chat") == (100.0, 100.0)
    assert scores.weight(SPARE.id, "chat") == pytest.approx((92.0, 92.0))  # dearer: 8 of its 10 cost points off
    assert scores.cost(LOCAL.id, "chat") == 1.0  # free / unpriced: full
    clock.advance(10)
    scores.observe("chat", [Attempt(SIM.id, "contract_violation", 1.0) for _ in range(5)])
    weight, score = scores.weight(SIM.id, "chat")
    assert score == pytest.approx(100 * (0.5 * 0.5 + 0.25 + 0.15 * 0.5 + 0.10))  # half violated: 67.5
    assert weight == pytest.approx(89.17, abs=0.01)  # one step, taken at the first violation (5 ok, 1 not)
    clock.advance(10)
    assert scores.weight(SIM.id, "chat")[0] == pytest.approx(74.17, abs=0.01)  # the next: 15 points, no more


def test_a_reset_forgets_the_scores_and_the_weight_is_100_again() -> None:
    clock = FakeClock()
    scores = LiveScores(clock=clock)
    scores.observe("chat", [Attempt(SIM.id, "error", 0.0) for _ in range(5)])
    scores.observe("chat", [Attempt(SPARE.id, "error", 0.0) for _ in range(5)])
    assert scores.reset("cloud:sim") == ["score cloud:sim/m chat"]
    assert scores.weight(SIM.id, "chat")[0] == 100.0 and scores.weight(SPARE.id, "chat")[0] == 85.0
    assert scores.reset() == ["score cloud:spare/m chat"]


async def test_the_decision_record_says_when_the_weight_moved_a_request() -> None:
    world = TrafficWorld(CONFIG)
    http, parts, _ = world.gateway()
    async with world.client(http) as client:
        await client.post("/v1/spillover/traffic", json={"action": "drain", "target": "local:m"})
        parts.traffic.scores.observe("default", [Attempt(SIM.id, "error", 0.0) for _ in range(5)])
        answers = [
            await client.post("/v1/chat/completions", json=CHAT, headers={"x-request-id": f"r{i}"}) for i in range(20)
        ]
        moved = [i for i, a in enumerate(answers) if a.headers["x-spillover-target"] == "cloud:spare"]
        record = (await client.get(f"/v1/spillover/decisions/r{moved[0]}")).json()
        kept = (await client.get("/v1/spillover/decisions/r0")).json()
    assert len(moved) == 3  # weight 85: 3 of 20 go to the next candidate
    note = record["traffic"]  # the score rises as the kept requests succeed; the weight waits its interval
    assert re.fullmatch(r"weight: cloud:sim/m 85 \(score \d+\) keeps 85%: moved to cloud:spare/m", note), note
    assert record["reason"] == note and answers[moved[0]].headers["x-spillover-traffic"] == note
    assert kept["traffic"] == "weight: cloud:sim/m 85 (score 50) keeps 85%: kept"  # 5 failures, no success
    assert parts.traffic.forget("cloud:sim") == ["score cloud:sim/m default"]
    assert parts.traffic.scores.weight(SIM.id, "default")[0] == 100.0


async def test_the_operator_reset_forgets_the_scores() -> None:
    world = TrafficWorld(CONFIG)
    _, parts, res = world.gateway()
    ops = OpsRoutes(res, forget=parts.traffic.forget)
    app = Starlette(routes=ops.routes(HttpEdge()))  # no auth: every caller may reset
    parts.traffic.scores.observe("chat", [Attempt(SIM.id, "error", 0.0) for _ in range(5)])
    assert parts.traffic.scores.weight(SIM.id, "chat")[0] == 85.0
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as client:
        bad = await client.post("/v1/spillover/resilience/reset", content=b'{"target": "nope"}')
        assert bad.status_code == 400 and parts.traffic.scores.weight(SIM.id, "chat")[0] == 85.0
        done = await client.post("/v1/spillover/resilience/reset", json={"target": "cloud:sim"})
    assert done.status_code == 200 and "score cloud:sim/m chat" in done.json()["reset"]
    assert parts.traffic.scores.weight(SIM.id, "chat")[0] == 100.0
