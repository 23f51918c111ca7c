"""Cloud-only routes end to end: `spillover serve` of a config without local models starts Ray, Serve
and the gateway only (no engine deployment, no vLLM process) and serves its routes from two real
cloud-sims, one per wire protocol, called with the official `openai` client at the gateway: JSON
answers, streams, tool calls and tool results, the route's fall-over order when its first target
fails, `/v1/models` listing the routes, and a cost ceiling whose estimate used the target's output
limit making the upstream request carry that limit."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import httpx
import openai
import psutil
import pytest

from bench.gateway.faults import TOOL  # the weather tool every tool request of the tests uses
from tests.cloud_routes.conftest import ANTHROPIC_KEY, CloudOnly

CONTROL_HEADERS = {"x-api-key": ANTHROPIC_KEY}  # the Anthropic sim's /control routes need its key

pytestmark = pytest.mark.integration

ASK = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture
def client(cloud_only: CloudOnly) -> openai.OpenAI:
    return openai.OpenAI(base_url=cloud_only.openai_base, api_key="unused", max_retries=0, timeout=60)


@pytest.fixture
def clean(cloud_only: CloudOnly) -> Iterator[None]:
    """Faults off and the gateway's resilience state reset after a test that injected faults."""
    yield
    for sim in (cloud_only.openai_sim, cloud_only.anthropic_sim, cloud_only.spare_sim):
        httpx.post(f"{sim}/control/reset", headers=CONTROL_HEADERS, timeout=10).raise_for_status()
    httpx.post(f"{cloud_only.base_url}/v1/spillover/resilience/reset", timeout=10).raise_for_status()


def record(cloud_only: CloudOnly, request_id: str) -> dict:
    found: dict = httpx.get(f"{cloud_only.openai_base}/spillover/decisions/{request_id}", timeout=10).json()
    return found


def sim_rows(sim: str, request_id: str) -> list[dict]:
    found = httpx.get(f"{sim}/control/log", params={"x_request_id": request_id}, headers=CONTROL_HEADERS, timeout=10)
    rows: list[dict] = found.json()["rows"]
    return rows


def test_the_gateway_started_without_an_engine(cloud_only: CloudOnly) -> None:
    log = cloud_only.log.read_text()
    assert "0 model(s), 4 route(s)" in log and "(models: chat, chat-anthropic, tight, strict)" in log
    ready = httpx.get(f"{cloud_only.base_url}/readyz", timeout=10)
    assert ready.status_code == 200 and ready.json() == {"status": "ready", "models": {}}
    # the Ray that `spillover serve` started runs as its children: one Serve replica, the gateway's
    titles = [" ".join(c.cmdline()) for c in psutil.Process(cloud_only.pid).children(recursive=True)]
    replicas = [t for t in titles if "ServeReplica" in t]
    assert replicas and all("SpilloverGateway" in t for t in replicas), replicas
    assert not [t for t in titles if "vllm" in t.lower() or "EngineCore" in t or "LLMServer" in t]


def test_models_lists_the_routes(client: openai.OpenAI) -> None:
    listed = {m.id: m for m in client.models.list().data}
    assert list(listed) == ["chat", "chat-anthropic", "tight", "strict"]
    assert listed["chat"].metadata == {  # type: ignore[attr-defined]
        "route": "route",
        "targets": ["cloud:sim-openai/chat", "cloud:sim-anthropic/chat"],
    }


@pytest.mark.parametrize(
    ("model", "target", "answer"),
    [
        ("chat", "cloud:sim-openai", "[cloud-sim:sim-chat]"),
        ("chat-anthropic", "cloud:sim-anthropic", "[cloud-sim:sim-claude]"),
    ],
)
def test_json_and_stream_in_each_protocol(client: openai.OpenAI, model: str, target: str, answer: str) -> None:
    raw = client.chat.completions.with_raw_response.create(model=model, messages=ASK, max_tokens=20)
    reply = raw.parse()
    assert raw.headers["x-spillover-route"] == "cloud" and raw.headers["x-spillover-target"] == target
    assert raw.headers["x-spillover-reason"] == f"route {model} has no local model"
    assert reply.choices[0].message.content == f"{answer} What is the capital of France?"
    stream = client.chat.completions.create(
        model=model, messages=ASK, max_tokens=20, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == reply.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"


@pytest.mark.parametrize(("model", "sim"), [("chat", "openai"), ("chat-anthropic", "anthropic")])
def test_tool_calls_and_results_round_trip_in_each_protocol(
    cloud_only: CloudOnly, client: openai.OpenAI, model: str, sim: str
) -> None:
    messages: list = [{"role": "user", "content": "What is the weather in Paris?"}]
    first = client.chat.completions.create(
        model=model, messages=messages, tools=[TOOL], tool_choice="required", max_tokens=30
    )
    choice = first.choices[0]
    (call,) = choice.message.tool_calls or []
    assert choice.finish_reason == "tool_calls" and call.function.name == "get_weather"
    assert "city" in json.loads(call.function.arguments)
    messages += [
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "sunny"},
    ]
    request_id = f"routes-tool-{uuid.uuid4().hex}"
    second = client.chat.completions.with_raw_response.create(
        model=model, messages=messages, tools=[TOOL], max_tokens=30, extra_headers={"x-request-id": request_id}
    )
    assert second.parse().choices[0].finish_reason == "stop"
    assert second.headers["x-spillover-target"] == f"cloud:sim-{sim}"
    streamed = client.chat.completions.create(
        model=model, messages=messages[:1], tools=[TOOL], tool_choice="required", max_tokens=30, stream=True
    )
    deltas = [c.choices[0].delta.tool_calls[0] for c in streamed if c.choices and c.choices[0].delta.tool_calls]
    arguments = "".join(d.function.arguments or "" for d in deltas if d.function is not None)
    assert deltas[0].function is not None and deltas[0].function.name == "get_weather"
    assert json.loads(arguments) == json.loads(call.function.arguments)


