"""OpenAI chat <-> Anthropic Messages translation (serve_apps/providers/anthropic_wire.py), pure.

The Messages shapes below are the ones the Messages API documents: a top-level `system`, typed
content blocks, `tool_use` / `tool_result`, `stop_reason`, `usage` with cache counters, and the
SSE event sequence message_start, content_block_start, ping, content_block_delta,
content_block_stop, message_delta, message_stop (an `error` event on a mid-stream failure)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from router.errors import InvalidRequest, ProviderRejected, UpstreamError
from serve_apps.providers.anthropic_wire import ChunkTranslator, chat_completion, messages_request

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


def test_system_messages_are_hoisted_and_turns_alternate() -> None:
    body = {
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "developer", "content": [{"type": "text", "text": "Answer in French."}]},
            {"role": "user", "content": "Hi"},
            {"role": "user", "content": [{"type": "text", "text": "there"}]},
        ],
        "max_tokens": 20,
        "temperature": 0.2,
        "stop": "END",
        "seed": 7,
        "presence_penalty": 0.5,
    }
    out = messages_request(body, "claude-x", 4096)
    assert out["system"] == "Be brief.\n\nAnswer in French."
    assert out["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "Hi"}, {"type": "text", "text": "there"}]}
    ]
    assert out["max_tokens"] == 20 and out["temperature"] == 0.2 and out["stop_sequences"] == ["END"]
    assert "seed" not in out and "presence_penalty" not in out and out["model"] == "claude-x"


def test_max_tokens_defaults_when_the_client_sent_none() -> None:
    out = messages_request({"messages": [{"role": "user", "content": "x"}]}, "m", 1234)
    assert out["max_tokens"] == 1234
    assert messages_request({"messages": [], "max_completion_tokens": 9}, "m", 1)["max_tokens"] == 9


def test_tool_calls_and_tool_results_become_tool_use_and_tool_result_blocks() -> None:
    body = {
        "messages": [
            {"role": "user", "content": "Weather in Paris and Rome?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
                    },
                    {
                        "id": "call_2",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city":"Rome"}'},
                    },
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
            {"role": "tool", "tool_call_id": "call_2", "content": [{"type": "text", "text": "rain"}]},
        ],
        "tools": [WEATHER],
        "tool_choice": "required",
        "parallel_tool_calls": False,
    }
    out = messages_request(body, "m", 100)
    assistant, results = out["messages"][1], out["messages"][2]
    assert assistant == {
        "role": "assistant",
        "content": [
            {"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {"city": "Paris"}},
            {"type": "tool_use", "id": "call_2", "name": "get_weather", "input": {"city": "Rome"}},
        ],
    }
    assert results == {
        "role": "user",
        "content": [
            {"type": "tool_result", "tool_use_id": "call_1", "content": "sunny"},
            {"type": "tool_result", "tool_use_id": "call_2", "content": "rain"},
        ],
    }
    (tool,) = out["tools"]
    assert tool == {
        "name": "get_weather",
        "input_schema": WEATHER["function"]["parameters"],
        "description": "Current weather",
    }
    assert out["tool_choice"] == {"type": "any", "disable_parallel_tool_use": True}


@pytest.mark.parametrize(
    ("choice", "expected"),
    [
        ("auto", {"type": "auto"}),
        ("none", {"type": "none"}),
        ({"type": "function", "function": {"name": "get_weather"}}, {"type": "tool", "name": "get_weather"}),
    ],
)
def test_tool_choice(choice: Any, expected: dict[str, Any]) -> None:
    body = {"messages": [{"role": "user", "content": "x"}], "tools": [WEATHER], "tool_choice": choice}
    assert messages_request(body, "m", 10)["tool_choice"] == expected


def test_images_become_image_blocks() -> None:
    parts = [
        {"type": "text", "text": "What is this?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
        {"type": "image_url", "image_url": {"url": "https://example.test/cat.jpg"}},
    ]
    (turn,) = messages_request({"messages": [{"role": "user", "content": parts}]}, "m", 10)["messages"]
    assert turn["content"][1] == {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="},
    }
    assert turn["content"][2] == {"type": "image", "source": {"type": "url", "url": "https://example.test/cat.jpg"}}


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"n": 2}, "n"),
        ({"logprobs": True}, "logprobs"),
        ({"logit_bias": {"50256": -100}}, "logit_bias"),
        ({"response_format": {"type": "json_object"}}, "response_format"),
    ],
)
def test_what_the_messages_api_cannot_answer_is_refused(extra: dict[str, Any], param: str) -> None:
    with pytest.raises(ProviderRejected) as caught:
        messages_request({"messages": [{"role": "user", "content": "x"}], **extra}, "m", 10)
    assert caught.value.param == param and caught.value.status_code == 400


@pytest.mark.parametrize(
    "message",
    [
        {"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": "not json"}}]},
        {"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": "[1]"}}]},
        {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "content": "orphan"},
        {"role": "function", "content": "legacy"},
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "ftp://x"}}]},
        {"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]},
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:text/html;base64,PGI+"}}]},
    ],
)
def test_hostile_messages_are_client_errors_not_crashes(message: dict[str, Any]) -> None:
    with pytest.raises((InvalidRequest, ProviderRejected)) as caught:
        messages_request({"messages": [message]}, "m", 10)
    assert caught.value.status_code == 400


MESSAGE = {
    "id": "msg_01",
    "type": "message",
    "role": "assistant",
    "model": "claude-x",
    "content": [
        {"type": "text", "text": "Let me check. "},
        {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
    ],
    "stop_reason": "tool_use",
    "stop_sequence": None,
    "usage": {"input_tokens": 10, "output_tokens": 7, "cache_read_input_tokens": 30, "cache_creation_input_tokens": 2},
}


def test_a_messages_reply_becomes_a_chat_completion() -> None:
    out = chat_completion(MESSAGE, 1700000000, "anth")
    (choice,) = out["choices"]
    assert out["id"] == "msg_01" and out["object"] == "chat.completion" and out["created"] == 1700000000
    assert choice["message"]["content"] == "Let me check. "
    assert choice["message"]["tool_calls"] == [
        {"id": "toolu_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    ]
    assert choice["finish_reason"] == "tool_calls"
    assert out["usage"] == {
        "prompt_tokens": 42,
        "completion_tokens": 7,
        "total_tokens": 49,
        "prompt_tokens_details": {"cached_tokens": 30},
    }


@pytest.mark.parametrize(
    ("stop", "finish"),
    [
        ("end_turn", "stop"),
        ("stop_sequence", "stop"),
        ("max_tokens", "length"),
        ("refusal", "content_filter"),
        ("new_one", "stop"),
    ],
)
def test_stop_reasons(stop: str, finish: str) -> None:
    message = {**MESSAGE, "content": [{"type": "text", "text": "x"}], "stop_reason": stop}
    assert chat_completion(message, 0, "anth")["choices"][0]["finish_reason"] == finish


@pytest.mark.parametrize(
    "reply",
    [
        None,
        [],
        {"type": "message"},
        {**MESSAGE, "content": "text"},
        {**MESSAGE, "usage": None},
        {**MESSAGE, "usage": {"input_tokens": -1, "output_tokens": 1}},
        {**MESSAGE, "usage": {"input_tokens": "9", "output_tokens": 1}},
        {**MESSAGE, "content": [{"type": "tool_use", "input": {}}]},
        {**MESSAGE, "content": [{"text": "no type"}]},
    ],
)
def test_a_malformed_reply_is_provider_malformed(reply: Any) -> None:
    with pytest.raises(UpstreamError) as caught:
        chat_completion(reply, 0, "anth")
    assert caught.value.code == "provider_malformed"


def _events(tool: bool) -> list[tuple[str, dict[str, Any]]]:
    block = (
        {"type": "tool_use", "id": "toolu_9", "name": "get_weather", "input": {}}
        if tool
        else {"type": "text", "text": ""}
    )
    deltas = (
        [
            {"type": "input_json_delta", "partial_json": '{"city":'},
            {"type": "input_json_delta", "partial_json": ' "Paris"}'},
        ]
        if tool
        else [{"type": "text_delta", "text": "Hello"}, {"type": "text_delta", "text": " world"}]
    )
    start = {
        "id": "msg_9",
        "type": "message",
        "role": "assistant",
        "model": "claude-x",
        "content": [],
        "usage": {"input_tokens": 5, "output_tokens": 1},
    }
    return [
        ("message_start", {"type": "message_start", "message": start}),
        ("content_block_start", {"type": "content_block_start", "index": 0, "content_block": block}),
        ("ping", {"type": "ping"}),
        *[("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": d}) for d in deltas],
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": "tool_use" if tool else "end_turn"},
                "usage": {"output_tokens": 6},
            },
        ),
        ("message_stop", {"type": "message_stop"}),
    ]


def _translate(events: list[tuple[str, dict[str, Any]]], include_usage: bool) -> tuple[list[dict[str, Any]], bool]:
    translator = ChunkTranslator("anth", 123, include_usage=include_usage)
    chunks = [c for event, data in events for c in translator.feed(event, data)]
    return chunks, translator.done


def test_text_stream_events_become_chat_chunks_with_usage_when_asked() -> None:
    chunks, done = _translate(_events(tool=False), include_usage=True)
    assert done
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]) == "Hello world"
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "stop"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 6
    assert chunks[-1]["usage"]["prompt_tokens"] == 5
    assert {c["id"] for c in chunks} == {"msg_9"} and {c["object"] for c in chunks} == {"chat.completion.chunk"}
    without, _ = _translate(_events(tool=False), include_usage=False)
    assert all(c["choices"] for c in without)


def test_tool_use_stream_becomes_tool_call_deltas() -> None:
    chunks, _ = _translate(_events(tool=True), include_usage=False)
    calls = [c["choices"][0]["delta"]["tool_calls"][0] for c in chunks if c["choices"][0]["delta"].get("tool_calls")]
    assert calls[0] == {
        "index": 0,
        "id": "toolu_9",
        "type": "function",
        "function": {"name": "get_weather", "arguments": ""},
    }
    assert json.loads("".join(c["function"]["arguments"] for c in calls)) == {"city": "Paris"}
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_an_error_event_is_a_stream_error_and_unknown_events_are_ignored() -> None:
    translator = ChunkTranslator("anth", 0, include_usage=False)
    assert translator.feed("brand_new_event", {"type": "brand_new_event", "x": 1}) == []
    assert translator.feed("ping", {"type": "ping"}) == []
    with pytest.raises(UpstreamError) as caught:
        translator.feed("error", {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}})
    assert caught.value.code == "provider_stream_error" and "Overloaded" in caught.value.message


@pytest.mark.parametrize(
    ("event", "data"),
    [
        ("message_start", {"type": "message_start"}),
        ("content_block_start", {"type": "content_block_start", "index": "0", "content_block": {}}),
        ("content_block_delta", {"type": "content_block_delta", "index": 0}),
        (
            "content_block_delta",
            {"type": "content_block_delta", "index": 5, "delta": {"type": "input_json_delta", "partial_json": "{"}},
        ),
        ("x", ["not", "an", "object"]),
    ],
)
def test_malformed_events_are_provider_malformed(event: str, data: Any) -> None:
    with pytest.raises(UpstreamError) as caught:
        ChunkTranslator("anth", 0, include_usage=False).feed(event, data)
    assert caught.value.code == "provider_malformed"
