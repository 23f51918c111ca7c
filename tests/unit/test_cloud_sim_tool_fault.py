"""cloud-sim's `tool_args_invalid` fault in both wire protocols, and streams through the real
provider adapters and the real dispatcher (the sims in-process over httpx.ASGITransport): usage
reported by each protocol reaches the record, invalid streamed tool arguments are flagged at L2 and
fail over at L1."""

from __future__ import annotations

import json
import random
from typing import Any

import httpx
import pytest

from bench.cloud_sim import SimSettings, build_app
from bench.cloud_sim.replies import wrong_value
from cluster.config.deployment import SpilloverConfig, parse_config
from router.learning.decision import DecisionStore
from router.output.output_contract import check_output
from router.request.contract import derive_contract
from router.routing.policy import Policy
from serve_apps.clocks import Clocks
from serve_apps.dispatch.dispatcher import Dispatcher
from serve_apps.dispatch.parts import DispatchParts
from serve_apps.providers import provider_for
from serve_apps.resilience.state import Resilience
from tests.unit.test_dispatch_resilience import World

WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer"}, "tags": {"type": "array"}},
    "required": ["city"],
}
TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}
TOOL_BODY = {
    "messages": [{"role": "user", "content": "Weather in Paris?"}],
    "tools": [TOOL],
    "tool_choice": "required",
    "max_tokens": 40,
}
KEY = "sk-ant-sim"
ANTHROPIC_HEADERS = {"x-api-key": KEY, "anthropic-version": "2023-06-01"}


def sim(api: str = "openai", **faults: Any) -> Any:
    models = ("sim-claude",) if api == "anthropic" else ("sim-m",)
    key = {"api_key": KEY} if api == "anthropic" else {}
    settings = SimSettings(api=api, models=models, ttft_s=0.0, tokens_per_s=0.0, **key, **faults)  # type: ignore[arg-type]
    return build_app(settings, rng=random.Random(3), clock=lambda: 1.0)


def contract(body: dict[str, Any], **headers: str) -> Any:
    return derive_contract({"model": "m", **body}, headers, Policy())


def test_wrong_arguments_break_every_typed_property_and_add_an_undeclared_key() -> None:
    wrong = wrong_value(WEATHER)
    assert wrong == {"city": 0, "days": "not a number", "tags": "not an array", "cloud_sim": wrong["cloud_sim"]}
    assert wrong_value({"type": "object"}) == {"cloud_sim": wrong["cloud_sim"]}


def test_the_fault_rate_is_validated_like_every_other() -> None:
    with pytest.raises(ValueError):
        SimSettings(tool_args_invalid_rate=1.5)
    with pytest.raises(ValueError):
        SimSettings(tool_args_invalid_rate=0.6, schema_invalid_rate=0.6)


async def test_openai_protocol_tool_arguments_break_the_schema_json_and_stream() -> None:
    app = sim(tool_args_invalid_rate=1.0)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://sim") as client:
        body = {**TOOL_BODY, "model": "sim-m"}
        reply = (await client.post("/v1/chat/completions", json=body)).json()
        stream = await client.post("/v1/chat/completions", json={**body, "stream": True})
        plain = await client.post("/v1/chat/completions", json={"model": "sim-m", "messages": body["messages"]})
    message = reply["choices"][0]["message"]
    assert check_output(contract(TOOL_BODY), message).status == "violated"
    pieces = [
        call["function"].get("arguments", "")
        for line in stream.text.splitlines()
        if line.startswith("data: {")
        for call in json.loads(line[6:])["choices"][0]["delta"].get("tool_calls", [])
    ]
    assert json.loads("".join(pieces)) == json.loads(message["tool_calls"][0]["function"]["arguments"])
    assert plain.json()["choices"][0]["message"]["content"].startswith("[cloud-sim:")  # no tool call: normal


async def test_anthropic_protocol_tool_input_breaks_the_schema_json_and_stream() -> None:
    app = sim("anthropic", tool_args_invalid_rate=1.0)
    messages_body = {
        "model": "sim-claude",
        "max_tokens": 40,
        "messages": [{"role": "user", "content": "Weather in Paris?"}],
        "tools": [{"name": "get_weather", "input_schema": WEATHER}],
        "tool_choice": {"type": "any"},
    }
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://sim") as client:
        reply = (await client.post("/v1/messages", json=messages_body, headers=ANTHROPIC_HEADERS)).json()
        stream = await client.post("/v1/messages", json={**messages_body, "stream": True}, headers=ANTHROPIC_HEADERS)
    (block,) = reply["content"]
    assert block["type"] == "tool_use" and block["input"] == wrong_value(WEATHER)
    partial = "".join(
        json.loads(line[6:])["delta"]["partial_json"] for line in stream.text.splitlines() if "input_json_delta" in line
    )
    assert json.loads(partial) == wrong_value(WEATHER)