def test_a_failing_first_target_falls_over_in_route_order(
    cloud_only: CloudOnly, client: openai.OpenAI, clean: None
) -> None:
    faults = {"error_5xx_rate": 1.0, "retry_after_s": 0}
    httpx.post(f"{cloud_only.openai_sim}/control/faults", json=faults, timeout=10).raise_for_status()
    request_id = f"routes-failover-{uuid.uuid4().hex}"
    raw = client.chat.completions.with_raw_response.create(
        model="chat", messages=ASK, max_tokens=20, extra_headers={"x-request-id": request_id}
    )
    assert raw.http_response.status_code == 200 and raw.headers["x-spillover-target"] == "cloud:sim-anthropic"
    attempts = record(cloud_only, request_id)["attempts"]
    assert attempts[0]["target"] == "cloud:sim-openai/chat" and attempts[0]["outcome"] == "error"
    assert (attempts[-1]["target"], attempts[-1]["outcome"]) == ("cloud:sim-anthropic/chat", "ok")
    assert sim_rows(cloud_only.openai_sim, request_id) and sim_rows(cloud_only.anthropic_sim, request_id)


def test_under_a_cost_ceiling_the_upstream_request_carries_the_output_limit(client: openai.OpenAI) -> None:
    long_ask = [{"role": "user", "content": "one two three four five six seven eight nine ten"}]
    free = client.chat.completions.create(model="tight", messages=long_ask)
    assert free.choices[0].finish_reason == "stop"  # no ceiling: sent as the client sent it, not cut
    capped = client.chat.completions.with_raw_response.create(
        model="tight", messages=long_ask, extra_headers={"x-spillover-max-cost-usd": "0.01"}
    )
    reply = capped.parse()
    # the estimate used the entry's max_output_tokens (4), so the request carried it: the sim cut there
    assert reply.choices[0].finish_reason == "length" and reply.usage is not None
    assert reply.usage.completion_tokens == 4


SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
SKIPPED = "then cloud:sim-openai-b/strict skipped: max cost: estimated cost $0.001000 > remaining"


def test_a_fall_over_the_rest_of_the_ceiling_cannot_pay_for_is_skipped_with_the_reason(
    cloud_only: CloudOnly, client: openai.OpenAI, clean: None
) -> None:
    # each target's estimate is 100 tokens x $10/1M = $0.001, within the $0.001005 ceiling; the first answer
    # breaks the L1 schema and costs at least one output token ($0.00001), so the second no longer fits
    faults = {"schema_invalid_rate": 1.0}
    httpx.post(f"{cloud_only.openai_sim}/control/faults", json=faults, timeout=10).raise_for_status()
    request_id = f"routes-ceiling-{uuid.uuid4().hex}"
    headers = {"x-request-id": request_id, "x-spillover-level": "L1", "x-spillover-max-cost-usd": "0.001005"}
    with pytest.raises(openai.APIStatusError) as caught:
        client.chat.completions.create(
            model="strict",
            messages=[{"role": "user", "content": "Which city? Answer in JSON."}],
            max_tokens=100,
            response_format={"type": "json_schema", "json_schema": {"name": "city", "schema": SCHEMA}},
            extra_headers=headers,
        )
    error: dict = caught.value.body  # type: ignore[assignment]
    assert caught.value.status_code == 502 and error["code"] == "contract_violation"
    assert SKIPPED in error["message"]
    attempts = record(cloud_only, request_id)["attempts"]
    assert [(a["target"], a["outcome"]) for a in attempts] == [
        ("cloud:sim-openai/strict", "contract_violation"),
        ("cloud:sim-openai-b/strict", "skipped"),
    ]
    assert attempts[0]["cost_usd"] > 0 and attempts[1]["error"].startswith("max cost: estimated cost $0.001000")
    assert sim_rows(cloud_only.spare_sim, request_id) == []  # never sent


def test_a_route_name_that_is_not_configured_is_404_listing_the_routes(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        client.chat.completions.create(model="chat-nope", messages=ASK)
    assert "chat, chat-anthropic, strict, tight" in caught.value.body["message"]  # type: ignore[index]


def test_a_bad_n_is_a_400_naming_it(client: openai.OpenAI) -> None:
    for n in (0, 129):
        with pytest.raises(openai.BadRequestError) as caught:
            client.chat.completions.create(model="chat", messages=ASK, n=n)
        assert caught.value.body["param"] == "n"  # type: ignore[index]


def test_the_anthropic_key_is_never_printed(cloud_only: CloudOnly, client: openai.OpenAI) -> None:
    request_id = f"routes-key-{uuid.uuid4().hex}"
    client.chat.completions.create(
        model="chat-anthropic", messages=ASK, max_tokens=5, extra_headers={"x-request-id": request_id}
    )
    seen = [json.dumps(record(cloud_only, request_id)), cloud_only.log.read_text()]
    seen.append(httpx.get(f"{cloud_only.base_url}/metrics", timeout=10).text)
    assert not [text for text in seen if ANTHROPIC_KEY in text]
