"""Tickets through the shared store (serve_apps/traffic/shared_tickets.py), with two gateway replicas over
one store (the in-process MemoryStore, or a real Redis server): a request deferred on replica A is polled
on replica B — pending, then its answer or its error — and never by another tenant. Real Redis runs at
normal priority (`realtime`)."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import AsyncIterator, Callable

import httpx
import pytest

from router.traffic.tickets import Ticket
from serve_apps.state.fallback import FallbackStore
from serve_apps.state.local_redis import LocalRedis
from serve_apps.state.memory import MemoryStore
from serve_apps.state.redis_store import RedisStore
from serve_apps.state.store import SharedStore
from serve_apps.traffic.deferral import TieredDispatch
from serve_apps.traffic.shared_tickets import SharedTickets, decode, encode, ticket_key
from serve_apps.traffic.wiring import TrafficParts
from tests.unit.traffic_fixture import ADMIN, APP, TrafficWorld, traffic_config

pytestmark = pytest.mark.realtime

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
NON_CORE = {"x-business-scenario": "digest", **APP}
Home = Callable[[TrafficWorld, int], SharedStore]  # a fresh client of the one store (its value bound)


@pytest.fixture(params=["memory", "redis"])
async def home(request: pytest.FixtureRequest, server: LocalRedis) -> AsyncIterator[Home]:
    if request.param == "memory":
        memories: dict[int, MemoryStore] = {}

        def memory(world: TrafficWorld, max_value_bytes: int) -> SharedStore:
            made = MemoryStore(clock=world.clock, max_value_bytes=max_value_bytes)
            return memories.setdefault(max_value_bytes, made)

        yield memory
        return
    opened: list[RedisStore] = []

    def redis(world: TrafficWorld, max_value_bytes: int) -> SharedStore:
        opened.append(RedisStore(server.url, password=server.password, max_value_bytes=max_value_bytes))
        return opened[-1]

    await redis(TrafficWorld(traffic_config()), 1)._redis.flushdb()  # type: ignore[attr-defined]
    yield redis
    for store in opened:
        await store.close()


async def _written(parts: TrafficParts) -> None:
    assert isinstance(parts.tickets, SharedTickets)
    await parts.tickets.writes.drain()


async def _settle(tiers: TieredDispatch, parts: TrafficParts) -> None:
    for _ in range(20):
        await asyncio.sleep(0)
    await asyncio.wait_for(tiers.drain(), 5)
    await _written(parts)


async def _two(
    home: Home, max_value_bytes: int = 1024 * 1024
) -> tuple[TrafficWorld, list[httpx.AsyncClient], TieredDispatch, TrafficParts]:
    world = TrafficWorld(traffic_config(), auth=True)
    http_a, parts_a, _ = world.gateway("r-a", home(world, max_value_bytes))
    tiers_a = world.tiers
    assert tiers_a is not None
    http_b, _, _ = world.gateway("r-b", home(world, max_value_bytes))
    return world, [world.client(http_a), world.client(http_b)], tiers_a, parts_a


async def _defer_on_a(a: httpx.AsyncClient, parts: TrafficParts) -> str:
    for target in ("local:m", "cloud:sim", "cloud:spare"):
        drain = {"action": "drain", "target": target}
        assert (await a.post("/v1/spillover/traffic", json=drain, headers=ADMIN)).status_code == 200
    deferred = await a.post("/v1/chat/completions", json=CHAT, headers=NON_CORE)
    assert deferred.status_code == 202, deferred.text
    await _written(parts)
    return str(deferred.json()["id"])


async def test_a_ticket_opened_on_one_replica_is_polled_on_the_other_pending_then_answered(home: Home) -> None:
    world, (a, b), tiers, parts = await _two(home)
    async with a, b:
        ticket = await _defer_on_a(a, parts)
        pending = await b.get(f"/v1/spillover/tickets/{ticket}", headers=APP)
        assert pending.status_code == 202 and pending.json()["status"] == "pending"
        assert pending.headers["x-spillover-ticket"] == ticket
        assert (await b.get(f"/v1/spillover/tickets/{ticket}", headers=ADMIN)).status_code == 404  # another tenant
        await a.post("/v1/spillover/traffic", json={"action": "undrain", "target": "local:m"}, headers=ADMIN)
        world.resume.set()
        await _settle(tiers, parts)
        answered = await b.get(f"/v1/spillover/tickets/{ticket}", headers=APP)
        other = await b.get(f"/v1/spillover/tickets/{ticket}", headers=ADMIN)
        on_a = await a.get(f"/v1/spillover/tickets/{ticket}", headers=APP)
    assert answered.status_code == 200, answered.text
    assert answered.json() == on_a.json() and answered.json()["choices"][0]["message"]["content"] == "Paris"
    assert answered.headers["x-spillover-degraded"] == "deferred"
    assert answered.headers["x-spillover-target"] == "local:m"
    assert other.status_code == 404 and other.json()["error"]["code"] == "ticket_not_found"


async def test_a_deferred_requests_error_reads_the_same_through_the_other_replica(home: Home) -> None:
    world, (a, b), tiers, parts = await _two(home)
    async with a, b:
        ticket = await _defer_on_a(a, parts)
        world.resume.set()  # every target stays drained: the ticket ends with the last error
        await _settle(tiers, parts)
        on_a = await a.get(f"/v1/spillover/tickets/{ticket}", headers=APP)
        on_b = await b.get(f"/v1/spillover/tickets/{ticket}", headers=APP)
    assert on_a.status_code == on_b.status_code == 503
    assert on_a.json() == on_b.json() and on_b.json()["error"]["code"] == "target_unavailable"


async def test_an_answer_over_the_stores_bound_reads_as_dropped_through_the_other_replica(home: Home) -> None:
    world, (a, b), tiers, parts = await _two(
        home, max_value_bytes=300
    )  # a pending ticket fits (~180 B), the answer not (~390 B)
    async with a, b:
        ticket = await _defer_on_a(a, parts)
        assert (await b.get(f"/v1/spillover/tickets/{ticket}", headers=APP)).status_code == 202
        await a.post("/v1/spillover/traffic", json={"action": "undrain", "target": "local:m"}, headers=ADMIN)
        world.resume.set()
        await _settle(tiers, parts)
        on_a = await a.get(f"/v1/spillover/tickets/{ticket}", headers=APP)
        on_b = await b.get(f"/v1/spillover/tickets/{ticket}", headers=APP)
    assert on_a.status_code == 200  # its own replica keeps it
    assert on_b.json()["error"]["code"] == "ticket_answer_dropped"  # as a ticket over traffic.tickets.max_bytes


def test_a_ticket_reads_back_as_it_was_written() -> None:
    ticket = Ticket("t1", "app", "m", 1.0, "done", 2.0, 200, {"a": [1]}, (("x-h", "v"),), 9)
    assert decode(encode(ticket)) == ticket


def _planted(ticket_id: str) -> list[bytes]:
    """Values under app's key for `ticket_id` that are not app's ticket `ticket_id`: each must read as none."""
    good = Ticket(ticket_id, "app", "m", 1.0, "done", 2.0, 200, {"a": 1}, (("x-h", "v"),), 9)
    data = json.loads(encode(good))
    return [
        b"not json",
        b"\xff\xfe{",
        b"[1, 2]",
        b"null",
        b"[" * 100_000,  # nested past the parser's recursion limit
        json.dumps({**data, "owner": "ops"}).encode(),  # another tenant's, under app's key
        json.dumps({**data, "id": "another"}).encode(),
        json.dumps({**data, "state": "weird"}).encode(),
        json.dumps({**data, "status": 999}).encode(),
        json.dumps({**data, "status": "x"}).encode(),
        json.dumps({**data, "headers": [["x-h", "a\r\nset-cookie: s=1"]]}).encode(),
        json.dumps({**data, "headers": 5}).encode(),
        json.dumps({k: v for k, v in data.items() if k != "created_at"}).encode(),
        json.dumps({**{k: v for k, v in data.items() if k != "body"}, "error": "boom"}).encode(),
    ]


async def test_a_malformed_or_another_tenants_value_in_the_store_reads_as_404_never_500(home: Home) -> None:
    world, (a, b), _, _ = await _two(home)
    store = home(world, 1024 * 1024)
    async with a, b:
        for i in range(len(_planted("x"))):
            ticket_id = f"planted-{i}"
            value = _planted(ticket_id)[i]
            await store.put(ticket_key("app", ticket_id), value, 60)
            polled = await b.get(f"/v1/spillover/tickets/{ticket_id}", headers=APP)
            assert polled.status_code == 404, (value[:80], polled.text)
            assert polled.json()["error"]["code"] == "ticket_not_found"
        fine = Ticket("fine", "app", "m", 1.0, "done", 2.0, 200, {"a": 1}, (("x-h", "v"),), 9)
        await store.put(ticket_key("app", "fine"), encode(fine), 60)  # the checks refuse no ticket encode wrote
        polled = await b.get("/v1/spillover/tickets/fine", headers=APP)
    assert polled.status_code == 200 and polled.json() == {"a": 1} and polled.headers["x-h"] == "v"


@pytest.mark.parametrize("fallback", [True, False])
async def test_a_store_that_does_not_answer_never_fails_a_deferral_nor_a_poll(fallback: bool) -> None:
    def unreachable() -> SharedStore:
        with socket.socket() as held:
            held.bind(("127.0.0.1", 0))
            port = held.getsockname()[1]  # nothing listens on it once closed
        dead = RedisStore(f"redis://127.0.0.1:{port}", timeout_s=0.2)
        return FallbackStore(dead, MemoryStore(clock=time.monotonic)) if fallback else dead

    world = TrafficWorld(traffic_config(), auth=True)
    http_a, parts, _ = world.gateway("r-a", unreachable())
    tiers = world.tiers
    assert tiers is not None
    http_b, _, _ = world.gateway("r-b", unreachable())
    async with world.client(http_a) as a, world.client(http_b) as b:
        ticket = await _defer_on_a(a, parts)
        assert (await a.get(f"/v1/spillover/tickets/{ticket}", headers=APP)).status_code == 202  # its own
        on_b = await b.get(f"/v1/spillover/tickets/{ticket}", headers=APP)
        assert on_b.status_code == 404 and on_b.json()["error"]["code"] == "ticket_not_found"  # not a 500
        await a.post("/v1/spillover/traffic", json={"action": "undrain", "target": "local:m"}, headers=ADMIN)
        world.resume.set()
        await _settle(tiers, parts)
        assert (await a.get(f"/v1/spillover/tickets/{ticket}", headers=APP)).status_code == 200
    assert isinstance(parts.tickets, SharedTickets)
    assert parts.tickets.writes.failed == (0 if fallback else 2)  # the fallback's memory took them
