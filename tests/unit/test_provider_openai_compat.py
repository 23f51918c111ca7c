"""OpenAICompatProvider against the cloud simulator (in-process, httpx.ASGITransport) and
against httpx.MockTransport for transport failures: replies, alias mapping, error translation
into router.errors, and the API key never leaking."""

from __future__ import annotations

import json
import logging
import random
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from bench.cloud_sim import SimSettings, build_app
from bench.cloud_sim.server import CloudSim
from cluster.config.cloud import CloudProvider
from router.errors import (
    ModelNotFound,
    ProviderRateLimited,
    ProviderRejected,
    RequestError,
    TargetUnavailable,
    UpstreamError,
)
from serve_apps.providers import OpenAICompatProvider, ProviderReply
from serve_apps.providers.openai_compat import retry_after_s, status_error

KEY = "sk-test-0123456789-very-secret"
ENV = {"SIM_KEY": KEY}
BODY = {"model": "local-a", "messages": [{"role": "user", "content": "What is the capital of France?"}]}


def provider_config(**overrides: Any) -> CloudProvider:
    fields = {
        "name": "sim",
        "base_url": "http://sim.test/v1",
        "api_key_env": "SIM_KEY",
        "timeout_s": 5,
        "models": {"local-a": "sim-a", "local-ghost": "ghost-model"},
    }
    return CloudProvider(**{**fields, **overrides})


def make_sim(log_path: Path | None = None, **overrides: Any) -> CloudSim:
    settings = SimSettings(**{"models": ("sim-a",), "ttft_s": 0, "tokens_per_s": 0, "api_key": KEY, **overrides})
    return build_app(settings, rng=random.Random(3), log_path=log_path).state.cloud_sim


def over_sim(sim: CloudSim, env: dict[str, str] = ENV, **overrides: Any) -> OpenAICompatProvider:
    transport = httpx.ASGITransport(app=sim.app, raise_app_exceptions=False)
    return OpenAICompatProvider(provider_config(**overrides), transport=transport, env=env)


def over_handler(handler: Callable[[httpx.Request], httpx.Response]) -> OpenAICompatProvider:
    return OpenAICompatProvider(provider_config(), transport=httpx.MockTransport(handler), env=ENV)


async def collect(reply: ProviderReply) -> list[str]:
    assert reply.chunks is not None and reply.body is None
    return [event async for event in reply.chunks]


def text_of(events: list[str]) -> str:
    chunks = [json.loads(e.removeprefix("data: ")) for e in events if e != "data: [DONE]\n\n"]
    return "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])


async def test_json_reply_maps_the_alias_and_sends_the_request_id(tmp_path: Path) -> None:
    log_path = tmp_path / "sim.jsonl"
    body = dict(BODY)
    async with over_sim(make_sim(log_path)) as provider:
        reply = await provider.chat("local-a", body, "req-1", extra_headers={"x-spillover-attempt": "1"})
    assert reply.status == 200 and reply.chunks is None and reply.body is not None
    assert reply.body["choices"][0]["message"]["content"].startswith("[cloud-sim:sim-a] What is")
    assert reply.headers["x-request-id"] == "sim-000001"
    assert body == BODY  # the caller's body is not rewritten in place
    (record,) = [json.loads(line) for line in log_path.read_text().splitlines()]
    assert record["model"] == "sim-a" and record["status"] == 200
    assert record["headers"] == {"x-request-id": "req-1", "x-spillover-attempt": "1"}


async def test_stream_reply_passes_events_through_to_done() -> None:
    async with over_sim(make_sim()) as provider:
        plain = await provider.chat("local-a", BODY, "req-1")
        reply = await provider.chat("local-a", {**BODY, "stream": True}, "req-2")
        events = await collect(reply)
    assert reply.headers["content-type"].startswith("text/event-stream")
    assert events[-1] == "data: [DONE]\n\n"
    assert all(e.startswith("data: ") and e.endswith("\n\n") for e in events)
    assert plain.body is not None
    assert text_of(events) == plain.body["choices"][0]["message"]["content"]


async def test_rate_limit_becomes_provider_rate_limited_with_retry_after() -> None:
    async with over_sim(make_sim(rate_limit_rate=1.0, retry_after_s=2.5)) as provider:
        with pytest.raises(ProviderRateLimited) as caught:
            await provider.chat("local-a", BODY, "req-1")
    error = caught.value
    assert isinstance(error, TargetUnavailable)
    assert error.status_code == 429 and error.code == "provider_rate_limited" and error.retry_after_s == 2.5


