"""GET /metrics answers with every gateway replica's series (serve_apps/telemetry/replica_metrics.py).

Serve's proxy sends each scrape of the one gateway address to a replica of its choosing; here two
replicas' registries share one store (in process and a real Redis), and a scrape of either gives both
replicas' counters as their own series (`gateway_replica`), so a sum over them is what was answered
everywhere. A replica that stopped pushing drops out when its lease expires; with the store down a
replica answers with its own series; an exposition in the store that is not one is skipped.
"""

from __future__ import annotations

import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from router.errors import StoreUnavailable
from serve_apps.state.fallback import FallbackStore
from serve_apps.state.memory import MemoryStore
from serve_apps.state.store import SharedStore
from serve_apps.telemetry.metrics import GatewayMetrics
from serve_apps.telemetry.replica_metrics import LABEL, ReplicaMetrics


@pytest.fixture
def shared(either_store: SharedStore) -> SharedStore:  # tests/unit/conftest.py: once on each home
    return either_store


def requests_total(text: bytes) -> dict[str, float]:
    """Answered requests per replica, read back with Prometheus's own parser."""
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(text.decode()):
        for sample in family.samples:
            if sample.name == "spillover_requests_total":
                replica = sample.labels[LABEL]
                totals[replica] = totals.get(replica, 0.0) + sample.value
    return totals


def replica(store: SharedStore, name: str, answered: int) -> ReplicaMetrics:
    metrics = GatewayMetrics()
    for i in range(answered):
        metrics.answered("m", "local" if i % 2 else "cloud", "local:m", "ok")
    return ReplicaMetrics(metrics.registry, store, name, period_s=0.2)


@pytest.mark.realtime
async def test_a_scrape_of_any_replica_sums_to_every_request_answered(shared: SharedStore) -> None:
    a, b = replica(shared, "aaaa", 3), replica(shared, "bbbb", 5)
    await a.push()
    await b.push()
    for scraped in (await a.render(), await b.render()):
        assert requests_total(scraped) == {"aaaa": 3.0, "bbbb": 5.0}
    time.sleep(0.7)  # b stops pushing (its replica died): gone after three periods
    await a.push()
    assert requests_total(await a.render()) == {"aaaa": 3.0}


class Refusing(MemoryStore):
    """A primary that never answers, as a stopped Redis does (RedisStore raises StoreUnavailable)."""

    async def get(self, key: str) -> bytes | None:
        raise StoreUnavailable("redis at redis://127.0.0.1:1/0 did not answer")

    async def put(self, key: str, value: bytes, ttl_s: float) -> bool:
        raise StoreUnavailable("redis at redis://127.0.0.1:1/0 did not answer")

    async def lease_holders(self, key: str, limit: int = 256) -> list[str]:
        raise StoreUnavailable("redis at redis://127.0.0.1:1/0 did not answer")


async def test_with_the_store_down_a_replica_answers_with_its_own_series() -> None:
    down = FallbackStore(Refusing(clock=time.monotonic), MemoryStore(clock=time.monotonic))
    a = replica(down, "aaaa", 2)
    await a.push()
    assert requests_total(await a.render()) == {"aaaa": 2.0}
    assert not down.view().up


async def test_a_stored_exposition_that_does_not_parse_is_skipped() -> None:
    store = MemoryStore(clock=time.monotonic)
    a = replica(store, "aaaa", 1)
    await a.push()
    for name, junk in (("bad1", b"\xff\xfe not utf-8"), ("bad2", b'spillover_requests_total{a="1" 3\n')):
        await store.put(f"metrics:replica:{name}", junk, 10)
        await store.lease_take("metrics:replicas", name, 100, 10)
    assert requests_total(await a.render()) == {"aaaa": 1.0}


async def test_the_gateway_serves_the_replicas_page_at_metrics() -> None:
    import httpx

    from serve_apps.dispatch.interfaces import LocalDispatch
    from serve_apps.gateway_parts import GatewayParts
    from serve_apps.http.surface import GatewayHTTP, ServedModel
    from tests.fakes import FakeEngine

    store = MemoryStore(clock=time.monotonic)
    other = replica(store, "bbbb", 4)
    await other.push()
    metrics = GatewayMetrics()
    mine = ReplicaMetrics(metrics.registry, store, "aaaa")
    backend = FakeEngine()
    parts = GatewayParts(metrics=metrics, metrics_page=mine.render)
    gateway = GatewayHTTP(
        backend, [ServedModel("m", "llama", "cpu", 2048)], LocalDispatch(backend), created=1, parts=parts
    )
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=gateway.app), base_url="http://gw") as client:
        chat = {"model": "m", "messages": [{"role": "user", "content": "Hi"}]}
        assert (await client.post("/v1/chat/completions", json=chat)).status_code == 200
        page = await client.get("/metrics")
    assert page.status_code == 200
    assert requests_total(page.content) == {"aaaa": 1.0, "bbbb": 4.0}


async def test_store_up_reads_1_from_the_start_and_0_once_the_store_fails() -> None:
    """A replica whose store never failed says so (the gauge was 0 until a first change, read as down)."""
    metrics = GatewayMetrics()
    store = FallbackStore(
        Refusing(clock=time.monotonic), MemoryStore(clock=time.monotonic), on_change=metrics.state_store
    )
    assert b"spillover_state_store_up 1.0" in metrics.render()
    await store.get("k")
    assert b"spillover_state_store_up 0.0" in metrics.render()
    assert b"spillover_state_store_outages_total 1.0" in metrics.render()
