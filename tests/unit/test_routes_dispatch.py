"""Routes through the real dispatcher, pipeline and burst decision (fake engine and providers):
the route's order is the fall-over order unless the scenario's `route_order: strategy` ranks them,
every candidate still passes the contract filters, a cloud-only route never touches the engine, and
a route's local model is called under its own name. `/v1/models` lists routes after the models."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from cluster.config.deployment import SpilloverConfig, parse_config
from router.errors import NoCapableModel, TargetUnavailable
from router.request.contract import derive_contract
from serve_apps.clocks import Clocks
from serve_apps.dispatch.dispatcher import Dispatcher
from serve_apps.dispatch.interfaces import LocalDispatch
from serve_apps.http.model_card import ServedModel, ServedRoute
from serve_apps.http.surface import GatewayHTTP
from tests.fakes import FakeEngine, FakeProvider
from tests.unit.test_dispatch import SIM_M, World, stats

CHAT = {"model": "chat", "messages": [{"role": "user", "content": "hi"}]}
TOOLS = {**CHAT, "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]}
MODEL = {"alias": "m", "source": "prepared:x", "family": "llama", "engine_args": {"max_model_len": 4096}}
# b is cheaper and better than a: a strategy would rank it first, the route's order does not
A = {**SIM_M, "name": "a-chat", "quality": 0.4, "tools": False}
B = {**SIM_M, "name": "b-chat", "quality": 0.9, "price_in_per_mtok": 0.01, "price_out_per_mtok": 0.04}


def routed_config(targets: list[str], *, models: list[dict[str, Any]] | None = None) -> SpilloverConfig:
    local = [MODEL] if models is None else models
    return parse_config(
        {
            "admission": {"queue_max": 2, "queue_timeout_s": 5},
            "models": local,
            "cloud": {
                "providers": [
                    {"name": "a", "base_url": "http://127.0.0.1:1/v1", "models": {"chat": A}},
                    {"name": "b", "base_url": "http://127.0.0.1:2/v1", "models": {"chat": B}},
                ]
            },
            "routes": [{"alias": "chat", "targets": targets}],
            "policy": {
                "scenarios": {
                    "default": {"level": "L2"},
                    "ranked": {"level": "L2", "strategy": "cost", "route_order": "strategy"},
                }
            },
        },
        "routes",
    )


def make(world: World, config: SpilloverConfig, **parts: Any) -> Dispatcher:
    return Dispatcher(
        config,
        parts.get("local") or FakeEngine(),
        {"a": parts.get("a") or FakeProvider("a"), "b": parts.get("b") or FakeProvider("b")},
        world.snapshot,
        poll_s=0.1,
        clocks=Clocks.of(world.clock, sleep=world.sleep),
    )


async def send(d: Dispatcher, config: SpilloverConfig, body: dict[str, Any], request_id: str, **headers: str):
    contract = derive_contract(body, headers, config.policy)
    return await d.dispatch("chat", body, request_id, contract=contract, deadline_s=5)


@pytest.fixture
def world() -> World:
    return World()


async def test_a_cloud_only_route_tries_its_targets_in_its_order(world: World) -> None:
    config = routed_config(["cloud:a/chat", "cloud:b/chat"], models=[])
    local, a, b = FakeEngine(), FakeProvider("a"), FakeProvider("b")
    d = make(world, config, local=local, a=a, b=b)
    done = await send(d, config, CHAT, "r-1")
    assert (done.route, done.target) == ("cloud", "cloud:a")
    assert done.reason == "route chat has no local model"
    assert a.calls == ["r-1"] and b.calls == [] and local.calls == []


async def test_a_scenario_with_route_order_strategy_ranks_the_route_by_its_strategy(world: World) -> None:
    config = routed_config(["cloud:a/chat", "cloud:b/chat"], models=[])
    d = make(world, config)
    done = await send(d, config, CHAT, "r-2", **{"x-business-scenario": "ranked"})
    assert done.target == "cloud:b"  # the cheaper one, though listed second
    record = d.decisions.get("r-2")
    assert record is not None and record.contract["route_order"] == "strategy"


async def test_a_failing_target_falls_over_to_the_next_in_route_order(world: World) -> None:
    config = routed_config(["cloud:a/chat", "cloud:b/chat"], models=[])
    a = FakeProvider("a", script=[TargetUnavailable("down", code="provider_unavailable")] * 2)
    d = make(world, config, a=a)
    done = await send(d, config, CHAT, "r-3")
    assert done.target == "cloud:b"
    record = d.decisions.get("r-3")
    assert record is not None
    assert [(x.target, x.outcome) for x in record.attempts][-1] == ("cloud:b/chat", "ok")
    assert record.attempts[0].target == "cloud:a/chat"


async def test_the_contract_still_filters_every_route_target(world: World) -> None:
    config = routed_config(["cloud:a/chat", "cloud:b/chat"], models=[])
    d = make(world, config)
    done = await send(d, config, TOOLS, "r-4")
    assert done.target == "cloud:b"  # a has no tools
    record = d.decisions.get("r-4")
    assert record is not None and any(c.target == "cloud:a/chat" and c.filter == "tools" for c in record.candidates)


async def test_no_capable_route_target_is_422_naming_each(world: World) -> None:
    config = routed_config(["cloud:a/chat", "cloud:b/chat"], models=[])
    with pytest.raises(NoCapableModel) as caught:
        await send(make(world, config), config, {**TOOLS, "max_tokens": 40000}, "r-5")
    assert [(r["target"], r["filter"]) for r in caught.value.reasons] == [
        ("cloud:a/chat", "context"),
        ("cloud:b/chat", "context"),
    ]


async def test_a_mixed_route_stays_on_its_local_model_under_the_model_s_own_name(world: World) -> None:
    config = routed_config(["local:m", "cloud:a/chat", "cloud:b/chat"])
    local = FakeEngine()
    d = make(world, config, local=local)
    done = await send(d, config, CHAT, "r-6")
    assert (done.route, done.target) == ("local", "local:m")
    ((alias, _, body, _),) = local.calls
    assert alias == "m" and body["model"] == "m"  # vLLM knows the model's name, not the route's
    assert d.inflight("m") == 0


async def test_a_mixed_route_bursts_to_its_first_cloud_target_when_local_is_saturated(world: World) -> None:
    config = routed_config(["local:m", "cloud:a/chat", "cloud:b/chat"])
    world.replica = stats(kv=0.95)
    done = await send(make(world, config), config, CHAT, "r-7")
    assert (done.route, done.target) == ("cloud", "cloud:a")
    assert "kv" in done.reason.lower()


async def test_models_lists_routes_after_the_models_and_a_route_name_resolves() -> None:
    models = [ServedModel("m", "llama", "cpu", 4096)]
    routes = [ServedRoute("chat", ("cloud:a/chat", "cloud:b/chat"))]
    engine = FakeEngine()
    gateway = GatewayHTTP(engine, models, LocalDispatch(engine), created=1, routes=routes)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=gateway.app), base_url="http://gw") as c:
        listed = (await c.get("/v1/models")).json()["data"]
        unknown = await c.post("/v1/chat/completions", json={**CHAT, "model": "nope"})
    assert [m["id"] for m in listed] == ["m", "chat"]
    assert listed[1]["metadata"] == {"route": "route", "targets": ["cloud:a/chat", "cloud:b/chat"]}
    assert unknown.status_code == 404 and "available models: chat, m" in unknown.json()["error"]["message"]
