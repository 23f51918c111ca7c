"""The read-only response cache: written while targets answer, read only when none can; identical
requests only, the tenant, the session and the contract in the key, served only where its maker could
have answered, bounded by entries, bytes and time."""

from __future__ import annotations

from dataclasses import replace

from router.request.contract import derive_contract
from router.resilience.response_cache import ResponseCache, cache_key, could_have_answered
from router.routing.capabilities import Registry
from router.routing.policy import Policy
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
    contract = derive_contract(CHAT, {}, Policy())
    assert cache_key(replace(contract, tenant="a"), CHAT) != cache_key(replace(contract, tenant="b"), CHAT)  # tenants
    assert cache_key(contract, {**CHAT, "stream": True}) is None
    assert cache_key(contract, {"b": 1, "a": 2}) == cache_key(contract, {"a": 2, "b": 1})
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


async def test_response_cache_keys_session_and_contract() -> None:
    """Another session never gets a session's cached answer, and an answer a cloud target made under L3
    is never served to a stricter request (L1, local_only) that target could not have answered."""
    world = TrafficWorld(traffic_config(cache={"enabled": True}))
    http, _, _ = world.gateway()
    ask = {"model": "m", "messages": [{"role": "user", "content": "what is my PIN?"}]}
    summary = {"model": "m", "messages": [{"role": "user", "content": "summarise the ward notes"}]}
    alice, bob = ({**CORE, "x-spillover-session": s} for s in ("alice", "bob"))
    loose, strict = {**CORE, "x-spillover-level": "L3"}, {**CORE, "x-spillover-level": "L1"}
    async with world.client(http) as client:
        world.local.answer = "your PIN is 9876"
        assert (await client.post("/v1/chat/completions", json=ask, headers=alice)).status_code == 200
        await client.post("/v1/spillover/traffic", json={"action": "drain", "target": "local:m"})
        made = await client.post("/v1/chat/completions", json=summary, headers=loose)
        assert made.status_code == 200 and made.headers["x-spillover-target"].startswith("cloud:")
        for target in ("cloud:sim", "cloud:spare"):  # now every target is down: the cache's moment
            await client.post("/v1/spillover/traffic", json={"action": "drain", "target": target})
        replies = {
            "bob": await client.post("/v1/chat/completions", json=ask, headers=bob),
            "no session": await client.post("/v1/chat/completions", json=ask, headers=CORE),
            "L1": await client.post("/v1/chat/completions", json=summary, headers=strict),
            "local_only": await client.post(
                "/v1/chat/completions", json=summary, headers={**loose, "x-spillover-residency": "local_only"}
            ),
            "alice": await client.post("/v1/chat/completions", json=ask, headers=alice),
            "L3": await client.post("/v1/chat/completions", json=summary, headers=loose),
        }
    for name in ("bob", "no session", "L1", "local_only"):
        assert replies[name].status_code != 200, name
        assert "9876" not in replies[name].text and replies[name].headers.get("x-spillover-degraded") != "cached"
    assert replies["alice"].status_code == 200 and "9876" in replies["alice"].text  # the same session: cached
    assert replies["L3"].status_code == 200 and replies["L3"].headers["x-spillover-degraded"] == "cached"


def test_a_cached_answer_is_served_only_where_its_maker_could_have_answered() -> None:
    config = traffic_config()
    registry = Registry.from_config(config.models, config.cloud.providers)
    cloud = tuple(t for t in registry.for_alias("m") if t.endpoint == "cloud:sim")
    local = tuple(t for t in registry.for_alias("m") if t.endpoint == "local:m")
    contract = derive_contract(CHAT, {}, Policy())
    assert could_have_answered(contract, cloud) and could_have_answered(contract, local)
    pinned = derive_contract(CHAT, {"x-spillover-residency": "local_only"}, Policy())
    assert not could_have_answered(pinned, cloud) and could_have_answered(pinned, local)
    retention = replace(cloud[0], caps=replace(cloud[0].caps, data_policy="retention"))
    assert not could_have_answered(derive_contract(CHAT, {"x-spillover-level": "L1"}, Policy()), (retention,))
    assert not could_have_answered(contract, ())  # a maker this config does not know
