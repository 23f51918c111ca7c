"""Admission exact across gateway replicas: every admitted local request holds a lease on its model's limit in
the shared store (serve_apps/dispatch/reservations.py), run against the in-process store and a real Redis.

Several gateways are several Reservations (or Dispatchers) over one store, as several gateway replicas are over
one Redis. What is checked is the model's own view: the requests the slow engine holds at once never pass the
limit, however many gateways admit, and a gateway that dies gives its admissions back within the lease TTL.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from router.request.openai_request import Kind
from serve_apps.backend import BackendReply
from serve_apps.clocks import Clocks
from serve_apps.dispatch.dispatcher import Dispatcher
from serve_apps.dispatch.parts import DispatchParts
from serve_apps.dispatch.reservations import Reservations
from serve_apps.state.store import SharedStore
from tests.fakes import FakeProvider, completion
from tests.unit.test_dispatch import CHAT, World, contract_for, make_config

pytestmark = pytest.mark.realtime


@pytest.fixture
def store(either_store: SharedStore) -> SharedStore:  # tests/unit/conftest.py: once on each home
    return either_store


async def test_three_gateways_together_never_admit_past_the_limit(store: SharedStore) -> None:
    gateways = [Reservations(store, f"gw{i}") for i in range(3)]
    granted = await asyncio.gather(*(gateways[i % 3].reserve("m", f"r{i}", 4) for i in range(24)))
    assert sum(granted) == 4
    assert await store.lease_count("admission:m") == 4
    for i, ok in enumerate(granted):
        if ok:
            gateways[i % 3].finish(f"r{i}")
    await asyncio.sleep(0.05)  # the drops run off the request path
    assert await store.lease_count("admission:m") == 0


async def test_a_dead_gateways_admissions_expire_and_a_live_ones_are_renewed(store: SharedStore) -> None:
    dead = Reservations(store, "dead", ttl_s=0.6, refresh_s=0.05)
    alive = Reservations(store, "alive", ttl_s=0.6, refresh_s=0.05)
    assert await dead.reserve("m", "d1", 4) and await dead.reserve("m", "d2", 4)
    assert await alive.reserve("m", "a1", 4)
    renewing = asyncio.create_task(alive.run(lambda: ["m"]))  # the dead one renews nothing
    try:
        await asyncio.sleep(1.2)
        assert await store.lease_count("admission:m") == 1  # only the live gateway's admission is left
        assert alive.inflight("m") == 1  # its count refreshed from the store
        assert await dead.reserve("m", "d3", 2)  # room again
    finally:
        renewing.cancel()


class SlowEngine:
    """A local model that takes `seconds` per answer and counts how many it holds at once (its own view)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.holding = 0
        self.most = 0
        self.calls = 0

    async def call(self, alias: str, kind: Kind, body: dict[str, Any], request_id: str) -> BackendReply:
        self.calls += 1
        self.holding += 1
        self.most = max(self.most, self.holding)
        try:
            await asyncio.sleep(self.seconds)
        finally:
            self.holding -= 1
        return BackendReply(body=completion(alias, "Paris"))

    async def check_health(self, alias: str, timeout_s: float) -> str | None:
        return None


async def test_three_dispatchers_send_a_slow_model_at_most_its_limit_and_burst_the_rest(store: SharedStore) -> None:
    world, engine, cloud = World(), SlowEngine(0.3), FakeProvider()
    config = make_config(admission_limit=4)
    gateways = [
        Dispatcher(
            config,
            engine,
            {"sim": cloud},
            world.snapshot,
            poll_s=0.05,
            clocks=Clocks.of(world.clock, sleep=asyncio.sleep),
            parts=DispatchParts(reservations=Reservations(store, f"gw{i}")),
        )
        for i in range(3)
    ]

    async def one(i: int) -> str:
        done = await gateways[i % 3].dispatch("chat", dict(CHAT), f"r{i}", contract=contract_for(CHAT), deadline_s=5)
        return done.route

    routes = await asyncio.gather(*(one(i) for i in range(24)))
    assert engine.most <= 4 and engine.calls == routes.count("local")
    assert routes.count("local") >= 4 and routes.count("cloud") == 24 - routes.count("local")
    await asyncio.sleep(0.05)
    assert await store.lease_count("admission:m") == 0
