"""Streams counted and tool calls checked on the real stack, called with the official `openai` client:
a streamed local answer counted from vLLM's own usage chunk, a streamed burst to cloud-sim booked with
its tokens and cost, a stream cut by a cloud-sim fault booked as `cut` with what it consumed, and
cloud-sim's invalid tool arguments flagged at L2 and failed over to the healthy spare at L1."""

from __future__ import annotations

import sqlite3
import time
import uuid
from typing import Any

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.conftest import Stack, final_record
from tests.integration.qwen_load import QWEN, SHORT, saturated_qwen

pytestmark = pytest.mark.integration

SMOL = "smollm2-135m-instruct"
LONG = [{"role": "user", "content": "hello " * 5000}]  # beyond SmolLM2's window: only the cloud can take it
WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
    "required": ["city"],
}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}]
WEATHER_CHAT = [{"role": "user", "content": "Weather in Paris?"}]


@pytest.fixture
def client(stack: Stack) -> openai.OpenAI:
    return openai.OpenAI(base_url=stack.openai_base, api_key="unused", max_retries=0, timeout=120)


def fault(stack: Stack, **faults: Any) -> None:
    httpx.post(f"{stack.sim_url.removesuffix('/v1')}/control/faults", json=faults, timeout=10).raise_for_status()


def metric(stack: Stack, name: str, **labels: str) -> float:
    text = httpx.get(f"{stack.base_url}/metrics", timeout=10).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    return 0.0


def ledger_rows(stack: Stack, request_id: str) -> list[tuple[str, float]]:
    deadline = time.monotonic() + 10
    while True:  # the gateway writes the ledger from its own thread
        with sqlite3.connect(str(stack.config.spend.ledger)) as db:
            rows = list(db.execute("SELECT outcome, cost_usd FROM spend WHERE request_id = ?", (request_id,)))
        if rows or time.monotonic() > deadline:
            return rows
        time.sleep(0.2)


def test_a_streamed_local_answer_is_counted_from_the_engine_usage(stack: Stack, client: openai.OpenAI) -> None:
    quiet, asked = f"local-{uuid.uuid4().hex}", f"local-usage-{uuid.uuid4().hex}"
    common: dict[str, Any] = {"model": SMOL, "messages": SHORT, "max_tokens": 8, "temperature": 0, "stream": True}
    chunks = list(client.chat.completions.create(**common, extra_headers={"x-request-id": quiet}))
    assert chunks and all(c.usage is None for c in chunks)  # no usage chunk the client did not ask for
    with_usage = list(
        client.chat.completions.create(
            **common, stream_options={"include_usage": True}, extra_headers={"x-request-id": asked}
        )
    )
    reported = with_usage[-1].usage
    assert reported is not None and with_usage[-1].choices == []
    for request_id in (quiet, asked):
        record = final_record(stack, request_id)
        attempt = record["attempts"][-1]
        assert (record["chosen"], attempt["outcome"], attempt["usage"]) == (f"local:{SMOL}", "ok", "reported")
        assert attempt["prompt_tokens"] == reported.prompt_tokens and 0 < attempt["completion_tokens"] <= 8


def test_a_streamed_burst_is_booked_with_tokens_and_cost(stack: Stack, client: openai.OpenAI) -> None:
    request_id = f"stream-burst-{uuid.uuid4().hex}"
    target = f"cloud:cloud-sim/{QWEN}"
    cost_before = metric(stack, "spillover_cost_usd_total", target=target)
    with saturated_qwen(stack):
        raw = client.chat.completions.with_raw_response.create(
            model=QWEN, messages=SHORT, max_tokens=16, stream=True, extra_headers={"x-request-id": request_id}
        )
        assert raw.headers["x-spillover-route"] == "cloud" and "kv_usage" in raw.headers["x-spillover-reason"]
        text = "".join(c.choices[0].delta.content or "" for c in raw.parse() if c.choices)
    assert text.startswith("[cloud-sim:sim-qwen]")
    record = final_record(stack, request_id)
    attempt = record["attempts"][-1]
    assert (attempt["target"], attempt["outcome"], attempt["usage"]) == (target, "ok", "reported")
    assert attempt["prompt_tokens"] > 0 and attempt["completion_tokens"] > 0
    assert attempt["cost_usd"] > 0 and record["total_cost_usd"] > 0
    assert ledger_rows(stack, request_id) == [("ok", pytest.approx(attempt["cost_usd"]))]
    assert metric(stack, "spillover_cost_usd_total", target=target) > cost_before


def test_a_streamed_anthropic_answer_is_booked_with_tokens_and_cost(stack: Stack, client: openai.OpenAI) -> None:
    request_id = f"stream-claude-{uuid.uuid4().hex}"
    stream = client.chat.completions.create(
        model=SMOL,
        messages=LONG,
        max_tokens=16,
        stream=True,
        extra_headers={"x-request-id": request_id, "x-spillover-providers": "cloud-anthropic"},
    )
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices).startswith("[cloud-sim:")
    attempt = final_record(stack, request_id)["attempts"][-1]
    assert (attempt["target"], attempt["outcome"], attempt["usage"]) == (
        f"cloud:cloud-anthropic/{SMOL}",
        "ok",
        "reported",
    )
    assert attempt["completion_tokens"] > 0 and attempt["cost_usd"] > 0


