"""The two homes of the shared store the tests of tests/unit/test_shared_limits*.py run against — the
MemoryStore on a manual clock and a real Redis (tests/redis_server.py) — and the "replicas" they build over
one store: limit objects, quotas, a gateway's HTTP surface, and a store that is down (a FallbackStore over
a RedisStore at a closed port).
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass

import httpx

from cluster.config.deployment import parse_config
from cluster.config.tenants import authenticator_for
from router.request.auth import TenantPolicy
from serve_apps.dispatch.interfaces import LocalDispatch
from serve_apps.gateway_parts import EdgeSettings, GatewayParts
from serve_apps.http.surface import GatewayHTTP, ServedModel
from serve_apps.limits.leases import Leases
from serve_apps.limits.provider_quotas import SharedQuotas
from serve_apps.limits.tenants import TenantLimits
from serve_apps.state.fallback import FallbackStore
from serve_apps.state.local_redis import LocalRedis
from serve_apps.state.memory import MemoryStore
from serve_apps.state.redis_store import RedisStore
from serve_apps.state.store import SharedStore
from tests.fakes import FakeClock
from tests.unit.test_tenant_limits import KEYS, MODEL, GatedBackend, raw_config

TENANT = TenantPolicy("apps", max_concurrent=3, requests_per_minute=5)


@dataclass
class Home:
    store: SharedStore
    wait: Callable[[float], Awaitable[None]]  # let this much time pass on the store's clock
    fresh_window: Callable[[], Awaitable[None]]  # at least 2 s before the store's minute rolls over


HOMES = ["memory", "redis"]


@asynccontextmanager
async def open_home(kind: str, server: LocalRedis) -> AsyncIterator[Home]:
    """A test module's `home` fixture (params HOMES): an empty store of that kind."""
    if kind == "memory":
        clock = FakeClock(1000.0)  # 20 s before its minute rolls over

        async def advance(seconds: float) -> None:
            clock.now += seconds

        async def nothing() -> None:
            return None

        yield Home(MemoryStore(clock=clock), advance, nothing)
        return
    store = RedisStore(server.url, password=server.password)
    await store._redis.flushdb()

    async def fresh() -> None:  # windows run on the server's clock: no test may straddle a minute
        seconds, micros = await store._redis.time()
        left = 60 - (seconds % 60 + micros / 1e6)
        if left < 2:
            await asyncio.sleep(left + 0.05)

    await fresh()
    try:
        yield Home(store, asyncio.sleep, fresh)
    finally:
        await store.close()


def replicas(store: SharedStore, ttl_s: float = 5.0, renew_s: float = 1.5) -> tuple[TenantLimits, TenantLimits]:
    return (
        TenantLimits(store=store, leases=Leases(store, ttl_s=ttl_s, renew_s=renew_s)),
        TenantLimits(store=store, leases=Leases(store, ttl_s=ttl_s, renew_s=renew_s)),
    )


async def admitted(limits: Sequence[TenantLimits], tenant: TenantPolicy, n: int) -> tuple[int, list[Exception]]:
    answers = await asyncio.gather(*(limits[i % len(limits)].admit(tenant) for i in range(n)), return_exceptions=True)
    refused = [a for a in answers if isinstance(a, Exception)]
    return n - len(refused), refused


def quotas(store: SharedStore, rpm: int | None, tpm: int | None) -> tuple[SharedQuotas, SharedQuotas]:
    limits = {"sim": (rpm, tpm)}
    return SharedQuotas(limits, store, clock=FakeClock()), SharedQuotas(limits, store, clock=FakeClock())


def gateway(backend: GatedBackend, limits: TenantLimits, **tenant: object) -> httpx.AsyncClient:
    config = parse_config(raw_config(**tenant), "tenants.yaml")
    http = GatewayHTTP(
        backend,
        [ServedModel(MODEL, "llama", "cpu", 4096)],
        LocalDispatch(backend),
        created=0,
        edge=EdgeSettings(authenticator=authenticator_for(config, KEYS)),
        parts=GatewayParts(tenant_limits=limits),
    )
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=http.app), base_url="http://gw")


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def down_store() -> FallbackStore:
    primary = RedisStore(f"redis://127.0.0.1:{closed_port()}/0", timeout_s=0.2)
    return FallbackStore(primary, MemoryStore(clock=FakeClock()))
