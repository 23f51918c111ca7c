"""The cloud simulator speaking the Anthropic Messages API (`--api anthropic`), at the wire: what
the Messages API documents — `POST /v1/messages` with `x-api-key` and `anthropic-version`, a
required `max_tokens`, the `{"type": "error", "error": {...}}` error shape, the SSE event sequence
with `event:` lines, 529 overloaded_error among the server errors — with the same fault set and the
same deterministic words as the OpenAI-protocol simulator."""

from __future__ import annotations

import argparse
import json
import random
from typing import Any

import httpx
import pytest

from bench.cloud_sim import InvalidSettings, SimSettings, add_cloud_sim_parser, build_app
from bench.cloud_sim.cli import settings_from_args
from bench.cloud_sim.server import CloudSim

KEY = "sk-ant-sim"
HEADERS = {"x-api-key": KEY, "anthropic-version": "2023-06-01"}


def make_sim(**overrides: Any) -> CloudSim:
    base = {"api": "anthropic", "models": ("sim-claude",), "ttft_s": 0.0, "tokens_per_s": 0.0, "api_key": KEY}
    return build_app(SimSettings(**{**base, **overrides}), rng=random.Random(5), clock=lambda: 1.0).state.cloud_sim


async def post(sim: CloudSim, body: Any, headers: dict[str, str] | None = None) -> httpx.Response:
    transport = httpx.ASGITransport(app=sim.app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://sim") as client:
        return await client.post("/v1/messages", json=body, headers=HEADERS if headers is None else headers)


def body(**extra: Any) -> dict[str, Any]:
    return {"model": "sim-claude", "max_tokens": 64, "messages": [{"role": "user", "content": "Hello there"}], **extra}


async def test_a_message_reply_in_the_messages_shape() -> None:
    response = await post(make_sim(), body(system="Be brief."))
    assert response.status_code == 200, response.text
    reply = response.json()
    assert reply["type"] == "message" and reply["role"] == "assistant" and reply["id"].startswith("msg_")
    assert reply["content"] == [{"type": "text", "text": "[cloud-sim:sim-claude] Hello there"}]
    assert reply["stop_reason"] == "end_turn" and reply["usage"] == {"input_tokens": 4, "output_tokens": 3}


async def test_the_stream_is_the_documented_event_sequence() -> None:
    response = await post(make_sim(), body(stream=True))
    blocks = [b for b in response.text.split("\n\n") if b]
    events = [b.split("\n")[0].removeprefix("event: ") for b in blocks]
    assert events == [
        "message_start",
        "content_block_start",
        "ping",
        *["content_block_delta"] * 3,
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    data = [json.loads(b.split("\n")[1].removeprefix("data: ")) for b in blocks]
    assert "".join(d["delta"]["text"] for d in data if d["type"] == "content_block_delta").strip().startswith("[cloud")
    assert data[-2]["delta"]["stop_reason"] == "end_turn" and data[-2]["usage"]["output_tokens"] == 3


async def test_tool_choice_any_answers_with_tool_use() -> None:
    tool = {"name": "get_weather", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}
    reply = (await post(make_sim(), body(tools=[tool], tool_choice={"type": "any"}))).json()
    (block,) = reply["content"]
    assert block["type"] == "tool_use" and block["name"] == "get_weather" and block["id"].startswith("toolu_")
    assert set(block["input"]) == {"city"} and reply["stop_reason"] == "tool_use"


@pytest.mark.parametrize(
    ("request_body", "headers", "status", "error_type"),
    [
        (body(), {"x-api-key": KEY}, 400, "invalid_request_error"),  # no anthropic-version
        (body(), {"anthropic-version": "2023-06-01"}, 401, "authentication_error"),
        (body(), {"authorization": f"Bearer {KEY}", "anthropic-version": "2023-06-01"}, 401, "authentication_error"),
        ({**body(), "max_tokens": None}, None, 400, "invalid_request_error"),
        (body(temperature=1.5), None, 400, "invalid_request_error"),
        (body(messages=[{"role": "system", "content": "x"}]), None, 400, "invalid_request_error"),
        (body(model="gpt-4o"), None, 404, "not_found_error"),
        (body(tools=[{"name": "t", "input_schema": {"type": "string"}}]), None, 400, "invalid_request_error"),
        ("not an object", None, 400, "invalid_request_error"),
    ],
)
async def test_bad_requests_get_messages_api_errors(
    request_body: Any, headers: dict[str, str] | None, status: int, error_type: str
) -> None:
    response = await post(make_sim(), request_body, headers)
    assert response.status_code == status
    assert response.json()["type"] == "error" and response.json()["error"]["type"] == error_type
    assert KEY not in response.text


async def test_faults_in_the_messages_shapes() -> None:
    limited = await post(make_sim(rate_limit_rate=1.0, retry_after_s=3), body())
    assert limited.status_code == 429 and limited.headers["retry-after"] == "3"
    assert limited.json()["error"]["type"] == "rate_limit_error"
    sim = make_sim(error_5xx_rate=1.0)
    statuses = {(await post(sim, body())).status_code for _ in range(12)}
    assert statuses == {500, 529}
    overloaded = await post(sim, body())
    while overloaded.status_code != 529:
        overloaded = await post(sim, body())
    assert overloaded.json()["error"]["type"] == "overloaded_error"
    malformed = await post(make_sim(malformed_rate=1.0), body(stream=True))
    assert (
        'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,"delta":{"text"\n' in malformed.text
    )


async def test_models_list_in_the_messages_shape() -> None:
    transport = httpx.ASGITransport(app=make_sim().app)
    async with httpx.AsyncClient(transport=transport, base_url="http://sim") as client:
        listing = (await client.get("/v1/models", headers=HEADERS)).json()
        assert (await client.post("/v1/chat/completions", json=body(), headers=HEADERS)).status_code == 404
    assert listing["data"][0]["id"] == "sim-claude" and listing["data"][0]["type"] == "model"


def test_the_api_flag_and_its_fixed_protocol() -> None:
    parser = argparse.ArgumentParser()
    add_cloud_sim_parser(parser.add_subparsers(dest="command"))
    settings = settings_from_args(parser.parse_args(["cloud-sim", "--api", "anthropic"]), env={})
    assert settings.api == "anthropic" and settings.public()["api"] == "anthropic"
    assert settings_from_args(parser.parse_args(["cloud-sim"]), env={}).api == "openai"
    with pytest.raises(SystemExit):
        parser.parse_args(["cloud-sim", "--api", "gemini"])
    with pytest.raises(InvalidSettings):
        settings.merged({"api": "grpc"})


async def test_the_protocol_cannot_change_at_run_time() -> None:
    transport = httpx.ASGITransport(app=make_sim().app)
    async with httpx.AsyncClient(transport=transport, base_url="http://sim", headers={"x-api-key": KEY}) as client:
        refused = await client.post("/control/faults", json={"api": "openai"})
        kept = await client.post("/control/faults", json={"api": "anthropic", "error_5xx_rate": 0.5})
    assert refused.status_code == 400 and "fixed" in refused.text
    assert kept.status_code == 200 and kept.json()["error_5xx_rate"] == 0.5