@pytest.mark.usefixtures("resets_after")
def test_a_stream_cut_by_a_fault_is_booked_as_cut_with_what_it_consumed(stack: Stack, client: openai.OpenAI) -> None:
    request_id = f"stream-cut-{uuid.uuid4().hex}"
    fault(stack, midstream_cut_rate=1.0)
    target = f"cloud:cloud-sim/{SMOL}"
    cut_before = metric(stack, "spillover_attempts_total", target=target, outcome="cut")
    stream = client.chat.completions.create(
        model=SMOL,
        messages=LONG,
        max_tokens=32,
        stream=True,
        extra_headers={"x-request-id": request_id, "x-spillover-providers": "cloud-sim"},
    )
    received: list[str] = []
    with pytest.raises(openai.APIError):
        for chunk in stream:
            received += [chunk.choices[0].delta.content or ""] if chunk.choices else []
    assert "".join(received).startswith("[cloud-sim:")  # bytes were sent before the cut
    attempt = final_record(stack, request_id)["attempts"][-1]
    assert (attempt["target"], attempt["outcome"], attempt["error"]) == (target, "cut", "provider_cut")
    assert attempt["usage"] == "counted" and attempt["prompt_tokens"] > 0
    assert 0 < attempt["completion_tokens"] < 32 and attempt["cost_usd"] > 0
    assert ledger_rows(stack, request_id) == [("cut", pytest.approx(attempt["cost_usd"]))]
    assert metric(stack, "spillover_attempts_total", target=target, outcome="cut") == cut_before + 1


@pytest.mark.usefixtures("resets_after")
def test_a_client_that_goes_away_leaves_a_cancelled_attempt_charged_what_it_consumed(
    stack: Stack, client: openai.OpenAI
) -> None:
    request_id = f"stream-gone-{uuid.uuid4().hex}"
    fault(stack, tokens_per_s=2.0)  # 32 tokens take 16 s: the client leaves long before the end
    stream = client.chat.completions.create(
        model=SMOL,
        messages=LONG,
        max_tokens=32,
        stream=True,
        extra_headers={"x-request-id": request_id, "x-spillover-providers": "cloud-sim"},
    )
    for _, _chunk in zip(range(3), stream, strict=False):
        pass
    stream.close()
    attempt = final_record(stack, request_id, wait_s=30)["attempts"][-1]
    assert (attempt["outcome"], attempt["usage"]) == ("cancelled", "counted"), attempt
    assert 0 < attempt["completion_tokens"] < 32 and attempt["cost_usd"] > 0
    assert ledger_rows(stack, request_id) == [("cancelled", pytest.approx(attempt["cost_usd"]))]


@pytest.mark.usefixtures("resets_after")
def test_invalid_tool_arguments_are_flagged_at_l2(stack: Stack, client: openai.OpenAI) -> None:
    fault(stack, tool_args_invalid_rate=1.0)
    target = f"cloud:cloud-sim/{SMOL}"
    flagged_before = metric(stack, "spillover_contract_flagged_total", target=target)
    headers = {"x-spillover-level": "L2", "x-spillover-providers": "cloud-sim"}
    plain_id, stream_id = f"l2-tools-{uuid.uuid4().hex}", f"l2-tools-stream-{uuid.uuid4().hex}"
    common: dict[str, Any] = {"model": SMOL, "messages": WEATHER_CHAT, "tools": TOOLS, "tool_choice": "required"}
    raw = client.chat.completions.with_raw_response.create(
        **common, extra_headers={**headers, "x-request-id": plain_id}
    )
    assert raw.headers["x-spillover-contract"] == "schema: 2 errors"
    assert raw.parse().choices[0].message.tool_calls  # L2: the answer passes
    chunks = list(
        client.chat.completions.create(**common, stream=True, extra_headers={**headers, "x-request-id": stream_id})
    )
    assert chunks[-1].choices and chunks[-1].choices[0].finish_reason == "tool_calls"
    for request_id in (plain_id, stream_id):
        attempt = final_record(stack, request_id)["attempts"][-1]
        assert (attempt["target"], attempt["outcome"], attempt["contract"]) == (target, "ok", "schema: 2 errors")
        assert any("$.city" in e for e in attempt["contract_errors"])
    assert metric(stack, "spillover_contract_flagged_total", target=target) == flagged_before + 2


@pytest.mark.usefixtures("resets_after")
def test_invalid_tool_arguments_fail_over_to_the_healthy_target_at_l1(stack: Stack, client: openai.OpenAI) -> None:
    fault(stack, tool_args_invalid_rate=1.0)
    headers = {"x-spillover-level": "L1", "x-spillover-providers": "cloud-sim,cloud-sim-b"}
    common: dict[str, Any] = {"model": SMOL, "messages": WEATHER_CHAT, "tools": TOOLS, "tool_choice": "required"}
    for stream in (False, True):
        request_id = f"l1-tools-{stream}-{uuid.uuid4().hex}"
        raw = client.chat.completions.with_raw_response.create(
            **common, stream=stream, extra_headers={**headers, "x-request-id": request_id}
        )
        assert raw.headers["x-spillover-target"] == "cloud:cloud-sim-b"
        assert "broke the output contract" in raw.headers["x-spillover-reason"]
        if stream:
            pieces = [
                call.function.arguments or ""
                for chunk in raw.parse()
                if chunk.choices
                for call in chunk.choices[0].delta.tool_calls or []
                if call.function is not None
            ]
            arguments = "".join(pieces)
        else:
            arguments = raw.parse().choices[0].message.tool_calls[0].function.arguments
        assert '"city": "' in arguments  # the healthy sim's valid arguments
        attempts = final_record(stack, request_id)["attempts"]
        assert [(a["target"], a["outcome"]) for a in attempts] == [
            (f"cloud:cloud-sim/{SMOL}", "contract_violation"),
            (f"cloud:cloud-sim-b/{SMOL}", "ok"),
        ]
        assert attempts[0]["cost_usd"] > 0  # the violating answer is paid for