async def test_capacity_429_is_rate_limited_too() -> None:
    sim = make_sim(max_concurrency=1, retry_after_s=1)
    sim.inflight = 1  # one request already holds the only slot
    async with over_sim(sim) as provider:
        with pytest.raises(ProviderRateLimited) as caught:
            await provider.chat("local-a", BODY, "req-1")
    assert caught.value.retry_after_s == 1.0 and "capacity" in caught.value.message


@pytest.mark.parametrize("fault", [{"error_5xx_rate": 1.0}, {"timeout_rate": 1.0, "hang_s": 0}])
async def test_server_errors_become_upstream_errors(fault: dict[str, float]) -> None:
    async with over_sim(make_sim(**fault)) as provider:
        with pytest.raises(UpstreamError) as caught:
            await provider.chat("local-a", BODY, "req-1")
    assert type(caught.value) is UpstreamError
    assert caught.value.status_code == 502 and caught.value.code == "provider_error"


async def test_malformed_replies_are_provider_malformed() -> None:
    # a stream's single malformed event between valid ones is skipped instead (test_stream_tolerance.py)
    async with over_sim(make_sim(malformed_rate=1.0)) as provider:
        with pytest.raises(UpstreamError) as caught:
            reply = await provider.chat("local-a", BODY, "req-1")
            await collect(reply)
    assert caught.value.code == "provider_malformed" and caught.value.status_code == 502


async def test_midstream_cut_makes_the_iterator_raise() -> None:
    async with over_sim(make_sim(midstream_cut_rate=1.0)) as provider:
        reply = await provider.chat("local-a", {**BODY, "stream": True}, "req-1")
        assert reply.chunks is not None
        received = []
        with pytest.raises(UpstreamError) as caught:
            async for event in reply.chunks:
                received.append(event)
    assert received and "data: [DONE]\n\n" not in received
    assert caught.value.code == "provider_cut"


async def test_provider_4xx_keeps_its_message_and_status() -> None:
    async with over_sim(make_sim()) as provider:
        with pytest.raises(ProviderRejected) as unknown_model:
            await provider.chat("local-ghost", BODY, "req-1")
        with pytest.raises(ProviderRejected) as bad_body:
            await provider.chat("local-a", {**BODY, "messages": []}, "req-2")
    assert unknown_model.value.status_code == 404 and "ghost-model" in unknown_model.value.message
    assert bad_body.value.status_code == 400 and bad_body.value.param == "messages"
    assert bad_body.value.code == "provider_rejected"


async def test_unmapped_alias_is_model_not_found_before_any_request(tmp_path: Path) -> None:
    log_path = tmp_path / "sim.jsonl"
    async with over_sim(make_sim(log_path)) as provider:
        with pytest.raises(ModelNotFound, match="local-b"):
            await provider.chat("local-b", BODY, "req-1")
    assert not log_path.exists()


async def test_missing_key_variable_fails_at_call_time(caplog: pytest.LogCaptureFixture) -> None:
    provider = over_sim(make_sim(), env={})  # constructing it is fine
    async with provider:
        with pytest.raises(TargetUnavailable) as caught:
            await provider.chat("local-a", BODY, "req-1")
    assert caught.value.code == "provider_not_configured"
    assert "SIM_KEY" not in caught.value.message  # the client's message names no environment variable
    assert "SIM_KEY" in caplog.text  # the operator's log does


async def test_no_key_variable_sends_no_authorization() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={"choices": []})

    provider = OpenAICompatProvider(provider_config(api_key_env=None), transport=httpx.MockTransport(handler), env={})
    async with provider:
        await provider.chat("local-a", BODY, "req-1", extra_headers={"Authorization": "Bearer smuggled"})
    assert "authorization" not in seen[0].headers
    assert str(seen[0].url) == "http://sim.test/v1/chat/completions"


async def test_wrong_key_is_an_auth_failure_without_provider_text() -> None:
    async with over_sim(make_sim(), env={"SIM_KEY": "sk-wrong"}) as provider:
        with pytest.raises(UpstreamError) as caught:
            await provider.chat("local-a", BODY, "req-1")
    assert caught.value.code == "provider_auth_failed" and "sk-wrong" not in caught.value.message


async def test_the_key_never_leaks(caplog: pytest.LogCaptureFixture) -> None:
    def echo_key(request: httpx.Request) -> httpx.Response:
        leaked = request.headers["authorization"]
        return httpx.Response(400, json={"error": {"message": f"bad request from {leaked}", "param": None}})

    caplog.set_level(logging.DEBUG)
    provider = over_handler(echo_key)
    async with provider:
        with pytest.raises(ProviderRejected) as caught:
            await provider.chat("local-a", BODY, "req-1")
    assert "bad request from Bearer [redacted]" in caught.value.message
    for text in (repr(provider), str(caught.value), json.dumps(caught.value.to_openai()), caplog.text):
        assert KEY not in text


