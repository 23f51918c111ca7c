"""AnthropicProvider against the cloud simulator speaking the Messages API (`api: anthropic`, in
process over httpx.ASGITransport) and against httpx.MockTransport: the OpenAI body goes out as a
Messages body with `x-api-key` and `anthropic-version`, replies and SSE events come back as OpenAI
completions and chunks, every Messages API error becomes its `router.errors` class, and the key
never leaks. The simulator checks bodies the way the Messages API documents them (max_tokens
required, temperature within 0..1, every tool_result answering a tool_use of the turn before)."""

from __future__ import annotations

import json
import logging
import random
from typing import Any

import httpx
import pytest

from bench.cloud_sim import SimSettings, build_app
from bench.cloud_sim.server import CloudSim
from cluster.config.cloud import CloudProvider
from router.errors import ProviderOverloaded, ProviderRateLimited, ProviderRejected, RequestError, UpstreamError
from serve_apps.providers import AnthropicProvider, ProviderReply, provider_for
from serve_apps.providers.anthropic import ANTHROPIC_VERSION

KEY = "sk-ant-test-0123456789-very-secret"
ENV = {"ANTH_KEY": KEY}
ENTRY = {"name": "sim-claude", "snapshot": "sim-claude-1", "context_window": 8192, "tools": True, "region": "eu"}
TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
BODY = {"model": "local-a", "messages": [{"role": "user", "content": "What is the capital of France?"}]}


def provider_config(**overrides: Any) -> CloudProvider:
    fields = {
        "name": "anth",
        "type": "anthropic",
        "base_url": "http://anth.test/v1",
        "api_key_env": "ANTH_KEY",
        "timeout_s": 5,
        "models": {"local-a": ENTRY},
    }
    return CloudProvider(**{**fields, **overrides})


def make_sim(**overrides: Any) -> CloudSim:
    settings = SimSettings(
        **{"api": "anthropic", "models": ("sim-claude",), "ttft_s": 0, "tokens_per_s": 0, "api_key": KEY, **overrides}
    )
    return build_app(settings, rng=random.Random(3)).state.cloud_sim


def over_sim(sim: CloudSim, **options: Any) -> AnthropicProvider:
    transport = httpx.ASGITransport(app=sim.app, raise_app_exceptions=False)
    provider = provider_for(provider_config(), transport=transport, env=ENV, clock=lambda: 1700000000.0, **options)
    assert isinstance(provider, AnthropicProvider)
    return provider


async def collect(reply: ProviderReply) -> list[dict[str, Any]]:
    assert reply.chunks is not None and reply.body is None
    events = [event async for event in reply.chunks]
    assert events[-1] == "data: [DONE]\n\n"
    return [json.loads(e.removeprefix("data: ")) for e in events[:-1]]


async def test_json_reply_is_an_openai_completion() -> None:
    async with over_sim(make_sim()) as provider:
        reply = await provider.chat("local-a", dict(BODY), "req-1")
    assert reply.body is not None and reply.chunks is None
    (choice,) = reply.body["choices"]
    assert choice["message"]["content"].startswith("[cloud-sim:sim-claude] What is the capital")
    assert choice["finish_reason"] == "stop" and reply.body["object"] == "chat.completion"
    assert reply.body["created"] == 1700000000 and reply.body["id"].startswith("msg_")
    assert reply.body["usage"]["completion_tokens"] > 0 and reply.body["usage"]["prompt_tokens"] == 6


async def test_the_request_on_the_wire_is_a_messages_request() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        message = {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "model": "sim-claude",
            "content": [{"type": "text", "text": "Paris"}],
            "stop_reason": "end_turn",
            "usage": {"input_tokens": 3, "output_tokens": 1},
        }
        return httpx.Response(200, json=message, headers={"request-id": "req_x"})

    body = {**BODY, "messages": [{"role": "system", "content": "Be brief."}, *BODY["messages"]], "user": "u1"}
    provider = provider_for(provider_config(), transport=httpx.MockTransport(handler), env=ENV)
    async with provider:
        reply = await provider.chat("local-a", body, "req-7", extra_headers={"x-spillover-attempt": "2"})
    (request,) = seen
    assert request.url.path == "/v1/messages"
    assert request.headers["x-api-key"] == KEY and "authorization" not in request.headers
    assert request.headers["anthropic-version"] == ANTHROPIC_VERSION
    assert request.headers["x-request-id"] == "req-7" and request.headers["x-spillover-attempt"] == "2"
    sent = json.loads(request.content)
    assert sent["model"] == "sim-claude" and sent["system"] == "Be brief." and sent["max_tokens"] == 4096
    assert "user" not in sent and sent["messages"][0]["role"] == "user"
    assert reply.body is not None and reply.body["choices"][0]["message"]["content"] == "Paris"


