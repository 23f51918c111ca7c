"""Degradation tiers through the real gateway and dispatcher: with every target down a core request
gets 503 and a non-core one a 202 ticket that later yields its answer; streams and a full ticket
store shed; tickets are their tenant's; the store is bounded."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from router.errors import TargetUnavailable
from router.traffic.tickets import TicketStore
from serve_apps.clocks import Clocks
from serve_apps.dispatch.dispatcher import Dispatcher
from serve_apps.dispatch.interfaces import NoObserver
from serve_apps.dispatch.parts import DispatchParts
from serve_apps.gateway_parts import GatewayParts, OperatorParts
from serve_apps.http.model_card import ServedModel
from serve_apps.http.surface import GatewayHTTP
from serve_apps.telemetry.metrics import GatewayMetrics
from serve_apps.traffic.board import LocalBoard
from serve_apps.traffic.deferral import TieredDispatch
from serve_apps.traffic.wiring import traffic_parts
from tests.fakes import FakeClock
from tests.unit.traffic_fixture import ADMIN, APP, TrafficWorld, traffic_config

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
CORE = {"x-business-scenario": "chat"}
NON_CORE = {"x-business-scenario": "digest"}


async def _drain_all(client: httpx.AsyncClient, headers: dict[str, str] | None = None) -> None:
    for target in ("local:m", "cloud:sim", "cloud:spare"):
        drain = {"action": "drain", "target": target}
        assert (await client.post("/v1/spillover/traffic", json=drain, headers=headers)).status_code == 200


async def _settle(tiers: TieredDispatch | None) -> None:
    assert tiers is not None
    for _ in range(20):
        await asyncio.sleep(0)
    await asyncio.wait_for(tiers.drain(), 5)


async def test_every_target_down_core_gets_503_and_non_core_a_ticket_that_later_answers() -> None:
    world = TrafficWorld(traffic_config())
    http, _, _ = world.gateway()
    async with world.client(http) as client:
        await _drain_all(client)
        core = await client.post("/v1/chat/completions", json=CHAT, headers=CORE)
        assert core.status_code == 503 and core.json()["error"]["code"] == "target_unavailable"
        deferred = await client.post("/v1/chat/completions", json=CHAT, headers=NON_CORE)
        assert deferred.status_code == 202, deferred.text
        ticket = deferred.json()["id"]
        assert deferred.headers["x-spillover-degraded"] == "deferred"
        assert deferred.headers["x-spillover-ticket"] == ticket
        assert deferred.headers["location"] == f"/v1/spillover/tickets/{ticket}"
        pending = await client.get(f"/v1/spillover/tickets/{ticket}")
        assert pending.status_code == 202 and pending.json()["status"] == "pending"
        await client.post("/v1/spillover/traffic", json={"action": "undrain", "target": "local:m"})
        world.resume.set()
        await _settle(world.tiers)
        answered = await client.get(f"/v1/spillover/tickets/{ticket}")
        metrics = (await client.get("/metrics")).text
    assert answered.status_code == 200, answered.text
    assert answered.json()["choices"][0]["message"]["content"] == "Paris"
    assert answered.headers["x-spillover-degraded"] == "deferred"
    assert answered.headers["x-spillover-target"] == "local:m"
    assert 'spillover_degraded_total{mode="deferred",model="m"} 1.0' in metrics


async def test_a_non_core_stream_and_a_full_ticket_store_are_shed_with_retry_after() -> None:
    world = TrafficWorld(traffic_config())  # tickets.max_entries: 2
    http, _, _ = world.gateway()
    async with world.client(http) as client:
        await _drain_all(client)
        stream = await client.post("/v1/chat/completions", json={**CHAT, "stream": True}, headers=NON_CORE)
        assert stream.status_code == 503 and stream.json()["error"]["code"] == "non_core_shed"
        assert stream.headers["x-spillover-degraded"] == "shed" and stream.headers["retry-after"] == "1"
        codes = [(await client.post("/v1/chat/completions", json=CHAT, headers=NON_CORE)).status_code for _ in range(3)]
    assert codes == [202, 202, 503]


async def test_tickets_off_sheds_non_core() -> None:
    world = TrafficWorld(traffic_config(tickets={"enabled": False}))
    http, _, _ = world.gateway()
    async with world.client(http) as client:
        await _drain_all(client)
        shed = await client.post("/v1/chat/completions", json=CHAT, headers=NON_CORE)
    assert shed.status_code == 503 and shed.json()["error"]["code"] == "non_core_shed"


async def test_non_core_does_not_wait_for_local_room_it_is_deferred_at_once() -> None:
    world = TrafficWorld(traffic_config())
    world.kv = 0.99  # local saturated
    http, _, _ = world.gateway()
    async with world.client(http) as client:
        for target in ("cloud:sim", "cloud:spare"):  # nowhere to burst
            await client.post("/v1/spillover/traffic", json={"action": "drain", "target": target})
        before = world.clock.now
        deferred = await client.post("/v1/chat/completions", json=CHAT, headers=NON_CORE)
    assert deferred.status_code == 202 and world.clock.now == before  # no time in the waiting room
    assert world.local.calls == []


async def test_a_ticket_is_its_tenants_and_unknown_ids_are_404() -> None:
    world = TrafficWorld(traffic_config(), auth=True)
    http, _, _ = world.gateway()
    async with world.client(http) as client:
        await _drain_all(client, ADMIN)
        deferred = await client.post("/v1/chat/completions", json=CHAT, headers={**NON_CORE, **APP})
        ticket = deferred.json()["id"]
        anonymous = await client.get(f"/v1/spillover/tickets/{ticket}")
        other = await client.get(f"/v1/spillover/tickets/{ticket}", headers=ADMIN)
        mine = await client.get(f"/v1/spillover/tickets/{ticket}", headers=APP)
        unknown = await client.get("/v1/spillover/tickets/" + "x" * 5000, headers=APP)
    assert anonymous.status_code == 401
    assert other.status_code == 404 and other.json()["error"]["code"] == "ticket_not_found"
    assert mine.status_code == 202
    assert unknown.status_code == 404


async def test_a_deferred_request_that_never_finds_a_target_ends_with_its_error() -> None:
    world = TrafficWorld(traffic_config())
    http, _, _ = world.gateway()
    async with world.client(http) as client:
        await _drain_all(client)
        ticket = (await client.post("/v1/chat/completions", json=CHAT, headers=NON_CORE)).json()["id"]
        world.resume.set()
        await _settle(world.tiers)
        failed = await client.get(f"/v1/spillover/tickets/{ticket}")
    assert failed.status_code == 503 and failed.json()["error"]["code"] == "target_unavailable"
    assert world.clock.now >= 1_800_000_000.0 + 29  # retried for tickets.max_wait_s


def test_the_ticket_store_is_bounded_by_entries_bytes_and_time() -> None:
    clock = FakeClock()
    store = TicketStore(max_entries=2, max_bytes=200, ttl_s=10, clock=clock)
    assert store.open("a", "", "m") is not None and store.open("b", "", "m") is not None
    assert store.open("c", "", "m") is None and store.refused_total == 1  # every slot pending
    store.finish("a", 200, {"x": "y"})
    assert store.open("c", "", "m") is not None  # the finished one made room
    assert store.get("a", "") is None
    done = store.finish("b", 200, {"big": "z" * 500})
    assert done is not None and done.state == "failed" and done.body is None  # too big to keep
    store.finish("c", 503, TargetUnavailable("down"))
    clock.advance(11)
    assert store.get("c", "") is None and len(store) == 0 and store.bytes_kept == 0


@pytest.mark.parametrize("bad", [{"max_entries": 0}, {"max_bytes": 0}, {"ttl_s": 0}])
def test_bad_store_bounds(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        TicketStore(**{"max_entries": 1, "max_bytes": 1, "ttl_s": 1, **bad}, clock=FakeClock())  # type: ignore[arg-type]


class CountingObserver(NoObserver):
    def __init__(self) -> None:
        self.decisions = 0

    def decided(self, seconds: float) -> None:
        self.decisions += 1


@pytest.mark.parametrize("scenario", [CORE, NON_CORE], ids=["core", "non-core"])
async def test_a_request_is_planned_once_whatever_its_priority(scenario: dict[str, str]) -> None:
    """The tiered dispatch looks at a non-core request's plan before dispatching it (to defer or shed it
    under shortage); that look neither counts as a decision nor moves the hysteresis latches."""
    world = TrafficWorld(traffic_config())
    seen = CountingObserver()
    providers = {"sim": world.sim, "spare": world.spare}
    parts = traffic_parts(world.config, world.local, providers, GatewayMetrics(), "r-a", LocalBoard(world.board),
                          clock=world.clock, sleep=world.ticket_sleep)  # fmt: skip
    dispatcher = Dispatcher(
        world.config,
        world.local,
        providers,
        world.snapshot,
        clocks=Clocks.of(world.clock, sleep=world.sleep),
        parts=DispatchParts(observer=seen, traffic=parts.traffic),
    )
    http = GatewayHTTP(
        world.local,
        [ServedModel("m", "llama", "cpu", 4096)],
        parts.tiered(dispatcher, world.limits),
        created=1,
        parts=GatewayParts(policy=world.config.policy),
        operator=OperatorParts(traffic=parts.routes),
    )
    async with world.client(http) as client:
        answered = await client.post("/v1/chat/completions", json=CHAT, headers=scenario)
    assert answered.status_code == 200, answered.text
    assert seen.decisions == 1
