"""Idempotency-Key store on the replica's own MemoryStore (the shared store with one replica, its clock a
manual one): replay, TTL, in-flight twins, abandon, reuse (body and contract headers), the byte bounds,
key rules. tests/unit/test_idempotency_shared.py runs the same code over a real Redis and two replicas."""

from __future__ import annotations

import asyncio
import time
from functools import partial

import pytest

from router.errors import IdempotencyConflict, InvalidRequest
from router.request.idempotency import Fresh, IdempotencyStore, Replay, StoredResponse, fingerprint, validate_key
from serve_apps.http.idempotent import IdempotentReplies
from serve_apps.state.memory import MemoryStore
from tests.fakes import FakeClock as Clock
from tests.unit.security_gateway import APPS, BOUND_S, CHAT, build

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
FP = fingerprint(BODY)
OK = StoredResponse(200, {"id": "chatcmpl-1", "choices": []}, {"x-spillover-target": "local:m"})


def store(clock: Clock, *, ttl_s: float = 600.0, max_bytes: int = 64 * 1024 * 1024) -> IdempotencyStore:
    return IdempotencyStore(MemoryStore(clock=clock), ttl_s=ttl_s, max_bytes=max_bytes, poll_s=0.005)


async def fresh(s: IdempotencyStore, key: str, fp: str = FP, tenant: str = "t1") -> bytes:
    begun = await s.begin(tenant, key, fp)
    assert isinstance(begun, Fresh)
    return begun.marker


async def test_fresh_then_replay_within_ttl() -> None:
    clock = Clock()
    s = store(clock, ttl_s=600)
    assert await s.complete("t1", "k", OK, await fresh(s, "k"))
    clock.now += 599
    again = await s.begin("t1", "k", FP)
    assert again == Replay(OK)


async def test_replay_is_a_copy() -> None:
    s = store(Clock())
    await s.complete("t1", "k", OK, await fresh(s, "k"))
    first = await s.begin("t1", "k", FP)
    assert isinstance(first, Replay)
    first.stored.body["choices"].append("mutated")
    second = await s.begin("t1", "k", FP)
    assert isinstance(second, Replay) and second.stored.body["choices"] == []


async def test_expired_entry_runs_fresh() -> None:
    clock = Clock()
    s = store(clock, ttl_s=600)
    await s.complete("t1", "k", OK, await fresh(s, "k"))
    clock.now += 600
    assert isinstance(await s.begin("t1", "k", FP), Fresh)


async def test_keys_are_scoped_by_tenant() -> None:
    s = store(Clock())
    await s.complete("t1", "k", OK, await fresh(s, "k"))
    assert isinstance(await s.begin("t2", "k", FP), Fresh)
    # Another tenant may even use the same key for another body.
    assert isinstance(await s.begin("t3", "k", fingerprint({"other": 1})), Fresh)
    # A tenant and key that join to the same text are still two keys.
    assert isinstance(await s.begin("t1:k", "x", FP), Fresh) and isinstance(await s.begin("t1", "k:x", FP), Fresh)


async def test_concurrent_twin_waits_then_replays() -> None:
    s = store(Clock())
    marker = await fresh(s, "k")
    twin = asyncio.create_task(s.begin("t1", "k", FP, wait_s=5))
    await asyncio.sleep(0.02)
    assert not twin.done()  # it is waiting for the first one, not running its own
    await s.complete("t1", "k", OK, marker)
    assert await twin == Replay(OK)


async def test_abandon_lets_one_waiter_run_fresh_and_the_other_wait_again() -> None:
    s = store(Clock())
    marker = await fresh(s, "k")
    w1 = asyncio.create_task(s.begin("t1", "k", FP, wait_s=5))
    w2 = asyncio.create_task(s.begin("t1", "k", FP, wait_s=5))
    await asyncio.sleep(0.01)
    await s.abandon("t1", "k", marker)  # the first one failed
    done, pending = await asyncio.wait({w1, w2}, return_when=asyncio.FIRST_COMPLETED)
    won = done.pop().result()
    assert not done and isinstance(won, Fresh)
    (other,) = pending
    await asyncio.sleep(0.02)
    assert not other.done()  # the new run is in flight: the other twin waits for it
    await s.complete("t1", "k", OK, won.marker)
    assert await other == Replay(OK)


async def test_abandon_lets_the_next_request_run_fresh() -> None:
    s = store(Clock())
    await s.abandon("t1", "k", await fresh(s, "k"))
    assert isinstance(await s.begin("t1", "k", FP), Fresh)


async def test_abandon_and_complete_touch_only_their_own_marker() -> None:
    """A request whose marker expired and was taken by a repeat neither deletes nor overwrites the repeat's."""
    clock = Clock()
    s = store(clock, ttl_s=60)
    stale = await fresh(s, "k")
    clock.now += 60  # the first request's replica died, say: its marker expired
    current = await fresh(s, "k")
    await s.abandon("t1", "k", stale)
    assert not await s.complete("t1", "k", OK, stale)
    with pytest.raises(IdempotencyConflict):  # the repeat's marker is still there
        await s.begin("t1", "k", FP, stream=True)
    assert await s.complete("t1", "k", OK, current)
    assert await s.begin("t1", "k", FP) == Replay(OK)


async def test_failure_results_are_not_stored() -> None:
    s = store(Clock())
    stored = await s.complete("t1", "k", StoredResponse(503, {"error": {"message": "down"}}, {}), await fresh(s, "k"))
    assert not stored
    assert isinstance(await s.begin("t1", "k", FP), Fresh)