async def test_streamed_reply_has_the_same_text_and_usage_when_asked() -> None:
    sim = make_sim()
    async with over_sim(sim) as provider:
        whole = await provider.chat("local-a", dict(BODY), "r1")
        reply = await provider.chat(
            "local-a", {**BODY, "stream": True, "stream_options": {"include_usage": True}}, "r2"
        )
        chunks = await collect(reply)
    assert reply.headers["content-type"].startswith("text/event-stream")
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert whole.body is not None and text == whole.body["choices"][0]["message"]["content"]
    assert chunks[-1]["usage"] == whole.body["usage"]


async def test_tool_calls_round_trip_through_tool_use_and_tool_result() -> None:
    async with over_sim(make_sim()) as provider:
        body = {**BODY, "tools": [TOOL], "tool_choice": "required", "max_tokens": 50}
        first = await provider.chat("local-a", body, "t1")
        assert first.body is not None
        message = first.body["choices"][0]["message"]
        (call,) = message["tool_calls"]
        assert first.body["choices"][0]["finish_reason"] == "tool_calls"
        assert call["function"]["name"] == "get_weather" and "city" in json.loads(call["function"]["arguments"])
        follow_up = {
            **body,
            "tool_choice": "auto",
            "messages": [*body["messages"], message, {"role": "tool", "tool_call_id": call["id"], "content": "sunny"}],
        }
        second = await provider.chat("local-a", follow_up, "t2")  # the sim checks the tool_result's id
        streamed = await collect(await provider.chat("local-a", {**body, "stream": True}, "t3"))
    assert second.body is not None and second.body["choices"][0]["message"]["content"]
    deltas = [c["choices"][0]["delta"]["tool_calls"][0] for c in streamed if c["choices"][0]["delta"].get("tool_calls")]
    assert deltas[0]["function"]["name"] == "get_weather"
    assert json.loads("".join(d["function"]["arguments"] for d in deltas)) == json.loads(call["function"]["arguments"])


