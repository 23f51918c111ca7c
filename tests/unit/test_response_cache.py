"""The read-only response cache: written while targets answer, read only when none can; identical
requests only, the tenant in the key, bounded by entries, bytes and time."""

from __future__ import annotations

from router.response_cache import ResponseCache, cache_key
from tests.fakes import FakeClock
from tests.unit.test_deferral import CORE, NON_CORE, _drain_all
from tests.unit.traffic_fixture import TrafficWorld, traffic_config

CHAT = {"model": "m", "messages": [{"role": "user", "content": "capital of France?"}], "temperature": 0}


async def test_every_target_down_an_identical_request_gets_the_cached_answer_marked() -> None:
    world = TrafficWorld(traffic_config(cache={"enabled": True}))
    http, _, _ = world.gateway()
    async with world.client(http) as client:
        fresh = await client.post("/v1/chat/completions", json=CHAT, headers=CORE)
        assert fresh.status_code == 200 and "x-spillover-degraded" not in fresh.headers
        await _drain_all(client)
        cached = await client.post("/v1/chat/completions", json=CHAT, headers=CORE)
        other = await client.post("/v1/chat/completions", json={**CHAT, "temperature": 1}, headers=CORE)
        stream = await client.post("/v1/chat/completions", json={**CHAT, "stream": True}, headers=CORE)
        non_core = await client.post("/v1/chat/completions", json=CHAT, headers=NON_CORE)
    assert cached.status_code == 200 and cached.json() == fresh.json()
    assert cached.headers["x-spillover-degraded"] == "cached"
    assert cached.headers["x-spillover-target"] == "local:m"
    assert "response cache" in cached.headers["x-spillover-reason"]
    assert other.status_code == 503 and stream.status_code == 503  # not identical / never cached
    assert non_core.status_code == 200 and non_core.headers["x-spillover-degraded"] == "cached"  # before a ticket
    assert len(world.local.calls) == 1


async def test_the_cache_is_off_by_default() -> None:
    world = TrafficWorld(traffic_config())
    http, _, _ = world.gateway()
    async with world.client(http) as client:
        await client.post("/v1/chat/completions", json=CHAT, headers=CORE)
        await _drain_all(client)
        again = await client.post("/v1/chat/completions", json=CHAT, headers=CORE)
    assert again.status_code == 503


def test_keys_and_bounds() -> None:
    assert cache_key("a", CHAT) != cache_key("b", CHAT)  # tenants never share answers
    assert cache_key(None, {**CHAT, "stream": True}) is None
    assert cache_key(None, {"b": 1, "a": 2}) == cache_key(None, {"a": 2, "b": 1})
    clock = FakeClock()
    cache = ResponseCache(max_entries=2, max_bytes=100, ttl_s=10, clock=clock)
    cache.put("a", {"x": 1})
    cache.put("b", {"x": 2})
    assert cache.get("a") == {"x": 1}  # a is now the most recently used
    cache.put("c", {"x": 3})
    assert cache.get("b") is None and len(cache) == 2
    cache.put("big", {"x": "y" * 200})  # larger than max_bytes: not kept
    assert cache.get("big") is None
    clock.advance(11)
    assert cache.get("a") is None and cache.bytes_kept == len('{"x":3}')
