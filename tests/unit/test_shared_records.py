"""Decision records and feedback through the shared store (serve_apps/learning/shared_records.py), with two
gateway replicas: "A" and "B" are each a full set of the gateway's objects (dispatcher, decision store,
learning state, HTTP layer) over one store, the in-process MemoryStore or a real Redis server. A record
made on A is read on B every time, never by another tenant; a record over the store's value bound stays
on A; a store that does not answer never fails a request; one verdict per request and source kind holds
across replicas. Real Redis runs at normal priority (`realtime`).
"""

from __future__ import annotations

import json
import socket
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from cluster.config.tenants import authenticator_for
from router.routing.snapshot import ClusterSnapshot, ReplicaStats
from serve_apps.clocks import Clocks
from serve_apps.dispatch.dispatcher import Dispatcher
from serve_apps.dispatch.interfaces import NoObserver
from serve_apps.dispatch.parts import DispatchParts
from serve_apps.gateway_parts import EdgeSettings, GatewayParts
from serve_apps.http.surface import GatewayHTTP, ServedModel
from serve_apps.learning.routes import LearningRoutes
from serve_apps.learning.shared_records import SharedDecisions, record_key
from serve_apps.learning.state import Learning
from serve_apps.state.fallback import FallbackStore
from serve_apps.state.local_redis import LocalRedis
from serve_apps.state.memory import MemoryStore
from serve_apps.state.redis_store import RedisStore
from serve_apps.state.store import SharedStore
from tests.fakes import FakeEngine
from tests.unit.security_gateway import APPS, BOUND_S, KEYS, MODEL, OTHER, config

pytestmark = pytest.mark.realtime

FEEDBACK = "/v1/spillover/feedback"
Home = Callable[..., SharedStore]  # a fresh client of the one store: home(max_value_bytes=...)


@dataclass
class Replica:
    client: httpx.AsyncClient
    decisions: SharedDecisions

    async def chat(self, request_id: str, headers: dict[str, str] = APPS) -> None:
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
        reply = await self.client.post(
            "/v1/chat/completions", json=body, headers={**headers, "x-request-id": request_id}
        )
        assert reply.status_code == 200, reply.text
        await self.decisions.writes.drain()  # the shared copy lands a round trip after the answer

    async def record(self, request_id: str, headers: dict[str, str] = APPS) -> httpx.Response:
        return await self.client.get(f"/v1/spillover/decisions/{request_id}", headers=headers)

    async def feedback(self, request_id: str, source: str, headers: dict[str, str] = APPS) -> httpx.Response:
        body = {"request_id": request_id, "outcome": "failure", "source": source}
        return await self.client.post(FEEDBACK, json=body, headers=headers)


def replica(store: SharedStore) -> Replica:
    cfg = config()
    stats = ReplicaStats(MODEL, "r1", "n1", 0.0, 0.1, 0, 0, 0, 0, 364, 128)
    snapshot = ClusterSnapshot(taken_at=0.0, replicas=(stats,), max_age_s=1e12)
    learning = Learning.from_config(cfg, clock=lambda: 1234.5)
    decisions = SharedDecisions(store, ttl_s=cfg.gateway.decisions_ttl_s, max_records=cfg.gateway.decisions_kept)
    local = FakeEngine(answer="ok")
    dispatcher = Dispatcher(
        cfg,
        local,
        {},
        lambda: snapshot,
        clocks=Clocks.of(lambda: 0.0),
        parts=DispatchParts(decisions=decisions, observer=learning.observer(NoObserver()), quality=learning.quality),
    )
    http = GatewayHTTP(
        local,
        [ServedModel(MODEL, "llama", "cpu", 4096)],
        dispatcher,
        created=1,
        edge=EdgeSettings(authenticator=authenticator_for(cfg, KEYS)),
        parts=GatewayParts(policy=cfg.policy, decisions=decisions, learning=LearningRoutes(learning, decisions)),
    )
    transport = httpx.ASGITransport(app=http.app, raise_app_exceptions=False)
    return Replica(httpx.AsyncClient(transport=transport, base_url="http://gw", timeout=BOUND_S), decisions)


@pytest.fixture(params=["memory", "redis"])
async def home(request: pytest.FixtureRequest, server: LocalRedis) -> AsyncIterator[Home]:
    """Each replica's own client of one store: one MemoryStore (the embedded default), or one Redis."""
    if request.param == "memory":
        memories: dict[int, MemoryStore] = {}

        def memory(max_value_bytes: int = 1024 * 1024) -> SharedStore:
            return memories.setdefault(max_value_bytes, MemoryStore(clock=lambda: 0.0, max_value_bytes=max_value_bytes))

        yield memory
        return
    opened: list[RedisStore] = []

    def redis(max_value_bytes: int = 1024 * 1024) -> SharedStore:
        opened.append(RedisStore(server.url, password=server.password, max_value_bytes=max_value_bytes))
        return opened[-1]

    await redis()._redis.flushdb()  # type: ignore[attr-defined]
    yield redis
    for store in opened:
        await store.close()


def closed_port() -> int:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        port: int = held.getsockname()[1]
    return port  # nothing listens on it now