async def test_a_tool_result_for_an_unknown_call_is_rejected_like_the_messages_api_does() -> None:
    body = {
        **BODY,
        "messages": [
            *BODY["messages"],
            {"role": "assistant", "tool_calls": [{"id": "a", "function": {"name": "f", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "b", "content": "x"},
        ],
    }
    async with over_sim(make_sim()) as provider:
        with pytest.raises(ProviderRejected) as caught:
            await provider.chat("local-a", body, "x")
    assert caught.value.status_code == 400 and "tool_use_id" in caught.value.message


@pytest.mark.parametrize(
    ("settings", "error_type", "code", "status"),
    [
        ({"rate_limit_rate": 1.0, "retry_after_s": 7}, ProviderRateLimited, "provider_rate_limited", 429),
        ({"malformed_rate": 1.0}, UpstreamError, "provider_malformed", 502),
        ({"timeout_rate": 1.0, "hang_s": 0}, UpstreamError, "provider_timeout", 503),
    ],
)
async def test_faults_become_spillover_errors(
    settings: dict[str, Any], error_type: type[RequestError], code: str, status: int
) -> None:
    async with over_sim(make_sim(**settings)) as provider:
        with pytest.raises(error_type) as caught:
            await provider.chat("local-a", dict(BODY), "f")
    assert caught.value.code == code and caught.value.status_code == status
    if code == "provider_rate_limited":
        assert isinstance(caught.value, ProviderRateLimited) and caught.value.retry_after_s == 7


async def test_a_midstream_cut_ends_the_translated_stream_with_provider_cut() -> None:
    async with over_sim(make_sim(midstream_cut_rate=1.0)) as provider:
        reply = await provider.chat("local-a", {**BODY, "stream": True}, "c")
        assert reply.chunks is not None
        received = []
        with pytest.raises(UpstreamError) as caught:
            async for event in reply.chunks:
                received.append(event)
    assert caught.value.code == "provider_cut" and len(received) >= 2  # the role chunk and a token came first


async def test_server_errors_are_529_overloaded_or_500_api_error() -> None:
    sim = make_sim(error_5xx_rate=1.0, retry_after_s=4)
    seen: set[str] = set()
    async with over_sim(sim) as provider:
        for i in range(12):
            with pytest.raises(UpstreamError) as caught:
                await provider.chat("local-a", dict(BODY), f"e{i}")
            seen.add(caught.value.code or "")
            if isinstance(caught.value, ProviderOverloaded):
                assert caught.value.status_code == 503
    assert seen == {"provider_overloaded", "provider_error"}


@pytest.mark.parametrize(
    ("status", "body", "headers", "code", "http"),
    [
        (
            529,
            {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}},
            {"retry-after": "3"},
            "provider_overloaded",
            503,
        ),
        (
            429,
            {"type": "error", "error": {"type": "rate_limit_error", "message": "slow"}},
            {"retry-after": "2"},
            "provider_rate_limited",
            429,
        ),
        (
            400,
            {"type": "error", "error": {"type": "invalid_request_error", "message": "max_tokens: bad"}},
            {},
            "provider_rejected",
            400,
        ),
        (
            404,
            {"type": "error", "error": {"type": "not_found_error", "message": "model: x"}},
            {},
            "provider_rejected",
            404,
        ),
        (
            413,
            {"type": "error", "error": {"type": "request_too_large", "message": "big"}},
            {},
            "provider_rejected",
            400,
        ),
        (
            401,
            {"type": "error", "error": {"type": "authentication_error", "message": "invalid x-api-key"}},
            {},
            "provider_auth_failed",
            502,
        ),
        (
            402,
            {"type": "error", "error": {"type": "billing_error", "message": "credit"}},
            {},
            "provider_auth_failed",
            502,
        ),
        (504, {"type": "error", "error": {"type": "timeout_error", "message": "slow"}}, {}, "provider_timeout", 503),
        (500, {"type": "error", "error": {"type": "api_error", "message": "oops"}}, {}, "provider_error", 502),
        (500, "<html>bad gateway</html>", {}, "provider_error", 502),
    ],
)
async def test_every_messages_api_error_is_translated_at_one_place(
    status: int, body: Any, headers: dict[str, str], code: str, http: int
) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        content = json.dumps(body) if not isinstance(body, str) else body
        return httpx.Response(status, content=content, headers=headers)

    async with provider_for(provider_config(), transport=httpx.MockTransport(handler), env=ENV) as provider:
        with pytest.raises(RequestError) as caught:
            await provider.chat("local-a", dict(BODY), "x")
    assert caught.value.code == code and caught.value.status_code == http
    if "retry-after" in headers:
        assert getattr(caught.value, "retry_after_s", None) == float(headers["retry-after"])


async def test_an_error_event_mid_stream_and_an_early_end_are_stream_errors() -> None:
    start = {
        "type": "message_start",
        "message": {"id": "m", "type": "message", "model": "x", "content": [], "usage": {}},
    }
    base = f"event: message_start\ndata: {json.dumps(start)}\n\n"
    error = {"type": "error", "error": {"type": "overloaded_error", "message": f"Overloaded ({KEY})"}}
    bodies = {
        "provider_stream_error": base + f"event: error\ndata: {json.dumps(error)}\n\n",
        "provider_cut": base,
        "provider_malformed": base + "event: ping\ndata: {not json\n\n",
    }
    for code, text in bodies.items():

        def handler(request: httpx.Request, text: str = text) -> httpx.Response:
            return httpx.Response(200, content=text, headers={"content-type": "text/event-stream"})

        async with provider_for(provider_config(), transport=httpx.MockTransport(handler), env=ENV) as provider:
            reply = await provider.chat("local-a", {**BODY, "stream": True}, "s")
            assert reply.chunks is not None
            with pytest.raises(UpstreamError) as caught:
                async for _ in reply.chunks:
                    pass
        assert caught.value.code == code
        assert KEY not in caught.value.message and KEY not in str(caught.value)


async def test_a_wrong_key_is_auth_failed_and_never_printed(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    sim = make_sim()
    transport = httpx.ASGITransport(app=sim.app, raise_app_exceptions=False)
    wrong = "sk-ant-wrong-key-must-not-leak"
    provider = provider_for(provider_config(), transport=transport, env={"ANTH_KEY": wrong})
    async with provider:
        with pytest.raises(UpstreamError) as caught:
            await provider.chat("local-a", dict(BODY), "k")
        with pytest.raises(UpstreamError) as probed:
            await provider.probe()
    assert caught.value.code == probed.value.code == "provider_auth_failed"
    text = caught.value.message + probed.value.message + caplog.text + repr(provider)
    assert wrong not in text and KEY not in text


async def test_probe_lists_models_with_our_key() -> None:
    async with over_sim(make_sim()) as provider:
        await provider.probe()


async def test_rate_limit_headers_are_handed_to_the_observer() -> None:
    seen: list[tuple[str, dict[str, str]]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        headers = {"anthropic-ratelimit-requests-remaining": "0", "retry-after": "1"}
        return httpx.Response(
            429, json={"type": "error", "error": {"type": "rate_limit_error", "message": "x"}}, headers=headers
        )

    transport = httpx.MockTransport(handler)
    provider = provider_for(
        provider_config(), transport=transport, env=ENV, on_headers=lambda n, h: seen.append((n, dict(h)))
    )
    async with provider:
        with pytest.raises(ProviderRateLimited):
            await provider.chat("local-a", dict(BODY), "x")
    ((name, headers),) = seen
    assert name == "anth" and headers["anthropic-ratelimit-requests-remaining"] == "0"


def test_json_schema_on_an_anthropic_entry_is_a_config_error() -> None:
    with pytest.raises(ValueError, match="json_schema"):
        provider_config(models={"local-a": {**ENTRY, "json_schema": True}})
