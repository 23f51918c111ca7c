"""Client error texts name no internal host: hostile error texts from a cloud provider, a failing local
replica and an engine that fails mid-stream, through the gateway's real HTTP layer
(tests/unit/security_gateway.py: real dispatcher, provider adapter and authenticator); what a client
sees (the body, `x-spillover-reason`, a stream's error event, the decision record) names none of
them. IP addresses and URLs: tests/unit/test_security_leaks.py."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from types import SimpleNamespace

import httpx
import pytest

from router.errors import TargetUnavailable
from serve_apps.engine.replies import to_sse
from serve_apps.http.guards import ClientText
from tests.fakes import FakeEngine, chunk_event
from tests.unit.security_gateway import APPS, CHAT, HOSTNAME, build

HOSTS = (
    "gpu-box-7.internal:8000",
    "vllm-0.vllm.svc.cluster.local",
    "ip-10-0-1-5",
    "[fd00::7]:8000",
    "localhost:8265",
    "db.corp",
    HOSTNAME,
)
HOSTILE = "upstream " + ", ".join(HOSTS) + " reset the connection"
LEAKS = ("gpu-box-7", "vllm-0", "ip-10-0-1-5", "fd00::7", "localhost:8265", "db.corp", HOSTNAME, ":8000")


def _leaks(text: str) -> list[str]:
    return [leak for leak in LEAKS if leak in text]


def _provider_error(status: int) -> Callable[[httpx.Request], httpx.Response]:
    return lambda request: httpx.Response(status, json={"error": {"message": HOSTILE, "param": None}})


def _unreachable(request: httpx.Request) -> httpx.Response:
    raise httpx.ConnectError(f"certificate is not valid for '{HOSTNAME}' nor 'api-gw.internal:443'", request=request)


@pytest.mark.parametrize("provider", [_provider_error(400), _provider_error(503), _unreachable])
async def test_errors_name_no_internal_host_from_a_provider(
    provider: Callable[[httpx.Request], httpx.Response],
) -> None:
    async with build(saturated=True, provider=provider).client() as c:
        response = await c.post("/v1/chat/completions", json=CHAT, headers=APPS)
    assert 400 <= response.status_code < 600 and response.status_code != 500, response.text
    assert not _leaks(response.text + response.headers.get("x-spillover-reason", "")), response.text
    assert "api-gw" not in response.text


async def test_errors_name_no_internal_host_in_a_fail_over_reason_or_the_record() -> None:
    engine = FakeEngine(answer="ok")
    engine.fail = TargetUnavailable(f"replica on {HOSTS[0]} ({HOSTS[1]}) died")
    async with build(local=engine, attempts=3).client() as c:
        response = await c.post("/v1/chat/completions", json=CHAT, headers={**APPS, "x-request-id": "r-hosts"})
        record = await c.get("/v1/spillover/decisions/r-hosts", headers=APPS)
    assert response.status_code == 200 and response.headers["x-spillover-route"] == "cloud", response.text
    assert "failed before the first byte" in response.headers["x-spillover-reason"]
    assert not _leaks(response.headers["x-spillover-reason"] + record.text)


class FailsMidStream(FakeEngine):
    """What the local backend yields when vLLM fails after the first token behind Ray's LLMServer: the
    engine's ErrorResponse becomes a `data: {"error": ...}` event (serve_apps/engine/replies.to_sse)."""

    async def _chunks(self, model: str, with_usage: bool = False) -> AsyncIterator[str]:
        yield chunk_event(model, "Pa")
        yield to_sse(SimpleNamespace(error=SimpleNamespace(message=HOSTILE, code=500, param=None)))


async def test_errors_name_no_internal_host_in_a_streams_error_event() -> None:
    async with build(local=FailsMidStream()).client() as c:
        response = await c.post("/v1/chat/completions", json={**CHAT, "stream": True}, headers=APPS)
    events = [json.loads(line[6:]) for line in response.text.splitlines() if line.startswith("data: {")]
    assert response.status_code == 200 and events[0]["choices"][0]["delta"]["content"] == "Pa"
    errors = [e["error"] for e in events if "error" in e]
    assert errors and errors[0]["code"] == "upstream_error"  # still the engine's error, its hosts scrubbed
    assert not _leaks(response.text), response.text


@pytest.mark.parametrize(
    "kept",
    [
        "model 'Qwen2.5-7B-Instruct' (gpt-4o-mini) at 12:30:45",
        "max_tokens: 16 is over gateway.http_limits.max_headers = 100",
        "x-spillover-level must be L1, L2 or L3",
        "data: [DONE]",
    ],
)
def test_scrubbing_keeps_text_that_names_no_host(kept: str) -> None:
    assert ClientText([HOSTNAME]).text(kept) == kept


def test_stream_events_other_than_errors_are_left_alone() -> None:
    text = ClientText([HOSTNAME])
    content = chunk_event("m", f"the model may say {HOSTNAME}:8000")
    assert text.events(content) == content  # an answer is the model's, not an error text
    error = 'data: {"error": {"message": "' + HOSTILE + '"}}\n\n'
    assert not _leaks(text.events(error)) and text.events(error).endswith("\n\n")


def test_a_remembered_text_is_scrubbed_the_same_every_time() -> None:
    """Short texts are remembered (every answer's reason is scrubbed, and reasons repeat); a long one is not."""
    text = ClientText([HOSTNAME])
    first = text.text(HOSTILE)
    assert not _leaks(first) and [text.text(HOSTILE) for _ in range(3)] == [first] * 3
    many = [f"{HOSTILE} #{i}" for i in range(3000)]  # more than it remembers: it starts afresh, still scrubbing
    assert all(not _leaks(text.text(t)) for t in many) and all(not _leaks(text.text(t)) for t in many[:10])
    long = HOSTILE * 20
    assert len(long) > 512 and not _leaks(text.text(long))
