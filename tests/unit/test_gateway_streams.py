"""Streams at the HTTP edge (the real GatewayHTTP and dispatcher, a FakeProvider): streamed L1 tool
calls are accepted and checked, a violation after bytes were sent ends the SSE stream with the
error event, the decision record served over HTTP has the stream's final outcome, and a bad
`stream_options` is a 400."""

from __future__ import annotations

import json
import random
from typing import Any

import httpx

from router.learning.decision import DecisionStore
from serve_apps.clocks import Clocks
from serve_apps.dispatch.dispatcher import Dispatcher
from serve_apps.dispatch.parts import DispatchParts
from serve_apps.gateway_parts import GatewayParts
from serve_apps.http.surface import GatewayHTTP, ServedModel
from serve_apps.resilience.state import Resilience
from tests.fakes import FakeEngine, FakeProvider
from tests.unit.test_dispatch_resilience import USAGE, World, make_config
from tests.unit.test_dispatch_streams import BAD_ARGS, TOOL_BODY, tool_events

L1 = {"x-spillover-level": "L1"}


def gateway(provider: FakeProvider) -> tuple[GatewayHTTP, DecisionStore]:
    config = make_config(providers={"a": {}})
    world = World()
    store = DecisionStore()
    res = Resilience(config, clock=world.clock, rng=random.Random(7))
    d = Dispatcher(
        config,
        FakeEngine(),
        {"a": provider},
        world.snapshot,
        clocks=Clocks.of(world.clock, sleep=world.sleep),
        parts=DispatchParts(decisions=store, resilience=res),
    )
    models = [ServedModel("m", "llama", "cpu", 4096)]
    return GatewayHTTP(FakeEngine(), models, d, created=1, parts=GatewayParts(decisions=store)), store


async def post(app: GatewayHTTP, body: dict[str, Any], **headers: str) -> httpx.Response:
    transport = httpx.ASGITransport(app=app.app)
    async with httpx.AsyncClient(transport=transport, base_url="http://gw", timeout=30) as client:
        return await client.post("/v1/chat/completions", json={"model": "m", **body}, headers=headers)


def events(response: httpx.Response) -> list[Any]:
    datas = [line[6:] for line in response.text.splitlines() if line.startswith("data: ")]
    return [d if d == "[DONE]" else json.loads(d) for d in datas]


async def test_a_streamed_l1_tools_request_is_accepted_and_its_record_is_final() -> None:
    provider = FakeProvider("a", usage=USAGE)
    provider.stream_events = tool_events(json.dumps({"city": "Paris"}))
    app, _ = gateway(provider)
    response = await post(app, TOOL_BODY, **L1, **{"x-request-id": "s1"})
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
    assert events(response)[-1] == "[DONE]" and all("usage" not in e for e in events(response)[:-1])
    transport = httpx.ASGITransport(app=app.app)
    async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
        record = (await client.get("/v1/spillover/decisions/s1")).json()
    last = record["attempts"][-1]
    assert (last["outcome"], last["prompt_tokens"], last["completion_tokens"], last["usage"]) == (
        "ok",
        1000,
        500,
        "reported",
    )
    assert record["total_cost_usd"] > 0


async def test_an_l1_violation_after_content_was_sent_ends_with_the_error_event() -> None:
    provider = FakeProvider("a")
    provider.stream_events = tool_events(BAD_ARGS, content="Checking.")
    app, store = gateway(provider)
    response = await post(app, TOOL_BODY, **L1, **{"x-request-id": "s2"})
    sent = events(response)
    assert response.status_code == 200 and sent[-1] == "[DONE]"
    error = sent[-2]["error"]
    assert error["code"] == "contract_violation" and error["errors"] and "$.city" in error["errors"][0]
    record = store.get("s2")
    assert record is not None and record.attempts[-1].outcome == "contract_violation"


async def test_an_l1_violation_before_any_byte_is_a_502() -> None:
    provider = FakeProvider("a")
    provider.stream_events = tool_events(BAD_ARGS)
    app, _ = gateway(provider)
    response = await post(app, TOOL_BODY, **L1)
    assert response.status_code == 502 and response.json()["error"]["code"] == "contract_violation"


async def test_a_streamed_l1_json_schema_request_is_still_refused() -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "c", "schema": {"type": "object"}}}
    app, _ = gateway(FakeProvider("a"))
    body = {"messages": [{"role": "user", "content": "x"}], "response_format": fmt, "stream": True}
    response = await post(app, body, **L1)
    assert response.status_code == 400 and response.json()["error"]["param"] == "stream"


async def test_a_bad_stream_options_is_a_400_naming_the_field() -> None:
    app, _ = gateway(FakeProvider("a"))
    for options in ({"include_usage": "yes"}, {"include_usage": 1}, "on", [True]):
        body = {"messages": [{"role": "user", "content": "x"}], "stream": True, "stream_options": options}
        response = await post(app, body)
        assert response.status_code == 400, options
        error = response.json()["error"]
        assert error["param"] == "stream_options" and error["code"] == "invalid_request"
        assert "Traceback" not in response.text