@pytest.mark.parametrize(
    ("failure", "code"),
    [
        (httpx.ConnectError("connection refused"), "provider_unreachable"),
        (httpx.ConnectTimeout("connect timed out"), "provider_timeout"),
        (httpx.ReadTimeout("read timed out"), "provider_timeout"),
        (httpx.RemoteProtocolError("server disconnected without sending a response"), "provider_unreachable"),
    ],
)
async def test_failures_before_a_response_are_target_unavailable(failure: Exception, code: str) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise failure

    async with over_handler(handler) as provider:
        with pytest.raises(TargetUnavailable) as caught:
            await provider.chat("local-a", BODY, "req-1")
    assert type(caught.value) is TargetUnavailable
    assert caught.value.status_code == 503 and caught.value.code == code


class _Body(httpx.AsyncByteStream):
    def __init__(self, parts: list[bytes], fail: bool = False) -> None:
        self.parts = parts
        self.fail = fail
        self.closed = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for part in self.parts:
            yield part
        if self.fail:
            raise httpx.ReadError("connection reset by peer")

    async def aclose(self) -> None:
        self.closed = True


def sse_handler(body: _Body) -> Callable[[httpx.Request], httpx.Response]:
    return lambda request: httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=body)


async def test_connection_lost_mid_stream_is_provider_cut() -> None:
    body = _Body([b'data: {"choices": []}\n\n'], fail=True)
    async with over_handler(sse_handler(body)) as provider:
        reply = await provider.chat("local-a", {**BODY, "stream": True}, "req-1")
        with pytest.raises(UpstreamError) as caught:
            await collect(reply)
    assert caught.value.code == "provider_cut" and body.closed


async def test_sse_parsing_skips_comments_joins_lines_and_reports_error_events() -> None:
    parts = [
        b": keep-alive\n\n",
        b'data: {"choices":\ndata: []}\r\n\r\n',
        b'data: {"error": {"message": "overloaded"}}\n\n',
    ]
    async with over_handler(sse_handler(_Body(parts))) as provider:
        reply = await provider.chat("local-a", {**BODY, "stream": True}, "req-1")
        assert reply.chunks is not None
        assert await reply.chunks.__anext__() == 'data: {"choices":[]}\n\n'
        with pytest.raises(UpstreamError) as caught:
            await reply.chunks.__anext__()
    assert caught.value.code == "provider_stream_error" and "overloaded" in caught.value.message


async def test_abandoned_stream_closes_its_response() -> None:
    body = _Body([b"data: [DONE]\n\n"])
    async with over_handler(sse_handler(body)) as provider:
        reply = await provider.chat("local-a", {**BODY, "stream": True}, "req-1")
        assert reply.chunks is not None
        await reply.chunks.aclose()
    assert body.closed


async def test_a_json_answer_to_a_stream_request_is_malformed() -> None:
    async with over_handler(lambda request: httpx.Response(200, json={"choices": []})) as provider:
        with pytest.raises(UpstreamError) as caught:
            await provider.chat("local-a", {**BODY, "stream": True}, "req-1")
    assert caught.value.code == "provider_malformed"


@pytest.mark.parametrize(
    ("status", "kind", "client_status", "code"),
    [
        (400, ProviderRejected, 400, "provider_rejected"),
        (404, ProviderRejected, 404, "provider_rejected"),
        (409, ProviderRejected, 400, "provider_rejected"),
        (422, ProviderRejected, 422, "provider_rejected"),
        (401, UpstreamError, 502, "provider_auth_failed"),
        (403, UpstreamError, 502, "provider_auth_failed"),
        (408, TargetUnavailable, 503, "provider_timeout"),
        (429, ProviderRateLimited, 429, "provider_rate_limited"),
        (500, UpstreamError, 502, "provider_error"),
        (503, UpstreamError, 502, "provider_error"),
        (302, UpstreamError, 502, "provider_error"),
    ],
)
def test_status_translation_table(status: int, kind: type[RequestError], client_status: int, code: str) -> None:
    content = json.dumps({"error": {"message": "no", "type": "x", "param": "p", "code": "c"}}).encode()
    error = status_error("p", status, {}, content, lambda text: text)
    assert type(error) is kind and error.status_code == client_status and error.code == code
    assert error.to_openai()["error"]["code"] == code


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"retry-after": "3"}, 3.0),
        ({"retry-after": "0.5", "retry-after-ms": "250"}, 0.25),
        ({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}, None),
        ({"retry-after": "-1"}, None),
        ({}, None),
    ],
)
def test_retry_after_parsing(headers: dict[str, str], expected: float | None) -> None:
    assert retry_after_s(headers) == expected
