"""Streamed answers put back together from their deltas and checked against the declared tool
schemas (router/output/tool_calls.py), hostile schemas and hostile deltas included."""

from __future__ import annotations

import json
import time
from typing import Any

from router.output.tool_calls import StreamedMessage, check_streamed
from router.request.contract import RequestContract, derive_contract
from router.routing.policy import Policy

WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
    "required": ["city"],
    "additionalProperties": False,
}
GENEROUS_S = 30.0  # a bound for hostile input: generous, never a tight timing assertion


def contract(parameters: dict[str, Any] | None = None, **headers: str) -> RequestContract:
    tool = {"type": "function", "function": {"name": "weather", "parameters": parameters or WEATHER}}
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": [tool], "stream": True}
    return derive_contract(body, headers, Policy())


def tool_chunks(arguments: str, *, name: str = "weather", index: int = 0, pieces: int = 3) -> list[dict[str, Any]]:
    """The chunks OpenAI and vLLM stream for one tool call: id, type and name first, then the
    arguments in pieces."""
    step = max(1, len(arguments) // pieces)
    first = {"index": index, "id": f"call_{index}", "type": "function", "function": {"name": name, "arguments": ""}}
    chunks = [{"choices": [{"index": 0, "delta": {"role": "assistant", "content": None, "tool_calls": [first]}}]}]
    for i in range(0, len(arguments), step):
        call = {"index": index, "function": {"arguments": arguments[i : i + step]}}
        chunks.append({"choices": [{"index": 0, "delta": {"tool_calls": [call]}}]})
    chunks.append({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]})
    return chunks


def assembled(chunks: list[dict[str, Any]]) -> StreamedMessage:
    message = StreamedMessage()
    for chunk in chunks:
        message.feed(chunk)
    return message


def test_tool_call_deltas_assemble_into_the_non_streamed_message() -> None:
    arguments = json.dumps({"city": "Paris", "days": 3})
    message = assembled(tool_chunks(arguments))
    assert message.message() == {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "call_0", "type": "function", "function": {"name": "weather", "arguments": arguments}}],
    }
    assert message.has_tool_calls and not message.has_content
    assert check_streamed(contract(), message).status == "ok"


def test_parallel_calls_are_kept_apart_by_index() -> None:
    good, bad = json.dumps({"city": "Paris"}), json.dumps({"days": "three"})
    chunks = tool_chunks(good, index=0) + tool_chunks(bad, index=1)
    calls = assembled(chunks).message()["tool_calls"]
    assert [c["function"]["arguments"] for c in calls] == [good, bad]
    verdict = check_streamed(contract(), assembled(chunks))
    assert verdict.status == "violated"
    assert all(e.startswith("tool_calls[1] weather arguments") for e in verdict.errors)


def test_arguments_breaking_the_schema_are_a_violation_naming_the_path() -> None:
    verdict = check_streamed(contract(), assembled(tool_chunks(json.dumps({"city": 7, "cloud_sim": "x"}))))
    assert verdict.status == "violated" and verdict.error_count == 2
    assert any("$.city" in e for e in verdict.errors)


def test_cut_off_arguments_are_not_json() -> None:
    verdict = check_streamed(contract(), assembled(tool_chunks('{"city": "Par')))
    assert verdict.status == "violated" and "arguments are not JSON" in verdict.errors[0]


def test_an_undeclared_tool_is_a_violation() -> None:
    verdict = check_streamed(contract(), assembled(tool_chunks("{}", name="rm_rf")))
    assert verdict.status == "violated" and "unknown tool 'rm_rf'" in verdict.errors[0]


def test_content_deltas_are_joined_and_a_text_answer_passes() -> None:
    chunks = [{"choices": [{"index": 0, "delta": {"content": part}}]} for part in ("It is ", "sunny.")]
    message = assembled(chunks)
    assert message.has_content and message.message()["content"] == "It is sunny."
    assert check_streamed(contract(), message).status == "ok"


def test_only_choice_zero_is_assembled_and_odd_shapes_are_ignored() -> None:
    message = StreamedMessage()
    for chunk in (
        {"choices": [{"index": 1, "delta": {"content": "other choice"}}]},
        {"choices": "not a list"},
        {"choices": [None, {"index": 0, "delta": "not an object"}]},
        {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": True}, "x", {"index": 0, "function": 5}]}}]},
    ):
        message.feed(chunk)
    assert message.message() == {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": None, "type": "function", "function": {"name": "", "arguments": ""}}],
    }


def test_a_flood_of_arguments_is_bounded_and_reported_not_validated() -> None:
    message = StreamedMessage(max_chars=1000)
    for chunk in tool_chunks("x" * 5000, pieces=50):
        message.feed(chunk)
    assert message.overflowed and sum(len(c["function"]["arguments"]) for c in message.message()["tool_calls"]) <= 1000
    verdict = check_streamed(contract(), message)
    assert verdict.status == "violated" and "not checked" in verdict.errors[0]


def test_a_flood_of_tool_calls_is_bounded() -> None:
    message = StreamedMessage(max_calls=4)
    for index in range(100):
        for chunk in tool_chunks("{}", index=index, pieces=1):
            message.feed(chunk)
    assert len(message.message()["tool_calls"]) == 4 and "more than 4 tool calls" in message.overflowed


def test_json_content_with_surrounding_text_cannot_be_repaired_once_streamed() -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "c", "schema": {"type": "object"}}}
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}], "response_format": fmt, "stream": True}
    message = assembled([{"choices": [{"index": 0, "delta": {"content": 'Sure! {"a": 1}'}}]}])
    verdict = check_streamed(derive_contract(body, {}, Policy()), message)
    assert verdict.status == "violated" and "cannot be repaired" in verdict.errors[0]


def test_a_catastrophic_pattern_in_a_tool_schema_ends_within_the_time_limit() -> None:
    schema = {"type": "object", "properties": {"city": {"type": "string", "pattern": "^(a+)+$"}}}
    message = assembled(tool_chunks(json.dumps({"city": "a" * 40 + "!"})))
    began = time.monotonic()
    verdict = check_streamed(contract(schema), message, timeout_s=0.5)
    assert time.monotonic() - began < GENEROUS_S
    assert verdict.status == "violated"


def test_arguments_nested_too_deeply_are_a_violation_not_a_crash() -> None:
    message = assembled(tool_chunks("[" * 100_000 + "]" * 100_000, pieces=10))
    verdict = check_streamed(contract(), message)
    assert verdict.status == "violated" and "not JSON" in verdict.errors[0]
