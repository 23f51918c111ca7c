"""Memory bounds by bytes, not only by count: decision records and stored idempotent answers;
and a request waiting for its idempotent twin holds no admission slot."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from cluster.config.deployment import parse_config
from router.learning.decision import DecisionRecord, DecisionStore
from router.request.idempotency import Fresh, IdempotencyStore, Replay, StoredResponse
from router.request.openai_request import Kind
from serve_apps.backend import BackendReply
from serve_apps.clocks import Clocks
from serve_apps.dispatch.dispatcher import Dispatcher
from serve_apps.gateway_parts import GatewayParts
from serve_apps.http.idempotent import IdempotentReplies
from serve_apps.http.surface import GatewayHTTP, ServedModel
from serve_apps.state.memory import MemoryStore
from tests.fakes import FakeClock, FakeEngine
from tests.unit.test_dispatch import World


def _record(request_id: str, schema_chars: int) -> DecisionRecord:
    contract = {"json_schema": {"description": "x" * schema_chars}}  # a record quotes the client's schema
    return DecisionRecord(request_id, "v1", contract, (), (), started_at=0.0)


def test_decision_records_bounded_by_bytes() -> None:
    store = DecisionStore(max_records=1000, max_bytes=100_000)
    for i in range(50):
        store.put(_record(f"r{i}", 10_000))
    assert store.bytes_kept <= 100_000
    assert 5 <= len(store) < 10  # the count alone (1000) would have kept all 50
    assert store.get("r49") is not None and store.get("r0") is None  # the oldest went first
    store.put(_record("huge", 500_000))  # larger than the bound on its own: the newest is kept
    assert len(store) == 1 and store.get("huge") is not None
    store.put(_record("small", 10))
    assert store.get("small") is not None and store.get("huge") is None
    assert store.bytes_kept == len(_record("small", 10).to_json())


def test_decision_store_counts_a_replaced_record_once() -> None:
    store = DecisionStore(max_records=10, max_bytes=10_000_000)
    store.put(_record("a", 1000))
    store.put(_record("a", 2000))
    assert store.bytes_kept == len(_record("a", 2000).to_json())


def _answer(chars: int) -> StoredResponse:
    return StoredResponse(200, {"choices": [{"message": {"content": "x" * chars}}]})


async def test_idempotent_replies_bounded_by_bytes() -> None:
    """The answers live in the shared store, bounded by its bytes: past them the answers closest to
    expiry (the oldest) go first; one larger than `max_bytes` on its own is not stored at all."""
    clock = FakeClock()
    memory = MemoryStore(clock=clock, max_bytes=50_000)
    store = IdempotencyStore(memory, max_bytes=20_000)
    for i in range(20):
        begun = await store.begin("t", f"k{i}", "fp")
        assert isinstance(begun, Fresh)
        await store.complete("t", f"k{i}", _answer(10_000), begun.marker)
        clock.now += 1
    assert memory.bytes_kept <= 50_000
    assert isinstance(await store.begin("t", "k19", "fp"), Replay)  # the newest answers stay
    begun = await store.begin("t", "k0", "fp")  # the oldest were evicted
    assert isinstance(begun, Fresh)
    await store.abandon("t", "k0", begun.marker)
    begun = await store.begin("t", "big", "fp")
    assert isinstance(begun, Fresh)
    assert not await store.complete("t", "big", _answer(30_000), begun.marker)  # over max_bytes: not stored
    assert isinstance(await store.begin("t", "big", "fp"), Fresh)
    assert memory.bytes_kept <= 50_000


class Blocking(FakeEngine):
    """A local engine whose first chat hangs until `release` is set (a slow generation)."""

    def __init__(self) -> None:
        super().__init__(answer="ok")
        self.started = asyncio.Event()
        self.release = asyncio.Event()

    async def call(self, alias: str, kind: Kind, body: dict[str, Any], request_id: str) -> BackendReply:
        first = not self.calls
        reply = await super().call(alias, kind, body, request_id)  # counted before it hangs
        if first:
            self.started.set()
            await self.release.wait()
        return reply


async def test_idempotency_waiters_hold_no_admission_slot() -> None:
    """Five repeats wait for the first request's answer; the model's admission limit (2) still
    lets an unrelated request run locally, and the waiters are answered by replay."""
    config = parse_config(
        {
            "models": [
                {
                    "alias": "m",
                    "source": "prepared:x",
                    "family": "llama",
                    "admission_limit": 2,
                    "engine_args": {"max_model_len": 4096},
                }
            ]
        },
        "test",
    )
    world, backend = World(), Blocking()
    dispatcher = Dispatcher(config, backend, {}, world.snapshot, clocks=Clocks.of(world.clock, sleep=world.sleep))
    store = IdempotencyStore(MemoryStore(clock=world.clock), ttl_s=600)
    gateway = GatewayHTTP(
        backend,
        [ServedModel("m", "llama", "cpu", 4096)],
        dispatcher,
        created=1,
        parts=GatewayParts(idempotent=IdempotentReplies(store, wait_s=60)),
    )
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    key = {"idempotency-key": "order-7"}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=gateway.app), base_url="http://gw") as client:
        first = asyncio.create_task(client.post("/v1/chat/completions", json=body, headers=key))
        await backend.started.wait()
        twins = [asyncio.create_task(client.post("/v1/chat/completions", json=body, headers=key)) for _ in range(5)]
        for _ in range(20):
            await asyncio.sleep(0)  # let every twin reach its wait
        assert dispatcher.inflight("m") == 1  # only the first request holds a slot
        other = await client.post("/v1/chat/completions", json={**body, "messages": [{"role": "user", "content": "x"}]})
        assert other.status_code == 200 and other.headers["x-spillover-route"] == "local"
        backend.release.set()
        answers = [await first, *[await t for t in twins]]
    assert [a.status_code for a in answers] == [200] * 6
    assert [a.headers.get("x-spillover-idempotent-replay") for a in answers[1:]] == ["true"] * 5
    assert len(backend.calls) == 2  # the first request and the unrelated one; no twin ran
