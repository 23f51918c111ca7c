"""The Anthropic Messages adapter on the real stack: the official `openai` client calls the
gateway, which translates to the Messages API of a real cloud-sim subprocess started with
`--api anthropic` (it checks bodies and headers the way the Messages API documents them and
answers in its shapes: content blocks, tool_use, SSE events, 529 overloaded). A request reaches
`cloud-anthropic` when it narrows to its region (`x-spillover-residency: sim-anthropic`), or, for
the fail-over, when the `cheap` scenario's cost strategy ranks the cheapest provider first among
the providers it allows."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import httpx
import openai
import pytest

from bench.gateway.faults import TOOL  # the weather tool every tool request of the tests uses
from tests.integration.conftest import ANTHROPIC_KEY, CONTROL_HEADERS, Stack, ray_logs, reset_sims_and_resilience

pytestmark = pytest.mark.integration

SMOL = "smollm2-135m-instruct"
ONLY_ANTHROPIC = {"x-spillover-residency": "sim-anthropic"}


@pytest.fixture
def client(stack: Stack) -> openai.OpenAI:
    return openai.OpenAI(base_url=stack.openai_base, api_key="unused", max_retries=0, timeout=60)


@pytest.fixture
def clean(stack: Stack) -> Iterator[None]:
    """Faults off and resilience state reset after the test (later tests share the stack)."""
    yield
    reset_sims_and_resilience(stack, stack.anthropic_url)


def anthropic_log(stack: Stack, request_id: str) -> list[dict]:
    url = f"{stack.anthropic_url.removesuffix('/v1')}/control/log"
    rows: list[dict] = httpx.get(url, params={"x_request_id": request_id}, headers=CONTROL_HEADERS, timeout=10).json()[
        "rows"
    ]
    return rows


def decision(stack: Stack, request_id: str) -> dict:
    record: dict = httpx.get(f"{stack.openai_base}/spillover/decisions/{request_id}", timeout=10).json()
    return record


def test_a_chat_is_answered_through_the_messages_api(stack: Stack, client: openai.OpenAI) -> None:
    request_id = f"anth-json-{uuid.uuid4().hex}"
    raw = client.chat.completions.with_raw_response.create(
        model=SMOL,
        messages=[
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "What is the capital of France?"},
        ],
        max_tokens=20,
        extra_headers={**ONLY_ANTHROPIC, "x-request-id": request_id},
    )
    reply = raw.parse()
    assert raw.headers["x-spillover-target"] == "cloud:cloud-anthropic"
    assert reply.choices[0].message.content == "[cloud-sim:sim-claude] What is the capital of France?"
    assert reply.choices[0].finish_reason == "stop" and reply.object == "chat.completion"
    assert reply.usage is not None and reply.usage.completion_tokens == 7 and reply.usage.prompt_tokens == 8
    (row,) = anthropic_log(stack, request_id)
    assert row["path"] == "/v1/messages" and row["status"] == 200 and row["model"] == "sim-claude"
    record = decision(stack, request_id)
    assert record["chosen"] == "cloud:cloud-anthropic" and record["attempts"][-1]["outcome"] == "ok"
    assert record["total_cost_usd"] > 0


def test_a_stream_has_the_same_text_and_ends_cleanly(client: openai.OpenAI) -> None:
    messages = [{"role": "user", "content": "Name three colours please"}]
    whole = client.chat.completions.create(model=SMOL, messages=messages, max_tokens=20, extra_headers=ONLY_ANTHROPIC)
    stream = client.chat.completions.create(
        model=SMOL,
        messages=messages,
        max_tokens=20,
        stream=True,
        stream_options={"include_usage": True},
        extra_headers=ONLY_ANTHROPIC,
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens  # type: ignore[union-attr]


def test_tool_calls_and_tool_results_round_trip(stack: Stack, client: openai.OpenAI) -> None:
    messages: list = [{"role": "user", "content": "What is the weather in Paris?"}]
    first = client.chat.completions.create(
        model=SMOL, messages=messages, tools=[TOOL], tool_choice="required", max_tokens=30, extra_headers=ONLY_ANTHROPIC
    )
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls or []
    assert call.function.name == "get_weather" and "city" in json.loads(call.function.arguments)
    messages += [
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "sunny"},
    ]
    # the simulator answers 400 unless the tool_result names the tool_use id of the turn before
    second = client.chat.completions.create(
        model=SMOL, messages=messages, tools=[TOOL], max_tokens=30, extra_headers=ONLY_ANTHROPIC
    )
    assert second.choices[0].finish_reason == "stop" and second.choices[0].message.content
    streamed = client.chat.completions.create(
        model=SMOL,
        messages=messages[:1],
        tools=[TOOL],
        tool_choice="required",
        max_tokens=30,
        stream=True,
        extra_headers=ONLY_ANTHROPIC,
    )
    deltas = [c.choices[0].delta.tool_calls[0] for c in streamed if c.choices and c.choices[0].delta.tool_calls]
    assert deltas[0].function is not None and deltas[0].function.name == "get_weather"
    arguments = "".join(d.function.arguments or "" for d in deltas if d.function is not None)
    assert json.loads(arguments) == json.loads(call.function.arguments)


def test_a_provider_error_is_translated_for_the_client(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:  # the Messages API cannot return n > 1 choices
        client.chat.completions.create(
            model=SMOL, messages=[{"role": "user", "content": "hi"}], n=2, max_tokens=5, extra_headers=ONLY_ANTHROPIC
        )
    assert caught.value.body["code"] == "provider_rejected"  # type: ignore[index]


def test_server_errors_and_overload_fail_over_to_the_openai_protocol_provider(
    stack: Stack, client: openai.OpenAI, clean: None
) -> None:
    control = f"{stack.anthropic_url.removesuffix('/v1')}/control/faults"
    faults = {"error_5xx_rate": 1.0, "retry_after_s": 0}
    httpx.post(control, json=faults, headers=CONTROL_HEADERS, timeout=10).raise_for_status()
    headers = {"x-business-scenario": "cheap", "x-spillover-providers": "cloud-anthropic,cloud-sim"}
    codes: list[str] = []
    for _ in range(4):
        request_id = f"anth-failover-{uuid.uuid4().hex}"
        raw = client.chat.completions.with_raw_response.create(
            model=SMOL,
            messages=[{"role": "user", "content": "Weather in Rome?"}],
            tools=[TOOL],
            tool_choice="required",
            max_tokens=30,
            extra_headers={**headers, "x-request-id": request_id},
        )
        assert raw.http_response.status_code == 200
        assert raw.headers["x-spillover-target"] == "cloud:cloud-sim"
        attempts = decision(stack, request_id)["attempts"]
        codes += [
            a["error"] for a in attempts if a["target"].startswith("cloud:cloud-anthropic/") and a["outcome"] == "error"
        ]
        assert attempts[-1]["target"] == f"cloud:cloud-sim/{SMOL}" and attempts[-1]["outcome"] == "ok"
    assert codes and set(codes) <= {"provider_overloaded", "provider_error"}, codes


def test_the_anthropic_key_is_never_printed(stack: Stack, client: openai.OpenAI) -> None:
    request_id = f"anth-key-{uuid.uuid4().hex}"
    client.chat.completions.create(
        model=SMOL,
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=5,
        extra_headers={**ONLY_ANTHROPIC, "x-request-id": request_id},
    )
    seen = [str(decision(stack, request_id)), httpx.get(f"{stack.base_url}/v1/spillover/resilience", timeout=10).text]
    seen.append(httpx.get(f"{stack.base_url}/metrics", timeout=10).text)
    logs = ray_logs()
    seen += [p.read_text(errors="replace") for p in logs.glob("worker-*")]
    assert not [text for text in seen if ANTHROPIC_KEY in text]
