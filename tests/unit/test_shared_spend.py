"""The month's spend of every node (serve_apps/limits/shared_spend.py), against a real Redis.

Two nodes are two SQLite ledgers (one file each, as on two machines) whose budgets read the same sums in the
shared store. What is checked: spend booked on both shows in one monthly total and per tenant; an outage of
the store keeps the budgets' view (the last totals plus this node's own spend) and loses nothing (the sums are
added when it is back); a restart of the store on the same data (the head restarted) keeps the sums.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from serve_apps.limits.shared_spend import SharedSpend, month_key
from serve_apps.limits.spend_ledger import SpendLedger
from serve_apps.state.fallback import FallbackStore
from serve_apps.state.local_redis import LocalRedis
from serve_apps.state.memory import MemoryStore
from serve_apps.state.redis_store import RedisStore
from tests.redis_server import redis_or_fail

pytestmark = pytest.mark.realtime


@pytest.fixture
def server(tmp_path: Path) -> Iterator[LocalRedis]:
    redis = redis_or_fail(tmp_path / "redis")
    yield redis
    redis.stop()


def node(server: LocalRedis, ledger: Path) -> tuple[SpendLedger, FallbackStore]:
    store = FallbackStore(RedisStore(server.url, password=server.password), MemoryStore(clock=time.monotonic))
    shared = SharedSpend(store, clock=time.time, refresh_s=0.05, store_up=lambda: store.view().up)
    return SpendLedger(ledger, clock=time.time, shared=shared), store


async def settle(*ledgers: SpendLedger) -> None:
    for _ in range(10):  # the sends and reads run in tasks; a few turns of the loop and a refresh
        for ledger in ledgers:
            ledger.recent_month_total()
        await asyncio.sleep(0.06)


async def test_spend_booked_on_two_nodes_shows_in_one_monthly_total(server: LocalRedis, tmp_path: Path) -> None:
    a, _ = node(server, tmp_path / "a.sqlite")
    b, _ = node(server, tmp_path / "b.sqlite")
    a.add("r1", "cloud:p/m", "p", "ok", 1.25, "acme")
    b.add("r2", "cloud:p/m", "p", "ok", 0.75, "acme")
    b.add("r3", "cloud:p/m", "p", "error", 0.5, "other")
    await settle(a, b)
    for ledger in (a, b):
        assert ledger.recent_month_total() == pytest.approx(2.5)
        assert ledger.recent_tenant_totals() == pytest.approx({"acme": 2.0, "other": 0.5})
    assert a.month_total() == pytest.approx(1.25)  # each node's file keeps its own rows


async def test_an_outage_keeps_the_budgets_view_and_loses_no_spend(server: LocalRedis, tmp_path: Path) -> None:
    a, store = node(server, tmp_path / "a.sqlite")
    a.add("r1", "cloud:p/m", "p", "ok", 1.0, "acme")
    await settle(a)
    server.stop()  # the store goes away
    a.add("r2", "cloud:p/m", "p", "ok", 2.0, "acme")
    await settle(a)
    assert not store.view().up
    assert a.recent_month_total() == pytest.approx(3.0)  # the last totals and what this node booked since
    assert a.recent_tenant_totals() == pytest.approx({"acme": 3.0})
    again = LocalRedis(server.folder, port=server.port, password=server.password).start()  # back, same data
    try:
        assert await store.check()  # the sums booked meanwhile are added before it counts as up
        client = RedisStore(again.url, password=again.password)
        assert await client.amounts(month_key(time.time())) == pytest.approx({"total": 3.0, "tenant:acme": 3.0})
        await client.close()
    finally:
        again.stop()


async def test_the_sums_survive_a_restart_of_the_store(server: LocalRedis, tmp_path: Path) -> None:
    a, _ = node(server, tmp_path / "a.sqlite")
    a.add("r1", "cloud:p/m", "p", "ok", 4.0, None)
    await settle(a)
    server.stop()  # SIGTERM: the append-only file is written
    again = LocalRedis(server.folder, port=server.port, password=server.password).start()
    try:
        fresh, _ = node(again, tmp_path / "fresh.sqlite")  # a gateway started after the restart, empty file
        await settle(fresh)
        assert fresh.recent_month_total() == pytest.approx(4.0)
    finally:
        again.stop()
