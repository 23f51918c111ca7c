"""Tenant and provider limits while the shared store does not answer: each replica falls back to its own
counting (the FallbackStore's memory), still enforces every limit, and never fails a request — a store that
is down from the start or goes down mid-traffic. And hostile input: tenant and provider names with odd
characters each keep keys of their own in both homes; odd API keys are a 401, never a 5xx.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from router.errors import TenantConcurrencyExceeded, TenantRateLimited
from router.limits.quota import Refusal, Reservation
from router.request.auth import TenantPolicy
from serve_apps.limits.leases import Leases
from serve_apps.limits.provider_quotas import SharedQuotas
from serve_apps.limits.tenants import TenantLimits, TenantRates
from serve_apps.state.fallback import FallbackStore
from serve_apps.state.local_redis import LocalRedis
from serve_apps.state.memory import MemoryStore
from serve_apps.state.redis_store import RedisStore
from tests.fakes import FakeClock
from tests.unit.shared_limits_homes import (
    HOMES,
    TENANT,
    Home,
    admitted,
    closed_port,
    down_store,
    gateway,
    open_home,
    quotas,
    replicas,
)
from tests.unit.test_tenant_limits import APPS, CHAT, RICH, GatedBackend

pytestmark = pytest.mark.realtime


@pytest.fixture(params=HOMES)
async def home(request: pytest.FixtureRequest, server: LocalRedis) -> AsyncIterator[Home]:
    async with open_home(request.param, server) as opened:
        yield opened


# -- hostile names: every key stays its own -------------------------------------------------------------------

ODD = ["a:b", "a", "tenant-rpm:a", "*", "{a}", "a b\n", "ü名", "a:1", "../x", "%s"]


async def test_tenant_names_with_odd_characters_each_count_on_their_own(home: Home) -> None:
    a, b = replicas(home.store)
    for name in ODD:  # config names are ^[A-Za-z0-9][A-Za-z0-9_.-]*$; the limits must not rely on it
        tenant = TenantPolicy(name, max_concurrent=2, requests_per_minute=3)
        count, _ = await admitted([a, b], tenant, 3)
        assert count == 2, name
        answers = await asyncio.gather(*(a.rates.check(tenant) for _ in range(4)), return_exceptions=True)
        assert sum(isinstance(e, TenantRateLimited) for e in answers) == 1, name
    assert [await b.shared_inflight(name) for name in ODD] == [2] * len(ODD)


async def test_provider_names_with_odd_characters_each_count_on_their_own(home: Home) -> None:
    limits = {name: (1, None) for name in ODD}
    a = SharedQuotas(limits, home.store, clock=FakeClock())
    reserved = [await a.try_reserve(name, 1) for name in ODD]
    assert all(isinstance(r, Reservation) for r in reserved)
    refused = [await a.try_reserve(name, 1) for name in ODD]
    assert all(isinstance(r, Refusal) for r in refused)


# -- a store that is down --------------------------------------------------------------------------------------


async def test_a_store_that_is_down_still_enforces_every_limit_per_replica() -> None:
    store = down_store()
    limits = TenantLimits(store=store)
    count, refused = await admitted([limits], TENANT, 5)
    assert count == 3 and all(isinstance(e, TenantConcurrencyExceeded) for e in refused)
    assert not store.view().up
    rates = TenantRates(store)
    answers = await asyncio.gather(*(rates.check(TENANT) for _ in range(7)), return_exceptions=True)
    assert sum(isinstance(e, TenantRateLimited) for e in answers) == 2
    a, _ = quotas(store, 2, 100)
    reserved = [await a.try_reserve("sim", 10) for _ in range(3)]
    assert [isinstance(r, Reservation) for r in reserved] == [True, True, False]
    first = reserved[0]
    assert isinstance(first, Reservation)
    a.settle(first, 5)
    await a.flush()
    await limits.leases.renew()  # nothing raises
    await store.close()


async def test_a_gateway_over_a_store_that_is_down_answers_429_never_5xx() -> None:
    backend = GatedBackend()
    backend.gate.set()
    store = down_store()
    async with gateway(backend, TenantLimits(store=store), requests_per_minute=2) as client:
        codes = [(await client.post("/v1/chat/completions", json=CHAT, headers=APPS)).status_code for _ in range(3)]
        models = await client.get("/v1/models", headers=RICH)
    assert codes == [200, 200, 429] and models.status_code == 200
    await store.close()


async def test_with_the_store_down_each_replica_counts_on_its_own() -> None:
    stores = down_store(), down_store()  # two replicas, each with its own fallback memory
    a, b = (TenantLimits(store=store) for store in stores)
    count, _ = await admitted([a, b], TENANT, 10)
    assert count == 6  # each replica enforces the whole limit on its own: twice it together, never a failure
    assert all(not store.view().up for store in stores)
    for store in stores:
        await store.close()


async def test_a_store_that_goes_down_mid_traffic_never_fails_the_request(server: LocalRedis) -> None:
    redis = RedisStore(server.url, password=server.password)
    await redis._redis.flushdb()
    store = FallbackStore(redis, MemoryStore(clock=FakeClock()))
    limits = TenantLimits(store=store)
    held = await limits.admit(TENANT)
    assert await limits.shared_inflight("apps") == 1 and store.view().up
    broken = RedisStore(f"redis://127.0.0.1:{closed_port()}/0", timeout_s=0.2)
    store.primary = broken  # Redis goes away while a request holds its slot
    held.release()  # its drop goes to the memory: nothing raises
    await limits.leases.flush()
    count, refused = await admitted([limits], TENANT, 5)
    assert count == 3 and all(isinstance(e, TenantConcurrencyExceeded) for e in refused)
    assert not store.view().up
    await broken.close()
    await redis.close()


@pytest.mark.parametrize(
    "header",
    ["Bearer sk-apps-tenant:*", "Bearer {x}", "Bearer \u00fc\u540d", "Bearer " + "k" * 10_000, "Bearer a\tb", "Bearer"],
)
async def test_hostile_api_keys_are_401_never_5xx(header: str) -> None:
    backend = GatedBackend()
    backend.gate.set()
    store = down_store()
    async with gateway(backend, TenantLimits(store=store), requests_per_minute=2, max_concurrent=1) as client:
        answer = await client.post(
            "/v1/chat/completions", json=CHAT, headers={b"authorization": header.encode("utf-8")}
        )
    assert answer.status_code == 401 and answer.json()["error"]["code"]
    await store.close()


def test_the_lease_renewal_comes_well_within_the_ttl() -> None:
    with pytest.raises(ValueError, match="below ttl_s"):
        Leases(MemoryStore(clock=FakeClock()), ttl_s=1.0, renew_s=1.0)
