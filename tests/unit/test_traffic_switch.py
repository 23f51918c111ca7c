"""A graded switch through the real dispatcher on a fake clock: 1 → 5 → 25 → 50 → 100%, a standby
that starts failing at 25% rolled back (no client sees the failure: the attempt fails over to the
primary), the rollback reaching another gateway replica through the shared board, and the staggered
adoption of a switch across replicas."""

from __future__ import annotations

import httpx

from router.errors import UpstreamError
from serve_apps.traffic.wiring import TrafficParts
from tests.unit.traffic_fixture import TrafficWorld, traffic_config

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
SWITCH = {
    "action": "switch",
    "model": "m",
    "primary": "local:m",
    "standby": "cloud:sim",
    "step_s": 0,
    "min_requests": 1,
}


async def _until_share(client: httpx.AsyncClient, parts: TrafficParts, share: float, limit: int = 500) -> list[str]:
    targets = []
    for _ in range(limit):
        view = parts.traffic.view()["migrations"]["m"]
        if view["share"] >= share or view["phase"] != "running":
            return targets
        response = await client.post("/v1/chat/completions", json=CHAT)
        assert response.status_code == 200
        targets.append(response.headers["x-spillover-target"])
    raise AssertionError(f"share {share} not reached")


async def test_a_healthy_switch_walks_every_step_and_records_them() -> None:
    world = TrafficWorld(traffic_config())
    http, parts, _ = world.gateway()
    async with world.client(http) as client:
        assert (await client.post("/v1/spillover/traffic", json=SWITCH)).status_code == 200
        seen = await _until_share(client, parts, 1.0)
        assert seen.count("cloud:sim") == 4  # one request on the standby at each of 1/5/25/50% (min_requests 1)
        assert len(seen) == 100 + 20 + 4 + 2
        for _ in range(2):
            moved = await client.post("/v1/chat/completions", json=CHAT, headers={"x-request-id": "after"})
        assert moved.headers["x-spillover-target"] == "cloud:sim"
        assert moved.headers["x-spillover-traffic"].startswith("m: local:m -> cloud:sim")
        record = (await client.get("/v1/spillover/decisions/after")).json()
        assert "cloud:sim" in record["traffic"] and "100%" in record["traffic"]
        metrics = (await client.get("/metrics")).text
    kinds = [e["kind"] for e in parts.traffic.view()["migrations"]["m"]["events"]]
    assert kinds == ["started", "step", "step", "step", "step", "complete"]
    assert 'spillover_migration_events_total{kind="step",scope="m"} 4.0' in metrics
    assert 'spillover_migration_share{scope="m",target="cloud:sim"} 1.0' in metrics
    await parts.traffic.sync_once()  # the replica tells the board at its next sync
    assert world.board.sync("x", [])[0]["switches"]["m"]["phase"] == "complete"


async def test_a_standby_that_starts_failing_at_25_percent_rolls_back_on_every_replica() -> None:
    world = TrafficWorld(traffic_config())
    http_a, parts_a, _ = world.gateway("replica-a")
    http_b, parts_b, _ = world.gateway("replica-b")
    await parts_a.traffic.sync_once()
    await parts_b.traffic.sync_once()  # b is the second replica: it adopts stagger_s later
    async with world.client(http_a) as a, world.client(http_b) as b:
        assert (await a.post("/v1/spillover/traffic", json=SWITCH)).status_code == 200
        await parts_b.traffic.sync_once()
        assert parts_b.traffic.view()["migrations"]["m"]["adopted"] is False
        staggered = await b.post("/v1/chat/completions", json=CHAT)
        assert "not yet adopted" in staggered.headers["x-spillover-traffic"]
        await _until_share(a, parts_a, 0.25)
        world.sim.script = [UpstreamError("sim broke")] * 3
        answers = [await a.post("/v1/chat/completions", json=CHAT) for _ in range(4)]
        assert [r.status_code for r in answers] == [200] * 4  # the failed attempt failed over to the primary
        view_a = parts_a.traffic.view()["migrations"]["m"]
        assert view_a["phase"] == "rolled_back" and "rolled back at 25%" in view_a["events"][-1]["reason"]
        assert "error gate" in view_a["events"][-1]["reason"]
        await parts_a.traffic.sync_once()  # a reports its rollback
        await parts_b.traffic.sync_once()  # b follows
        assert parts_b.traffic.view()["migrations"]["m"]["phase"] == "rolled_back"
        world.clock.advance(60)
        after = [(await b.post("/v1/chat/completions", json=CHAT)).headers["x-spillover-target"] for _ in range(8)]
    assert after == ["local:m"] * 8
    history = world.board.sync("x", [])[0]["history"]
    assert history[-1]["action"] == "rolled_back" and "replica" in history[-1]["result"]


async def test_the_later_replicas_adopt_after_stagger_s_and_an_operator_rollback_stops_all() -> None:
    world = TrafficWorld(traffic_config(migration={"stagger_share": 0.5, "stagger_s": 10}))
    http_a, parts_a, _ = world.gateway("replica-a")
    _, parts_b, _ = world.gateway("replica-b")
    await parts_a.traffic.sync_once()
    await parts_b.traffic.sync_once()
    assert (parts_a.traffic.position, parts_b.traffic.position) == (0.0, 0.5)
    async with world.client(http_a) as a:
        await a.post("/v1/spillover/traffic", json={**SWITCH, "min_requests": 5})
        await parts_b.traffic.sync_once()
        assert parts_b.traffic.view()["migrations"]["m"]["adopt_in_s"] == 10
        world.clock.advance(10)
        assert parts_b.traffic.view()["migrations"]["m"]["adopted"] is True
        rolled = await a.post("/v1/spillover/traffic", json={"action": "rollback", "model": "m", "reason": "test"})
        assert rolled.status_code == 200
        await parts_b.traffic.sync_once()
        assert parts_b.traffic.view()["migrations"]["m"]["phase"] == "rolled_back"
        cleared = await a.post("/v1/spillover/traffic", json={"action": "clear", "model": "m"})
        await parts_b.traffic.sync_once()
    assert cleared.json()["traffic"]["switches"] == {}
    assert parts_b.traffic.view()["migrations"] == {}


async def test_a_standby_without_quota_for_the_next_step_holds_it() -> None:
    config = traffic_config()
    providers = [p.model_copy(update={"rpm": 1}) if p.name == "sim" else p for p in config.cloud.providers]
    config = config.model_copy(update={"cloud": config.cloud.model_copy(update={"providers": providers})})
    world = TrafficWorld(config)
    http, parts, _ = world.gateway()
    async with world.client(http) as client:
        await client.post("/v1/spillover/traffic", json=SWITCH)
        for _ in range(120):
            await client.post("/v1/chat/completions", json=CHAT)
    view = parts.traffic.view()["migrations"]["m"]
    assert view["share"] < 1.0 and view["events"][-1]["kind"] == "held"
    assert "rpm 1" in view["events"][-1]["reason"]
