"""A hostile or broken provider's reply through the gateway's real HTTP layer: a 1 GiB body, an endless
body, an SSE event (or line) that never ends, JSON nested past Python's recursion limit or holding a lone
surrogate. The gateway reads at most `cloud.providers[].max_reply_bytes`, and the request fails over to
the next provider (a clean provider error, never a 500), within a bounded time.

Stand-ins: FakeEngine as the saturated local model (so requests burst), and two providers reached over
`httpx.MockTransport`: `bad` streams its hostile body from a generator that counts what it produced (what
a real server would send down the socket: the gateway stops pulling, so the generator stops), `good`
answers like OpenAI's chat endpoint. Everything else is the real code: adapters, dispatcher, HTTP app.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from cluster.config.deployment import dump_config, load_config, parse_config
from router.errors import InvalidRequest
from router.routing.snapshot import ClusterSnapshot, ReplicaStats
from serve_apps.clocks import Clocks
from serve_apps.dispatch.dispatcher import Dispatcher
from serve_apps.gateway_parts import EdgeSettings, GatewayParts
from serve_apps.http.surface import GatewayHTTP, ServedModel
from serve_apps.providers import OpenAICompatProvider
from serve_apps.providers.anthropic_wire import messages_request
from tests.fakes import FakeEngine
from tests.unit.security_gateway import BOUND_S, CHAT, MODEL, REPO, completion

LIMIT = 256 * 1024  # max_reply_bytes of the bad provider
CHUNK = 64 * 1024
GiB = 1024**3


@dataclass
class Hostile:
    """A response body produced lazily, counting the bytes it was asked for."""

    parts: Callable[[], AsyncIterator[bytes]]
    headers: dict[str, str] = field(default_factory=dict)
    produced: int = 0

    def handler(self, request: httpx.Request) -> httpx.Response:
        async def body() -> AsyncIterator[bytes]:
            async for part in self.parts():
                self.produced += len(part)
                yield part

        return httpx.Response(200, headers=self.headers, content=body())


def endless(first: bytes, then: bytes) -> Callable[[], AsyncIterator[bytes]]:
    async def parts() -> AsyncIterator[bytes]:
        yield first
        while True:
            yield then

    return parts


def once(text: bytes) -> Callable[[], AsyncIterator[bytes]]:
    async def parts() -> AsyncIterator[bytes]:
        yield text

    return parts


def build(bad: Callable[[httpx.Request], httpx.Response]) -> tuple[httpx.AsyncClient, Dispatcher]:
    raw = dump_config(load_config(REPO / "configs/local.yaml"))
    sim = raw["cloud"]["providers"][0]
    dear = {**sim["models"][MODEL], "price_in_per_mtok": 9}
    raw["cloud"]["providers"] = [
        {**sim, "name": "bad", "enabled": True, "api_key_env": None, "max_reply_bytes": LIMIT},
        {
            **sim,
            "name": "good",
            "enabled": True,
            "api_key_env": None,
            "models": {MODEL: dear},  # dearer: the cost strategy tries `bad` first
        },
    ]
    raw["resilience"] = {"retry": {"max_attempts": 3, "backoff_base_s": 0.001}, "probes": False}
    cfg = parse_config(raw, "test")
    handlers = {"bad": bad, "good": completion}
    providers = {
        p.name: OpenAICompatProvider(p, transport=httpx.MockTransport(handlers[p.name]), env={})
        for p in cfg.cloud.providers
    }
    replica = ReplicaStats(MODEL, "r1", "n1", 0.0, 0.99, 0, 0, 0, 0, 364, 128)  # saturated: bursts
    snapshot = ClusterSnapshot(taken_at=0.0, replicas=(replica,), max_age_s=1e12)
    local = FakeEngine(answer="local")
    dispatcher = Dispatcher(cfg, local, providers, lambda: snapshot, poll_s=0.001, clocks=Clocks.of(lambda: 0.0))
    http = GatewayHTTP(
        local,
        [ServedModel(MODEL, "llama", "cpu", 4096)],
        dispatcher,
        created=1,
        edge=EdgeSettings(request_timeout_s=BOUND_S),
        parts=GatewayParts(policy=cfg.policy, decisions=dispatcher.decisions),
    )
    transport = httpx.ASGITransport(app=http.app, raise_app_exceptions=False)
    return httpx.AsyncClient(transport=transport, base_url="http://gw", timeout=BOUND_S), dispatcher


def cheap(request_id: str) -> dict[str, str]:
    return {"x-business-scenario": "cheap", "x-request-id": request_id}  # cost strategy: `bad` first


async def _post(bad: Hostile, body: dict[str, Any], request_id: str) -> tuple[httpx.Response, Dispatcher]:
    client, dispatcher = build(bad.handler)
    async with client:
        response = await client.post("/v1/chat/completions", json=body, headers=cheap(request_id))
    return response, dispatcher


def _errors(dispatcher: Dispatcher, request_id: str) -> list[tuple[str, str | None]]:
    record = dispatcher.decisions.get(request_id)
    assert record is not None
    return [(a.target, a.error) for a in record.attempts]


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "bad",
    [
        Hostile(endless(b"", b"x" * CHUNK), {"content-length": str(GiB), "content-type": "application/json"}),
        Hostile(endless(b'{"choices": [{"message": {"content": "', b"a" * CHUNK), {"content-type": "application/json"}),
    ],
    ids=["1_GiB_declared", "endless_chunked"],
)
async def test_provider_reply_size_bounded_and_fails_over(bad: Hostile) -> None:
    started = time.monotonic()
    response, dispatcher = await _post(bad, CHAT, "big-1")
    assert response.status_code == 200, response.text
    assert response.headers["x-spillover-target"] == "cloud:good"
    assert _errors(dispatcher, "big-1")[0] == (f"cloud:bad/{MODEL}", "provider_reply_too_large")
    assert bad.produced <= LIMIT + 2 * CHUNK  # read stopped at the bound (a declared 1 GiB: before a byte)
    assert time.monotonic() - started < BOUND_S


SSE = {"content-type": "text/event-stream"}
EVENT = b'data: {"choices": [{"index": 0, "delta": {"content": "x"}}]}\n\n'


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "bad",
    [
        Hostile(endless(b'data: {"choices": [{"delta": {"content": "', b"y" * CHUNK), SSE),  # one endless line
        Hostile(endless(b"", b"data: more\n" * 4096), SSE),  # one event of endless data lines
        Hostile(endless(b"", EVENT), SSE),  # endless valid events
    ],
    ids=["endless_line", "endless_event", "endless_stream"],
)
async def test_provider_reply_size_bounded_for_streams(bad: Hostile) -> None:
    """A stream is the client's from its first byte on, so the bound ends it with the error event and
    `[DONE]` (never re-sent; the `cheap` scenario's continuation may try `good`, whose JSON answer is no
    stream); the bad attempt is booked as cut with that code."""
    started = time.monotonic()
    response, dispatcher = await _post(bad, {**CHAT, "stream": True}, "sse-1")
    assert response.status_code == 200
    text = response.text
    assert '"code":"provider_reply_too_large"' in text and text.endswith("data: [DONE]\n\n")
    assert bad.produced <= LIMIT + 2 * CHUNK
    assert (f"cloud:bad/{MODEL}", "provider_reply_too_large") in _errors(dispatcher, "sse-1")
    assert time.monotonic() - started < BOUND_S


MALFORMED = {
    "not_json": b"<html>oops</html>",
    "deep_json": b'{"choices": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
    "nested_past_64": b'{"choices": [{"message": {"content": "x", "x": ' + b"[" * 80 + b"]" * 80 + b"}}]}",
    "lone_surrogate": b'{"choices": [{"index": 0, "message": {"role": "assistant", "content": "\\ud800"}}]}',
    "error_body_too_deep": b'{"error": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", sorted(MALFORMED))
async def test_malformed_provider_json_fails_over(name: str) -> None:
    started = time.monotonic()
    bad = Hostile(once(MALFORMED[name]), {"content-type": "application/json"})
    response, dispatcher = await _post(bad, CHAT, "bad-json")
    assert response.status_code == 200, response.text
    assert response.headers["x-spillover-target"] == "cloud:good"
    assert _errors(dispatcher, "bad-json")[0] == (f"cloud:bad/{MODEL}", "provider_malformed")
    assert time.monotonic() - started < BOUND_S


@pytest.mark.timeout(60)
async def test_malformed_provider_error_body_is_bounded_and_classified() -> None:
    """A 500 whose body never ends: only its start is read, and it fails over as the 500 it is."""
    started = time.monotonic()
    produced = 0

    def handler(request: httpx.Request) -> httpx.Response:
        async def body() -> AsyncIterator[bytes]:
            nonlocal produced
            while True:
                produced += CHUNK
                yield b"[" * CHUNK

        return httpx.Response(500, content=body())

    client, dispatcher = build(handler)
    async with client:
        response = await client.post("/v1/chat/completions", json=CHAT, headers=cheap("err-1"))
    assert response.status_code == 200 and response.headers["x-spillover-target"] == "cloud:good"
    assert (f"cloud:bad/{MODEL}", "provider_error") in _errors(dispatcher, "err-1")
    assert produced <= 4 * CHUNK
    assert time.monotonic() - started < BOUND_S


def test_default_max_reply_bytes_is_32_mib_and_strict() -> None:
    raw = dump_config(load_config(REPO / "configs/local.yaml"))
    assert parse_config(raw, "t").cloud.providers[0].max_reply_bytes == 32 * 1024 * 1024
    raw["cloud"]["providers"][0]["max_reply_bytes"] = 10
    with pytest.raises(Exception, match=r"cloud.providers\[0\].max_reply_bytes"):
        parse_config(raw, "t")


@pytest.mark.parametrize("arguments", ['{"a": "\\ud800"}', "[" * 5000 + "]" * 5000])
def test_anthropic_tool_arguments_too_deep_or_lone_surrogate_are_a_400(arguments: str) -> None:
    """The Messages API gets tool arguments as JSON objects: the gateway parses the client's string, so a
    lone surrogate or a nesting past the recursion limit is the client's 400, not the gateway's 500."""
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": arguments}}
    body = {
        "messages": [
            {"role": "user", "content": "x"},
            {"role": "assistant", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": "y"},
        ]
    }
    with pytest.raises(InvalidRequest, match="arguments must be a JSON object"):
        messages_request(body, "claude", 100)