async def test_a_record_made_on_one_replica_is_read_on_the_other_every_time_and_only_by_its_tenant(
    home: Home,
) -> None:
    a, b = replica(home()), replica(home())
    for i in range(10):
        made, other = (a, b) if i % 2 == 0 else (b, a)
        await made.chat(f"req-{i}")
        for reader in (other, made):
            found = await reader.record(f"req-{i}")
            assert found.status_code == 200, found.text
            assert found.json()["request_id"] == f"req-{i}"
        assert (await other.record(f"req-{i}", OTHER)).status_code == 404  # another tenant: as unknown
        assert (await made.record(f"req-{i}", OTHER)).status_code == 404
    assert (await b.record("never-made")).status_code == 404
    assert a.decisions.writes.written == b.decisions.writes.written == 5


async def test_the_same_id_from_two_tenants_on_two_replicas_keeps_each_its_own(home: Home) -> None:
    a, b = replica(home()), replica(home())
    await a.chat("shared-id", APPS)
    await b.chat("shared-id", OTHER)  # B holds no claim on it: OTHER's record is its own key
    for reader in (a, b):
        mine, theirs = await reader.record("shared-id", APPS), await reader.record("shared-id", OTHER)
        assert mine.status_code == theirs.status_code == 200
        assert mine.json()["contract"]["tenant"] == "apps" and theirs.json()["contract"]["tenant"] == "other"


async def test_a_record_over_the_stores_value_bound_stays_on_its_replica(home: Home) -> None:
    a, b = replica(home(max_value_bytes=64)), replica(home(max_value_bytes=64))
    await a.chat("big")
    assert (await a.record("big")).status_code == 200
    assert (await b.record("big")).status_code == 404
    assert a.decisions.writes.oversize == 1 and a.decisions.writes.written == 0


async def test_feedback_twice_through_two_replicas_is_a_409_the_second_time(home: Home) -> None:
    a, b = replica(home()), replica(home())
    await a.chat("judged")
    first = await b.feedback("judged", "user-thumbs")  # B finds A's record in the store
    assert first.status_code == 200, first.text
    again = await a.feedback("judged", "user.web")  # the same kind, on the other replica
    assert again.status_code == 409 and again.json()["error"]["code"] == "feedback_exists"
    assert (await a.feedback("judged", "qa-batch")).status_code == 200  # another kind
    assert (await b.feedback("judged", "user-thumbs", OTHER)).status_code == 404  # not OTHER's request


@pytest.mark.parametrize("fallback", [True, False])
async def test_a_store_that_does_not_answer_never_fails_a_request(fallback: bool) -> None:
    def unreachable() -> SharedStore:
        dead = RedisStore(f"redis://127.0.0.1:{closed_port()}", timeout_s=0.2)
        return FallbackStore(dead, MemoryStore(clock=lambda: 0.0)) if fallback else dead

    a, b = replica(unreachable()), replica(unreachable())
    await a.chat("down")
    assert (await a.record("down")).status_code == 200  # this replica's own
    assert (await b.record("down")).status_code == 404  # not a 500
    assert (await a.feedback("down", "user")).status_code == 200
    assert (await a.feedback("down", "user")).status_code == 409  # the replica's own store still decides
    if not fallback:
        assert a.decisions.writes.failed == 1


def _planted(good: dict[str, Any], request_id: str) -> list[bytes]:
    """Values under apps' key for `request_id` that are not apps' record of it: each must read as none."""
    record = {**good["record"], "request_id": request_id}
    return [
        b"not json",
        b"\xff\xfe{",
        b"[1, 2]",  # JSON, not an object
        b"null",
        b"[" * 100_000,  # nested past the parser's recursion limit
        json.dumps({"owner": "other", "record": record}).encode(),  # another tenant's, under apps' key
        json.dumps({"record": record}).encode(),
        json.dumps({"owner": "apps", "record": {**record, "request_id": "another"}}).encode(),
        json.dumps({"owner": "apps", "record": {"request_id": request_id}}).encode(),
        json.dumps({"owner": "apps", "record": {**record, "contract": "x"}}).encode(),
        json.dumps({"owner": "apps", "record": {**record, "candidates": [[1]]}}).encode(),
        json.dumps({"owner": "apps", "record": {**record, "replans": 1e400}}).encode(),  # Infinity: no int
        json.dumps({"owner": "apps", "record": {**record, "attempts": [{"cost_usd": "1"}]}}).encode(),
    ]


async def test_a_malformed_or_another_tenants_value_in_the_store_reads_as_404_never_500(home: Home) -> None:
    a, b, store = replica(home()), replica(home()), home()
    await a.chat("good")
    raw = await store.get(record_key("apps", "good"))
    assert raw is not None
    good = json.loads(raw)
    for i in range(len(_planted(good, "x"))):
        request_id = f"planted-{i}"
        value = _planted(good, request_id)[i]
        await store.put(record_key("apps", request_id), value, 60)
        found = await b.record(request_id)
        assert found.status_code == 404, (value[:80], found.text)
        judged = await b.feedback(request_id, "user")
        assert judged.status_code == 404, (value[:80], judged.text)
    await store.put(record_key("apps", "copied"), raw.replace(b'"good"', b'"copied"'), 60)
    assert (await b.record("copied")).status_code == 200  # the checks refuse no record a replica wrote
