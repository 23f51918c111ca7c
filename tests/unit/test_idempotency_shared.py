"""`Idempotency-Key` across gateway replicas: the HTTP edge (serve_apps/http/idempotent.py) over the shared
store, run against both homes — the in-process MemoryStore (one replica) and a real Redis server, where each
"replica" is an `IdempotentReplies` with its own client of the same server.

The work a request does is a fake handler that counts its calls: a repeat that replays runs nothing. Real
Redis and real waits run at normal priority (`realtime`).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass, field

import pytest
from starlette.responses import JSONResponse, Response, StreamingResponse

from router.errors import IdempotencyConflict, InvalidRequest
from router.request.idempotency import IdempotencyStore
from serve_apps.http.idempotent import IdempotentReplies
from serve_apps.state.local_redis import LocalRedis
from serve_apps.state.memory import MemoryStore
from serve_apps.state.redis_store import RedisStore
from serve_apps.state.store import SharedStore

pytestmark = pytest.mark.realtime

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
RAW = json.dumps(BODY).encode()
STREAMED = json.dumps({**BODY, "stream": True}).encode()
EVENTS = ('data: {"choices":[{"delta":{"content":"he"}}]}\n\n', 'data: {"choices":[{"delta":{"content":"y"}}]}\n\n')
MAX_VALUE_BYTES = 4096
Replicas = Callable[[], IdempotentReplies]  # makes one more gateway replica's edge over the shared store


@pytest.fixture(params=["memory", "redis"])
async def replicas(request: pytest.FixtureRequest, server: LocalRedis) -> AsyncIterator[Replicas]:
    """Makes gateway replicas' idempotency edges, all over one shared store."""
    stores: list[SharedStore] = []
    if request.param == "memory":
        memory = MemoryStore(clock=time.monotonic, max_value_bytes=MAX_VALUE_BYTES)

        def new_store() -> SharedStore:
            return memory
    else:
        first = RedisStore(server.url, password=server.password, max_value_bytes=MAX_VALUE_BYTES)
        await first._redis.flushdb()
        stores.append(first)

        def new_store() -> SharedStore:
            store = RedisStore(server.url, password=server.password, max_value_bytes=MAX_VALUE_BYTES)
            stores.append(store)
            return store

    def replica() -> IdempotentReplies:
        return IdempotentReplies(IdempotencyStore(new_store(), ttl_s=60, poll_s=0.01), wait_s=5)

    yield replica
    for store in stores:
        await store.close()


@dataclass
class Handler:
    """The request's work: counts its calls; `release` holds it (a slow generation) while it is clear."""

    calls: int = 0
    release: asyncio.Event = field(default_factory=asyncio.Event)
    status: int = 200
    content: str = "hello"

    async def json(self) -> Response:
        self.calls += 1
        await self.release.wait()
        return JSONResponse({"id": f"chatcmpl-{self.calls}", "content": self.content}, self.status)

    async def stream(self) -> Response:
        self.calls += 1

        async def events() -> AsyncIterator[str]:
            for event in EVENTS:
                await self.release.wait()
                yield event
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream", headers={"x-spillover-route": "local"})


async def body_of(response: Response) -> list[str]:
    assert isinstance(response, StreamingResponse)
    return [c if isinstance(c, str) else bytes(c).decode() async for c in response.body_iterator]


async def test_six_concurrent_requests_with_one_key_run_once(replicas: Replicas) -> None:
    edges = [replicas() for _ in range(3)]  # spread over three replicas
    work = Handler()
    answers = [asyncio.create_task(edges[i % 3].answer("k", "t1", RAW, work.json)) for i in range(6)]
    await asyncio.sleep(0.1)
    assert work.calls == 1  # the five repeats wait for the first
    work.release.set()
    done = await asyncio.gather(*answers)
    assert work.calls == 1
    assert sorted(replayed for _, replayed in done) == [False] + [True] * 5
    assert {bytes(response.body) for response, _ in done} == {bytes(done[0][0].body)}