async def test_twin_still_running_after_wait_s_is_refused() -> None:
    s = store(Clock())
    await fresh(s, "k")
    with pytest.raises(IdempotencyConflict) as e:
        await s.begin("t1", "k", FP, wait_s=0.01)
    assert e.value.code == "idempotency_key_in_use" and e.value.status_code == 409


async def test_a_streamed_twin_of_a_running_request_is_refused_at_once() -> None:
    s = store(Clock())
    await fresh(s, "k")
    with pytest.raises(IdempotencyConflict) as e:
        await s.begin("t1", "k", FP, wait_s=60, stream=True)
    assert e.value.code == "idempotency_in_progress" and e.value.status_code == 409


async def test_inflight_entry_expires_so_a_forgotten_key_is_not_blocked_forever() -> None:
    clock = Clock()
    s = store(clock, ttl_s=60)
    await fresh(s, "k")  # never completed nor abandoned
    clock.now += 60
    assert isinstance(await s.begin("t1", "k", FP), Fresh)


async def test_fingerprint_mismatch_is_refused() -> None:
    s = store(Clock())
    marker = await fresh(s, "k")
    with pytest.raises(InvalidRequest) as e:
        await s.begin("t1", "k", fingerprint({**BODY, "temperature": 0.5}))
    assert e.value.code == "idempotency_key_reused"
    assert e.value.status_code == 400
    assert "different request body" in e.value.message
    await s.complete("t1", "k", OK, marker)
    with pytest.raises(InvalidRequest):  # also once completed
        await s.begin("t1", "k", fingerprint({}))


def test_fingerprint_ignores_key_order_and_spacing() -> None:
    a = fingerprint({"b": 1, "a": [1, {"y": 2, "x": 3}]})
    b = fingerprint({"a": [1, {"x": 3, "y": 2}], "b": 1})
    assert a == b and len(a) == 64
    assert fingerprint({"a": 1}) != fingerprint({"a": 2})


async def test_an_answer_over_max_bytes_is_not_stored() -> None:
    s = store(Clock(), max_bytes=1024)
    big = StoredResponse(200, {"choices": [{"message": {"content": "x" * 2000}}]})
    assert not await s.complete("t1", "k", big, await fresh(s, "k"))
    assert isinstance(await s.begin("t1", "k", FP), Fresh)  # its key behaves as abandoned


async def test_an_answer_over_the_stores_bound_per_value_is_not_stored() -> None:
    s = IdempotencyStore(MemoryStore(clock=Clock(), max_value_bytes=1024), poll_s=0.005)
    big = StoredResponse(200, {"choices": [{"message": {"content": "x" * 2000}}]})
    assert not await s.complete("t1", "k", big, await fresh(s, "k"))
    assert isinstance(await s.begin("t1", "k", FP), Fresh)


async def test_a_stored_stream_replays_its_chunks() -> None:
    s = store(Clock())
    streamed = StoredResponse(200, {}, {"x-spillover-route": "local"}, ("data: {}\n\n", "data: [DONE]\n\n"))
    assert await s.complete("t1", "k", streamed, await fresh(s, "k"))
    assert await s.begin("t1", "k", FP, stream=True) == Replay(streamed)


@pytest.mark.parametrize("key", ["a", "x" * 255, "order-123_ABC", "with space", "~!@#$%^&*()"])
def test_valid_keys(key: str) -> None:
    validate_key(key)


@pytest.mark.parametrize("key", ["", "x" * 256, "tab\there", "new\nline", "café", "\x7f"])
async def test_invalid_keys_are_refused(key: str) -> None:
    with pytest.raises(InvalidRequest) as e:
        await store(Clock()).begin("t1", key, FP)
    assert e.value.code == "invalid_idempotency_key"


async def test_idempotency_fingerprint_includes_contract_headers() -> None:
    """Through the gateway's real HTTP layer (tests/unit/security_gateway.py): an answer a cloud provider
    made for an L3 request is never replayed to a repeat with the same key that asks for L1 or
    local_only; the repeat is the 400 a different body gets, and nothing runs again."""
    store = IdempotencyStore(MemoryStore(clock=Clock()), ttl_s=600)
    gateway = build(saturated=True, idempotent=IdempotentReplies(store, wait_s=1))  # local full: it bursts
    key = {"idempotency-key": "order-1"}
    started = time.monotonic()
    async with gateway.client() as client:
        post = partial(client.post, "/v1/chat/completions", json=CHAT)
        first = await post(headers={**APPS, **key, "x-spillover-level": "L3"})
        assert first.status_code == 200 and first.headers["x-spillover-target"] == "cloud:cloud-sim"
        repeats = [
            await post(headers={**APPS, **key, "x-spillover-level": "L1"}),
            await post(headers={**APPS, **key, "x-spillover-level": "L3", "x-spillover-residency": "local_only"}),
            await post(headers={**APPS, **key}),  # no contract headers at all: not the same request either
        ]
        same = await post(headers={**APPS, **key, "X-Spillover-Level": "L3"})
    for reply in repeats:
        assert reply.status_code == 400 and reply.json()["error"]["code"] == "idempotency_key_reused", reply.text
        assert "x-spillover-idempotent-replay" not in reply.headers and "contract headers" in reply.text
    assert same.status_code == 200 and same.headers["x-spillover-idempotent-replay"] == "true"
    assert len(gateway.provider_requests) == 1  # nothing ran again
    assert time.monotonic() - started < BOUND_S
    assert fingerprint(BODY, {"x-spillover-session": "a"}) != fingerprint(BODY, {"x-spillover-session": "b"})
    assert fingerprint(BODY, {"x-other": "1", "authorization": "x"}) == fingerprint(BODY)  # only contract headers
