"""Deferred requests stay their tenant's, through the real gateway, dispatcher and tiered dispatch: a
pending ticket counts against its tenant's concurrency, the ticket store has a per-tenant share, and a
ticket's background retry keeps its decision record under its owner (another tenant gets 404)."""

from __future__ import annotations

import asyncio
import time

from cluster.config.deployment import SpilloverConfig, parse_config
from router.request.auth import TenantPolicy
from router.traffic.tickets import TicketStore
from tests.fakes import FakeClock
from tests.unit.test_deferral import CHAT, NON_CORE, _drain_all, _settle
from tests.unit.traffic_fixture import ADMIN, APP, TrafficWorld, traffic_config

FLOOD, OTHER = {"authorization": "Bearer sk-flood"}, {"authorization": "Bearer sk-b"}
TENANTS = (TenantPolicy("app", max_concurrent=1), TenantPolicy("flood"), TenantPolicy("b"))
BOUND_S = 20.0


def authed(config: SpilloverConfig) -> SpilloverConfig:
    raw = config.model_dump(mode="json")
    raw["gateway"]["auth"] = True
    raw["tenants"] = [{"name": t.name, "api_key_env": f"{t.name.upper()}_KEY"} for t in (*TENANTS, TenantPolicy("ops"))]
    return parse_config(raw, "test")


async def test_tickets_count_against_tenant_limits_and_the_store_has_a_per_tenant_share() -> None:
    tickets = {"retry_s": 1, "max_wait_s": 30, "max_entries": 4, "tenant_share": 0.25}  # one ticket per tenant
    world = TrafficWorld(authed(traffic_config(tickets=tickets)), auth=True, tenants=TENANTS)
    http, _, _ = world.gateway()
    started = time.monotonic()
    async with world.client(http) as client:
        await _drain_all(client, ADMIN)
        post = "/v1/chat/completions"
        first = await client.post(post, json=CHAT, headers={**NON_CORE, **APP})
        assert first.status_code == 202, first.text
        assert world.limits.inflight("app") == 1  # the pending ticket is app's one request in flight
        # app (max_concurrent: 1) retries 50 times in the background's face: each one is refused at the edge
        retries = await asyncio.gather(*(client.post(post, json=CHAT, headers={**NON_CORE, **APP}) for _ in range(50)))
        assert {r.status_code for r in retries} == {429}
        assert {r.json()["error"]["code"] for r in retries} == {"tenant_concurrency_exceeded"}
        # a tenant without a concurrency limit fills only its share of the store ...
        flood = [(await client.post(post, json=CHAT, headers={**NON_CORE, **FLOOD})).status_code for _ in range(10)]
        assert flood[0] == 202 and set(flood[1:]) == {503}
        # ... so another tenant is still deferred, not shed
        other = await client.post(post, json=CHAT, headers={**NON_CORE, **OTHER})
        assert other.status_code == 202, other.text
        tiers = world.tiers
        assert tiers is not None and len(tiers.tickets) == 3 and tiers.tickets.held_by("flood") == 1
        await client.post("/v1/spillover/traffic", json={"action": "undrain", "target": "local:m"}, headers=ADMIN)
        world.resume.set()
        await _settle(world.tiers)
        assert world.limits.inflight("app") == 0  # the ticket finished: app's slot is free again
        answered = await client.get(f"/v1/spillover/tickets/{first.json()['id']}", headers=APP)
        again = await client.post(post, json=CHAT, headers={**NON_CORE, **APP})
    assert answered.status_code == 200 and again.status_code == 200
    assert time.monotonic() - started < BOUND_S


async def test_deferred_retry_record_owner_only() -> None:
    world = TrafficWorld(authed(traffic_config()), auth=True, tenants=TENANTS)
    http, _, _ = world.gateway()
    async with world.client(http) as client:
        await _drain_all(client, ADMIN)
        mine = {**NON_CORE, **APP, "x-request-id": "order-7"}
        deferred = await client.post("/v1/chat/completions", json=CHAT, headers=mine)
        assert deferred.status_code == 202
        # while the ticket is pending another tenant sends the same request id: it may not take it over
        theirs = await client.post("/v1/chat/completions", json=CHAT, headers={**OTHER, "x-request-id": "order-7"})
        assert theirs.status_code == 503 and theirs.headers["x-spillover-request-id"] != "order-7"
        await client.post("/v1/spillover/traffic", json={"action": "undrain", "target": "local:m"}, headers=ADMIN)
        world.resume.set()
        await _settle(world.tiers)
        own = await client.get("/v1/spillover/decisions/order-7", headers=APP)
        other = await client.get("/v1/spillover/decisions/order-7", headers=OTHER)
        admin = await client.get("/v1/spillover/decisions/order-7", headers=ADMIN)
    assert own.status_code == 200, own.text
    assert own.json()["chosen"] == "local:m" and own.json()["contract"]["tenant"] == "app"
    assert other.status_code == 404 and admin.status_code == 404


def test_the_ticket_store_share_is_per_tenant_in_entries_and_bytes() -> None:
    store = TicketStore(max_entries=4, max_bytes=400, ttl_s=10, clock=FakeClock(), tenant_share=0.5)
    assert store.open("a1", "a", "m") is not None and store.open("a2", "a", "m") is not None
    assert store.open("a3", "a", "m") is None  # a's share (2) is pending
    store.finish("a1", 200, {"x": "y"})
    assert store.open("a3", "a", "m") is not None and store.get("a1", "a") is None  # its own finished one made room
    assert store.open("b1", "b", "m") is not None and store.open("b2", "b", "m") is not None
    store.finish("b1", 200, {"v": "b" * 50})
    store.finish("a2", 200, {"v": "a" * 150})
    done = store.finish("a3", 200, {"v": "a" * 150})  # past a's byte share (200): a's own older answer goes
    assert done is not None and done.state == "done"
    assert store.get("a2", "a") is None and store.get("b1", "b") is not None
    store.finish("b2", 503, {"error": "x"})
    assert store.open("c1", "c", "m") is not None and len(store) == 4
    assert store.open("c2", "c", "m") is not None  # full: the tenant holding the most (b) makes room
    assert store.get("b1", "b") is None and store.get("a3", "a") is not None