def config() -> SpilloverConfig:
    caps = {
        "snapshot": "sim-1",
        "context_window": 32768,
        "tools": True,
        "price_in_per_mtok": 1.0,
        "price_out_per_mtok": 2.0,
    }
    caps = {**caps, "region": "us", "data_policy": "no_retention"}
    providers = [
        {"name": "faulty", "base_url": "https://faulty/v1", "models": {"m": {**caps, "name": "sim-m"}}},
        {
            "name": "healthy",
            "base_url": "https://healthy/v1",
            "models": {"m": {**caps, "name": "sim-m", "price_out_per_mtok": 3.0}},
        },
        {
            "name": "claude",
            "type": "anthropic",
            "base_url": "https://claude/v1",
            "api_key_env": "SIM_ANTHROPIC_KEY",
            "models": {"m": {**caps, "name": "sim-claude", "price_out_per_mtok": 9.0}},
        },
    ]
    model = {"alias": "m", "source": "prepared:x", "family": "llama", "engine_args": {"max_model_len": 4096}}
    return parse_config({"models": [model], "cloud": {"providers": providers}}, "test")


def dispatcher(apps: dict[str, Any]) -> Dispatcher:
    cfg = config()
    world = World()
    providers = {
        p.name: provider_for(p, transport=httpx.ASGITransport(app=apps[p.name]), env={"SIM_ANTHROPIC_KEY": KEY})
        for p in cfg.cloud.providers
    }
    resilience = Resilience(cfg, clock=world.clock, rng=random.Random(1))
    return Dispatcher(
        cfg,
        _NoLocal(),
        providers,
        world.snapshot,
        clocks=Clocks.of(world.clock, sleep=world.sleep),
        parts=DispatchParts(decisions=DecisionStore(), resilience=resilience),
    )


class _NoLocal:
    async def call(self, *args: Any) -> Any:
        raise AssertionError("tools requests never go to this local model (no tool calling)")

    async def check_health(self, alias: str, timeout_s: float) -> str | None:
        return None


async def send(d: Dispatcher, request_id: str, body: dict[str, Any], **headers: str) -> list[str]:
    done = await d.dispatch("chat", body, request_id, contract=contract(body, **headers), deadline_s=30)
    assert done.reply.chunks is not None
    return [text async for text in done.reply.chunks]


async def test_a_streamed_anthropic_answer_is_booked_with_the_usage_of_its_message_events() -> None:
    d = dispatcher({"faulty": sim(), "healthy": sim(), "claude": sim("anthropic")})
    body = {**TOOL_BODY, "stream": True}
    sent = await send(d, "r1", body, **{"x-spillover-providers": "claude"})
    assert sent[-1] == "data: [DONE]\n\n" and all('"usage"' not in s for s in sent)
    record = d.decisions.get("r1")
    assert record is not None
    attempt = record.attempts[-1]
    assert (attempt.target, attempt.outcome, attempt.usage) == ("cloud:claude/m", "ok", "reported")
    assert attempt.prompt_tokens > 0 and attempt.completion_tokens > 0 and (attempt.cost_usd or 0) > 0


async def test_invalid_streamed_tool_arguments_are_flagged_at_l2_and_fail_over_at_l1() -> None:
    apps = {"faulty": sim(tool_args_invalid_rate=1.0), "healthy": sim(), "claude": sim("anthropic")}
    d = dispatcher(apps)
    body = {**TOOL_BODY, "stream": True}
    await send(d, "l2", body, **{"x-spillover-level": "L2", "x-spillover-providers": "faulty"})
    flagged = d.decisions.get("l2").attempts[-1]  # type: ignore[union-attr]
    assert (flagged.outcome, flagged.usage) == ("ok", "reported") and flagged.contract == "schema: 3 errors"
    sent = await send(d, "l1", body, **{"x-spillover-level": "L1", "x-spillover-providers": "faulty,healthy"})
    assert sent[-1] == "data: [DONE]\n\n"
    attempts = d.decisions.get("l1").attempts  # type: ignore[union-attr]
    assert [(a.target, a.outcome) for a in attempts] == [
        ("cloud:faulty/m", "contract_violation"),
        ("cloud:healthy/m", "ok"),
    ]
    assert attempts[0].completion_tokens > 0 and attempts[1].usage == "reported"


async def test_invalid_tool_arguments_in_a_complete_answer_fail_over_at_l1_and_are_flagged_at_l2() -> None:
    d = dispatcher({"faulty": sim(tool_args_invalid_rate=1.0), "healthy": sim(), "claude": sim("anthropic")})
    l1 = {"x-spillover-level": "L1", "x-spillover-providers": "faulty,healthy"}
    done = await d.dispatch("chat", TOOL_BODY, "j1", contract=contract(TOOL_BODY, **l1), deadline_s=30)
    assert done.target == "cloud:healthy" and done.reply.body is not None
    record = d.decisions.get("j1")
    assert record is not None
    assert [a.outcome for a in record.attempts] == ["contract_violation", "ok"]
    l2 = {"x-spillover-level": "L2", "x-spillover-providers": "faulty"}
    done = await d.dispatch("chat", TOOL_BODY, "j2", contract=contract(TOOL_BODY, **l2), deadline_s=30)
    assert done.headers["x-spillover-contract"] == "schema: 3 errors"
    flagged = d.decisions.get("j2").attempts[-1]  # type: ignore[union-attr]
    assert flagged.contract == "schema: 3 errors" and len(flagged.contract_errors) == 3