async def test_a_repeat_on_a_second_replica_replays(replicas: Replicas) -> None:
    one, two = replicas(), replicas()
    work = Handler()
    work.release.set()
    first, replayed = await one.answer("order-1", "t1", RAW, work.json)
    again, again_replayed = await two.answer("order-1", "t1", RAW, work.json)
    assert (replayed, again_replayed) == (False, True) and work.calls == 1
    assert again.headers["x-spillover-idempotent-replay"] == "true" and again.body == first.body
    _, replayed = await two.answer("order-1", "t2", RAW, work.json)
    assert not replayed and work.calls == 2  # keys are scoped by tenant
    with pytest.raises(InvalidRequest) as e:  # the same key with another body, on either replica
        await two.answer("order-1", "t1", json.dumps({**BODY, "temperature": 0.1}).encode(), work.json)
    assert e.value.code == "idempotency_key_reused" and work.calls == 2


@pytest.mark.parametrize("key", ["x" * 256, "café", "new\nline", ""])
async def test_hostile_keys_are_refused(replicas: Replicas, key: str) -> None:
    work = Handler()
    with pytest.raises(InvalidRequest) as e:
        await replicas().answer(key, "t1", RAW, work.json)
    assert e.value.code == "invalid_idempotency_key" and e.value.status_code == 400 and work.calls == 0


async def test_failures_and_answers_over_the_bound_are_not_stored(replicas: Replicas) -> None:
    one, two = replicas(), replicas()
    work = Handler(status=503)
    work.release.set()
    await one.answer("k", "t1", RAW, work.json)
    work.status, work.content = 200, "x" * (MAX_VALUE_BYTES + 1)  # over the store's bound per value
    _, replayed = await two.answer("k", "t1", RAW, work.json)
    assert not replayed and work.calls == 2
    work.content = "fits"
    _, replayed = await one.answer("k", "t1", RAW, work.json)
    assert not replayed and work.calls == 3  # nothing was kept: it ran again, and now it is kept
    _, replayed = await two.answer("k", "t1", RAW, work.json)
    assert replayed and work.calls == 3


async def test_a_streamed_repeat_is_409_during_the_first_and_replayed_after(
    replicas: Replicas,
) -> None:
    one, two = replicas(), replicas()
    work = Handler()
    first, replayed = await one.answer("s", "t1", STREAMED, work.stream)
    assert not replayed
    sending = asyncio.create_task(body_of(first))
    await asyncio.sleep(0.05)
    with pytest.raises(IdempotencyConflict) as e:  # the first stream is still being sent
        await two.answer("s", "t1", STREAMED, work.stream)
    assert e.value.code == "idempotency_in_progress" and e.value.status_code == 409
    work.release.set()
    sent = await sending
    again, replayed = await two.answer("s", "t1", STREAMED, work.stream)
    assert replayed and work.calls == 1
    assert again.headers["x-spillover-idempotent-replay"] == "true" and again.headers["x-spillover-route"] == "local"
    assert again.media_type == "text/event-stream" and await body_of(again) == sent == [*EVENTS, "data: [DONE]\n\n"]


async def test_a_stream_the_client_left_is_not_kept(replicas: Replicas) -> None:
    one, two = replicas(), replicas()
    work = Handler()
    work.release.set()
    first, _ = await one.answer("s", "t1", STREAMED, work.stream)
    assert isinstance(first, StreamingResponse)
    chunks = first.body_iterator
    assert isinstance(chunks, AsyncGenerator)
    await anext(chunks)
    await chunks.aclose()  # the client went away after the first event
    await asyncio.sleep(0.05)  # the marker's delete runs beside the closed stream
    again, replayed = await two.answer("s", "t1", STREAMED, work.stream)
    assert not replayed and work.calls == 2 and await body_of(again) == [*EVENTS, "data: [DONE]\n\n"]
