"""Tolerant stream parsing (serve_apps/providers/tolerance.py) in both provider adapters, against the
cloud simulator's stream faults (a malformed event inserted between valid ones, a stream without
`[DONE]` / message_stop) and hand-made streams for what must stay an error (two malformed events,
one before any valid event or right before the end, an end before any finish_reason)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from router.errors import UpstreamError
from serve_apps.providers import ProviderReply
from serve_apps.providers.anthropic import AnthropicEventStream
from serve_apps.providers.sse import ProviderEventStream
from serve_apps.providers.tolerance import StreamTolerance
from tests.unit import test_provider_anthropic as anth
from tests.unit import test_provider_openai_compat as oai

DONE = "data: [DONE]\n\n"
STREAM = {**oai.BODY, "stream": True, "stream_options": {"include_usage": True}}


async def events_of(reply: ProviderReply) -> list[str]:
    assert reply.chunks is not None
    return [event async for event in reply.chunks]


def text_of(events: list[str]) -> str:
    return oai.text_of(events)


async def openai_stream(**sim: Any) -> tuple[list[str], ProviderEventStream]:
    async with oai.over_sim(oai.make_sim(**sim)) as provider:
        reply = await provider.chat("local-a", STREAM, "req-1")
        events = await events_of(reply)
    assert isinstance(reply.chunks, ProviderEventStream)
    return events, reply.chunks


async def test_one_malformed_event_between_valid_ones_is_skipped_and_counted() -> None:
    clean, _ = await openai_stream()
    events, stream = await openai_stream(malformed_event_rate=1.0)
    assert events[-1] == DONE and text_of(events) == text_of(clean)  # nothing lost, nothing added
    assert stream.tolerance.repairs == {"skipped_events": 1}
    assert json.loads(events[-2].removeprefix("data: "))["usage"]["completion_tokens"] > 0


async def test_a_replaced_token_event_is_skipped_too_and_the_record_can_say_so() -> None:
    clean, _ = await openai_stream()
    events, stream = await openai_stream(malformed_rate=1.0)  # the simulator replaced the first token event
    assert events[-1] == DONE and text_of(clean).endswith(text_of(events)) and text_of(events) != text_of(clean)
    assert stream.tolerance.repairs == {"skipped_events": 1}


async def test_a_stream_with_its_finish_reason_but_no_done_is_finalised_with_its_usage() -> None:
    clean, _ = await openai_stream()
    events, stream = await openai_stream(no_done_rate=1.0)
    assert events == clean  # the same events, [DONE] added by the gateway
    assert stream.tolerance.repairs == {"done_missing": 1}


def _handler(text: str) -> Any:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=text, headers={"content-type": "text/event-stream"})

    return handler


def _chunk(content: str | None = None, finish: str | None = None) -> str:
    delta = {} if content is None else {"content": content}
    body = {
        "id": "c",
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    return f"data: {json.dumps(body)}\n\n"


BAD = "data: {not json\n\n"


def _tool(arguments: str) -> str:
    call = {"index": 0, "function": {"arguments": arguments}}
    body = {"id": "c", "choices": [{"index": 0, "delta": {"tool_calls": [call]}, "finish_reason": None}]}
    return f"data: {json.dumps(body)}\n\n"


AMBIGUOUS = {
    "two malformed events": _chunk("a") + BAD + _chunk("b") + BAD + _chunk("c") + _chunk(None, "stop") + DONE,
    "two in a row": _chunk("a") + BAD + BAD + _chunk("b") + _chunk(None, "stop") + DONE,
    "before any valid event": BAD + _chunk("a") + _chunk(None, "stop") + DONE,
    "right before the end": _chunk("a") + _chunk(None, "stop") + BAD,
    "an error object": _chunk("a") + 'data: {"error": {"message": "boom"}}\n\n' + _chunk(None, "stop") + DONE,
    "an end before any finish_reason": _chunk("a") + _chunk("b"),
    "in a tool call": _tool('{"a"') + BAD + _tool(": 1}") + _chunk(None, "tool_calls") + DONE,
    "before a tool call": _chunk("") + BAD + _tool('{"a": 1}') + _chunk(None, "tool_calls") + DONE,
}


@pytest.mark.parametrize("name", list(AMBIGUOUS))
async def test_what_is_ambiguous_still_fails_the_stream(name: str) -> None:
    async with oai.over_handler(_handler(AMBIGUOUS[name])) as provider:
        reply = await provider.chat("local-a", STREAM, "req-1")
        with pytest.raises(UpstreamError) as caught:
            await events_of(reply)
    expected = {"an error object": "provider_stream_error", "an end before any finish_reason": "provider_cut"}
    assert caught.value.code == expected.get(name, "provider_malformed")


async def test_a_connection_lost_after_the_finish_reason_is_complete() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        async def body() -> Any:
            yield (_chunk("a") + _chunk(None, "stop")).encode()
            raise httpx.ReadError("connection reset")

        return httpx.Response(200, content=body(), headers={"content-type": "text/event-stream"})

    async with oai.over_handler(handler) as provider:
        reply = await provider.chat("local-a", STREAM, "req-1")
        events = await events_of(reply)
    assert events[-1] == DONE and text_of(events) == "a"


def test_the_tolerance_rules_alone() -> None:
    tolerance = StreamTolerance()
    error = UpstreamError("bad", code="provider_malformed")
    with pytest.raises(UpstreamError):
        tolerance.malformed(error)  # nothing valid yet
    tolerance.valid({"choices": [{"delta": {"content": "a"}}]})
    tolerance.malformed(error)
    tolerance.valid({"choices": [{"delta": {}, "finish_reason": "stop"}]})
    tolerance.ended(UpstreamError("cut", code="provider_cut"))
    assert tolerance.repairs == {"skipped_events": 1, "done_missing": 1}


async def test_the_messages_api_stream_tolerates_the_same() -> None:
    async def anthropic_stream(**sim: Any) -> tuple[list[dict[str, Any]], AnthropicEventStream]:
        async with anth.over_sim(anth.make_sim(**sim)) as provider:
            reply = await provider.chat("local-a", STREAM, "req-1")
            chunks = await anth.collect(reply)
        assert isinstance(reply.chunks, AnthropicEventStream)
        return chunks, reply.chunks

    clean, _ = await anthropic_stream()
    for fault, repair in (("malformed_event_rate", "skipped_events"), ("no_done_rate", "done_missing")):
        chunks, stream = await anthropic_stream(**{fault: 1.0})
        assert chunks == clean, fault  # the same text, finish_reason and usage chunk
        assert stream.tolerance.repairs == {repair: 1}
