"""Server-Timing's `store` entry: what the shared store added to one request's path (serve_apps/state/timing.py).

FallbackStore times every operation with its injected clock into the request's current StoreTime; concurrent
requests never add to each other's (each task reads its own context), a write started off the path is not
counted, and the gateway's answer carries the sum. `parse` reads it back for `bench overhead`, refusing
malformed values rather than guessing.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import pytest

from router.errors import StoreUnavailable
from router.limits.quota import Reservation
from router.request.auth import TenantPolicy
from serve_apps.dispatch.interfaces import Dispatched, LocalDispatch
from serve_apps.gateway_parts import EdgeSettings
from serve_apps.http.surface import GatewayHTTP, ServedModel
from serve_apps.limits.provider_quotas import SharedQuotas
from serve_apps.limits.tenants import TenantLimits
from serve_apps.state import timing
from serve_apps.state.fallback import FallbackStore
from serve_apps.state.memory import MemoryStore
from serve_apps.state.writes import BackgroundWrites
from tests.fakes import FakeEngine


class Ticking:
    """A clock that moves `step` seconds each time it is read: an operation (two reads) lasts exactly `step`."""

    def __init__(self, step: float) -> None:
        self.now = 0.0
        self.step = step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


class DownPrimary(MemoryStore):
    """A primary that refuses like a Redis that does not answer (RedisStore raises StoreUnavailable)."""

    async def put(self, key: str, value: bytes, ttl_s: float) -> bool:
        raise StoreUnavailable("redis at redis://127.0.0.1:1/0 did not answer")


def store(step: float = 0.002, primary: MemoryStore | None = None) -> FallbackStore:
    return FallbackStore(
        primary or MemoryStore(clock=time.monotonic), MemoryStore(clock=time.monotonic), clock=Ticking(step)
    )


async def test_operations_add_up_in_the_current_request_only() -> None:
    shared = store()

    async def request(ops: int) -> timing.StoreTime:
        spent, token = timing.begin()
        try:
            for i in range(ops):
                await shared.put(f"k{ops}-{i}", b"v", 10)
                await asyncio.sleep(0)
            return spent
        finally:
            timing.CURRENT.reset(token)

    one, three = await asyncio.gather(request(1), request(3))
    assert (one.ops, three.ops) == (1, 3)
    assert one.seconds == pytest.approx(0.002) and three.seconds == pytest.approx(0.006)
    await shared.put("outside", b"v", 10)  # no request open: counted nowhere, no error
    assert timing.CURRENT.get() is None


async def test_a_write_started_off_the_path_is_not_counted_and_a_fallback_is() -> None:
    shared = store(primary=DownPrimary(clock=time.monotonic))
    spent, token = timing.begin()
    try:
        await asyncio.get_running_loop().create_task(shared.get("x"), context=timing.off_path())
        assert spent.ops == 0
        await shared.put("k", b"v", 10)  # the primary refuses: the replica's memory answers, still timed
    finally:
        timing.CURRENT.reset(token)
    assert spent.ops == 1 and not shared.view().up


async def test_records_and_tickets_written_in_the_background_are_not_the_requests_time() -> None:
    shared = store()
    writes = BackgroundWrites(shared, what="decision record")  # serve_apps/learning/shared_records.py's
    spent, token = timing.begin()
    try:
        first = writes.put("a", b"v", 10)
        writes.put("a", b"w", 10, after=first)
        await writes.drain()
    finally:
        timing.CURRENT.reset(token)
    assert writes.written == 2 and spent.ops == 0
    assert await shared.get("a") == b"w"


async def test_tenant_lease_drops_and_quota_settles_are_not_the_requests_time() -> None:
    shared = store()
    limits = TenantLimits(store=shared)
    quotas = SharedQuotas({"sim": (None, 1000)}, shared, clock=time.monotonic)
    spent, token = timing.begin()
    try:
        slot = await limits.admit(TenantPolicy("apps", max_concurrent=2))  # on the path: one lease_take
        reserved = await quotas.try_reserve("sim", 600)  # on the path: one window_add
        assert isinstance(reserved, Reservation)
        slot.release()
        quotas.settle(reserved, 100)
        await limits.leases.flush()
        await quotas.flush()
    finally:
        timing.CURRENT.reset(token)
    assert spent.ops == 2 and await limits.shared_inflight("apps") == 0


def test_header_round_trips_and_malformed_values_are_refused() -> None:
    spent = timing.StoreTime(ops=3, seconds=0.0012345)
    assert spent.header() == 'store;dur=1.234;desc="3 ops"'
    assert timing.parse(spent.header()) == (1.234, 3)
    assert timing.parse('app;dur=4, store;dur=0.5;desc="1 ops"') == (0.5, 1)
    for bad in (None, "", "store", "store;dur=abc", "store;dur=-1", "other;dur=3", "store;desc=x;dur=1", ";" * 10_000):
        assert timing.parse(bad) is None, bad


class StoreDispatch(LocalDispatch):
    """The dispatcher's store operations on a request's path (admission's lease, a window), then the engine."""

    def __init__(self, backend: FakeEngine, shared: FallbackStore, ops: int) -> None:
        super().__init__(backend)
        self.shared = shared
        self.ops = ops

    async def dispatch(self, *args: Any, **kwargs: Any) -> Dispatched:
        for i in range(self.ops):
            await self.shared.lease_take("admission:small", f"h{i}", 100, 10)
        return await super().dispatch(*args, **kwargs)


async def test_the_gateway_answer_says_what_the_store_added() -> None:
    backend = FakeEngine()
    shared = store(step=0.004)
    gateway = GatewayHTTP(
        backend,
        [ServedModel("small", "llama", "cpu", 2048)],
        StoreDispatch(backend, shared, ops=2),
        created=1,
        edge=EdgeSettings(new_id=lambda: "id"),
    )
    chat = {"model": "small", "messages": [{"role": "user", "content": "Hi"}]}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=gateway.app), base_url="http://gw") as client:
        answered = await client.post("/v1/chat/completions", json=chat)
        refused = await client.post("/v1/chat/completions", content=b"{not json")
    assert answered.status_code == 200
    assert timing.parse(answered.headers[timing.HEADER]) == (pytest.approx(8.0), 2)
    assert refused.status_code == 400 and timing.parse(refused.headers[timing.HEADER]) == (0.0, 0)
