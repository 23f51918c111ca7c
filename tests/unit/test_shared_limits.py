"""Tenant and provider limits exact across gateway replicas: two "replicas" (two sets of limit objects over
one store) never admit more than `max_concurrent` / `requests_per_minute` / `rpm` / `tpm` together, and a
dead replica's slots come back within the lease TTL. Run against both homes of the shared store
(tests/unit/shared_limits_homes.py): the MemoryStore on a manual clock and a real Redis (real short waits,
`realtime`). A store that is down, and hostile names and keys: tests/unit/test_shared_limits_outage.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence

import pytest

from cluster.config.deployment import parse_config
from router.errors import TenantConcurrencyExceeded, TenantRateLimited
from router.limits.quota import Refusal, Reservation
from router.request.auth import TenantPolicy
from router.routing.capabilities import Registry
from serve_apps.limits.leases import Leases
from serve_apps.limits.tenants import TenantLimits, TenantRates
from serve_apps.resilience.state import Resilience
from serve_apps.state.local_redis import LocalRedis
from serve_apps.state.memory import MemoryStore
from tests.fakes import FakeClock
from tests.unit.shared_limits_homes import (
    HOMES,
    TENANT,
    Home,
    admitted,
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


# -- tenants[].max_concurrent: leases -----------------------------------------------------------------------


async def test_two_replicas_together_never_hold_more_than_max_concurrent(home: Home) -> None:
    a, b = replicas(home.store)
    count, refused = await admitted([a, b], TENANT, 10)
    assert count == 3 and await a.shared_inflight("apps") == 3
    assert a.inflight("apps") + b.inflight("apps") == 3  # each replica's own share
    assert all(isinstance(e, TenantConcurrencyExceeded) for e in refused)
    answer = refused[0]
    assert isinstance(answer, TenantConcurrencyExceeded)  # the refusal reads as it did per replica
    assert answer.status_code == 429 and answer.code == "tenant_concurrency_exceeded" and answer.retry_after_s == 1.0
    assert answer.message == (
        "tenant 'apps' already has 3 requests in flight (tenants[].max_concurrent); retry when one has finished"
    )


async def test_a_released_slot_frees_at_once_on_every_replica(home: Home) -> None:
    a, b = replicas(home.store)
    slots = [await a.admit(TENANT) for _ in range(3)]
    with pytest.raises(TenantConcurrencyExceeded):
        await b.admit(TENANT)
    slots[0].release()
    slots[0].release()  # twice: one lease given back
    await a.leases.flush()
    await b.admit(TENANT)  # at once, not after the TTL
    with pytest.raises(TenantConcurrencyExceeded):
        await b.admit(TENANT)
    assert a.inflight("apps") == 2 and b.inflight("apps") == 1


async def test_a_slot_this_replica_gave_back_is_free_for_it_at_once(home: Home) -> None:
    a, _ = replicas(home.store)
    slots = [await a.admit(TENANT) for _ in range(3)]
    slots[0].release()  # no flush: the next admit waits for this replica's own drop
    await a.admit(TENANT)
    assert await a.shared_inflight("apps") == 3


async def test_a_lease_whose_holder_stops_renewing_expires(home: Home) -> None:
    a, b = replicas(home.store, ttl_s=0.4, renew_s=0.1)
    for _ in range(3):
        await a.admit(TENANT)
    for _ in range(4):  # renewed: held past its TTL
        await home.wait(0.2)
        await a.leases.renew()
    with pytest.raises(TenantConcurrencyExceeded):
        await b.admit(TENANT)
    await home.wait(0.6)  # replica a died: nothing renews its leases any more
    count, _ = await admitted([b], TENANT, 4)
    assert count == 3


async def test_a_deferred_tickets_slot_counts_without_a_check(home: Home) -> None:
    a, b = replicas(home.store)
    held = [await a.admit(TENANT) for _ in range(3)]
    kept = await a.keep("apps")  # one more in flight although the limit is reached
    assert await b.shared_inflight("apps") == 4
    for slot in held:
        slot.release()
    await a.leases.flush()
    await b.admit(TENANT)
    await b.admit(TENANT)
    with pytest.raises(TenantConcurrencyExceeded):
        await b.admit(TENANT)  # the ticket still holds its slot
    kept.release()
    await a.leases.flush()
    await b.admit(TENANT)


class Counting:
    """A store that counts the lease renewals asked of it."""

    def __init__(self, inner: MemoryStore) -> None:
        self.inner = inner
        self.renewals: list[tuple[str, list[str]]] = []
        self.broken = False  # the first renewal raises what no store should

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)

    async def lease_renew(self, key: str, holders: Sequence[str], ttl_s: float) -> None:
        self.renewals.append((key, list(holders)))
        if len(self.renewals) == 1 and self.broken:
            raise RuntimeError("a bug in the store")
        await self.inner.lease_renew(key, holders, ttl_s)


async def test_one_renewal_per_tenant_renews_every_lease_the_replica_holds() -> None:
    store = Counting(MemoryStore(clock=FakeClock()))
    limits = TenantLimits(store=store)  # type: ignore[arg-type]
    for _ in range(3):
        await limits.admit(TENANT)
    await limits.admit(TenantPolicy("rich", max_concurrent=9))
    await limits.leases.renew()
    assert sorted((key, len(holders)) for key, holders in store.renewals) == [
        ("tenant-slots:apps", 3),
        ("tenant-slots:rich", 1),
    ]


# -- tenants[].requests_per_minute: a window ----------------------------------------------------------------


async def test_two_replicas_together_never_pass_requests_per_minute(home: Home) -> None:
    a, b = TenantRates(home.store), TenantRates(home.store)
    answers = await asyncio.gather(*((a, b)[i % 2].check(TENANT) for i in range(12)), return_exceptions=True)
    refused = [e for e in answers if isinstance(e, Exception)]
    assert len(refused) == 7 and all(isinstance(e, TenantRateLimited) for e in refused)
    answer = refused[0]
    assert isinstance(answer, TenantRateLimited)
    assert answer.status_code == 429 and answer.code == "tenant_rate_limited"
    assert answer.message == "tenant 'apps' is over its 5 requests per minute"
    assert answer.retry_after_s is not None and 0 < answer.retry_after_s <= 60


# -- cloud.providers[].rpm / tpm: windows -------------------------------------------------------------------


async def test_two_replicas_together_never_send_more_than_rpm(home: Home) -> None:
    a, b = quotas(home.store, 4, None)
    answers = await asyncio.gather(*((a, b)[i % 2].try_reserve("sim", 10) for i in range(10)))
    assert sum(isinstance(x, Reservation) for x in answers) == 4
    refusal = next(x for x in answers if isinstance(x, Refusal))
    assert refusal.provider == "sim" and refusal.reason == "sim: 4/4 requests in this 60s window (all gateway replicas)"
    assert refusal.retry_in_s is not None and 0 < refusal.retry_in_s <= 60


async def test_tpm_reserves_the_estimate_and_settles_the_actual_usage(home: Home) -> None:
    a, b = quotas(home.store, None, 1000)
    first = await a.try_reserve("sim", 600)
    assert isinstance(first, Reservation)
    refused = await b.try_reserve("sim", 600)
    assert isinstance(refused, Refusal)
    assert refused.reason == "sim: 600/1000 tokens in this 60s window (all gateway replicas), request needs 600"
    a.settle(first, 100)  # the provider said 100 tokens
    a.settle(first, 900)  # a second settle changes nothing
    await a.flush()
    assert isinstance(await b.try_reserve("sim", 600), Reservation)  # 700 of 1000
    assert isinstance(await b.try_reserve("sim", 301), Refusal)
    too_big = await a.try_reserve("sim", 1001)
    assert isinstance(too_big, Refusal) and too_big.retry_in_s is None  # waiting cannot help


async def test_a_request_refused_on_tokens_gives_its_request_back(home: Home) -> None:
    a, b = quotas(home.store, 2, 100)
    assert isinstance(await a.try_reserve("sim", 90), Reservation)
    assert isinstance(await b.try_reserve("sim", 50), Refusal)  # tokens: the request count is given back
    await b.flush()
    assert isinstance(await b.try_reserve("sim", 5), Reservation)  # the second request of two
    refusal = await a.try_reserve("sim", 1)
    assert isinstance(refusal, Refusal) and "2/2 requests" in refusal.reason
    assert a.usage()["sim"] == (1, 90) and b.usage()["sim"] == (1, 5)  # each replica's own traffic


CONFIG = {
    "models": [{"alias": "m", "source": "hf:org/m", "family": "llama"}],
    "cloud": {"providers": [{"name": "sim", "base_url": "http://127.0.0.1:1/v1", "rpm": 2, "models": {"m": "m"}}]},
}


async def test_two_gateways_resilience_gates_share_the_providers_rpm(home: Home) -> None:
    config = parse_config(CONFIG, "test")
    a, b = Resilience(config, store=home.store), Resilience(config, store=home.store)
    cloud = next(
        t for t in Registry.from_config(config.models, config.cloud.providers).for_alias("m") if t.kind == "cloud"
    )
    gates = [await r.gate(cloud, has_alternative=False, tokens=1) for r in (a, b, a, b)]
    assert [g.refused is None for g in gates] == [True, True, False, False]
    assert gates[2].refused == "sim: 2/2 requests in this 60s window (all gateway replicas)"


# -- the HTTP answers over one store, two gateways -----------------------------------------------------------


async def test_a_request_on_one_gateway_holds_the_slot_on_the_other(home: Home) -> None:
    backend = GatedBackend()
    a, b = replicas(home.store)
    async with gateway(backend, a, max_concurrent=1) as one, gateway(backend, b, max_concurrent=1) as other:
        first = asyncio.create_task(one.post("/v1/chat/completions", json=CHAT, headers=APPS))
        while backend.calls == 0:
            await asyncio.sleep(0)
        refused = await other.post("/v1/chat/completions", json=CHAT, headers=APPS)
        rich = asyncio.create_task(other.post("/v1/chat/completions", json=CHAT, headers=RICH))  # another tenant
        while backend.calls < 2:
            await asyncio.sleep(0)
        backend.gate.set()
        assert (await first).status_code == 200 and (await rich).status_code == 200
        await a.leases.flush()  # the drop of the finished request's lease
        again = await other.post("/v1/chat/completions", json=CHAT, headers=APPS)
    assert refused.status_code == 429 and refused.headers["retry-after"] == "1"
    assert refused.json()["error"]["code"] == "tenant_concurrency_exceeded"
    assert again.status_code == 200


async def test_the_renewal_loop_survives_a_failed_round_and_stops_when_cancelled() -> None:
    store = Counting(MemoryStore(clock=FakeClock()))
    store.broken = True
    rounds = 0

    async def tick(seconds: float) -> None:
        nonlocal rounds
        rounds += 1
        if rounds > 3:
            await asyncio.Event().wait()  # the replica idles until it is cancelled
        await asyncio.sleep(0)

    limits = TenantLimits(store=store, leases=Leases(store, sleep=tick))  # type: ignore[arg-type]
    await limits.admit(TENANT)
    loop = asyncio.get_running_loop().create_task(limits.run())
    while rounds <= 3 and not loop.done():
        await asyncio.sleep(0)
    assert not loop.done() and len(store.renewals) == 3  # the first raised; the loop went on
    loop.cancel()
    with pytest.raises(asyncio.CancelledError):
        await loop
