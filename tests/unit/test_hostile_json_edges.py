"""Hostile JSON where it used to escape the request parser: a body nested past Python's recursion limit
with an `Idempotency-Key` (its store reads the body first), the operator reset and the feedback bodies,
and lone UTF-16 surrogates (`"\\ud800"`: valid JSON, no valid UTF-8) in a session-named, keyed or
cloud-bound request. Every one is a clean 4xx within a bounded time, never a 500.

The gateway is the real HTTP layer of tests/unit/security_gateway.py (real dispatcher, idempotency
store, authenticator and provider adapter; FakeEngine and an httpx.MockTransport provider stand in for
the engine and OpenAI's chat endpoint).
"""

from __future__ import annotations

import json
import time

import pytest

from tests.unit.security_gateway import APPS, BOUND_S, CHAT, OPS, build
from tests.unit.test_feedback_http import FEEDBACK
from tests.unit.test_feedback_http import build as build_learning

DEEP = b'{"model":"m","messages":' + b"[" * 100_000 + b"]" * 100_000 + b"}"
LONE = '"hi \\ud800 there"'  # the JSON text of a string holding a lone high surrogate


def _chat_with(content_json: str) -> bytes:
    return f'{{"model": "{CHAT["model"]}", "messages": [{{"role": "user", "content": {content_json}}}]}}'.encode()


def _bounded(started: float) -> None:
    assert time.monotonic() - started < BOUND_S


@pytest.mark.timeout(60)
@pytest.mark.parametrize("body", [DEEP, _chat_with("[" * 65 + "]" * 65)], ids=["100k_deep", "65_deep"])
async def test_no_500_on_deep_json_with_idempotency_key(body: bytes) -> None:
    started = time.monotonic()
    gateway = build(idempotent=True)
    async with gateway.client() as c:
        response = await c.post("/v1/chat/completions", content=body, headers={**APPS, "idempotency-key": "k-1"})
        again = await c.post("/v1/chat/completions", json=CHAT, headers={**APPS, "idempotency-key": "k-1"})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["code"] in {"invalid_json", "invalid_request"}
    assert again.status_code == 200, again.text  # the refused body left the key free
    _bounded(started)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "body",
    [b"[" * 2000 + b"]" * 2000, b'{"request_id": "r", "outcome": "success", "source": "s", "label": ' + b"[" * 2000],
    ids=["2000_deep", "2000_deep_unclosed"],
)
async def test_no_500_on_deep_json_in_feedback(body: bytes) -> None:
    started = time.monotonic()
    client, _ = build_learning()
    async with client:
        response = await client.post(FEEDBACK, content=body, headers=APPS)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["code"] == "invalid_feedback"
    _bounded(started)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "body",
    [b'{"target": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", b'{"target": "cloud:\\ud800"}'],
    ids=["100k_deep", "lone_surrogate"],
)
async def test_no_500_on_deep_json_in_resilience_reset(body: bytes) -> None:
    started = time.monotonic()
    async with build().client() as c:
        response = await c.post("/v1/spillover/resilience/reset", content=body, headers=OPS)
    assert response.status_code == 400, response.text
    _bounded(started)


async def test_no_500_on_lone_surrogate_in_feedback() -> None:
    client, _ = build_learning()
    async with client:
        body = b'{"request_id": "r", "outcome": "success", "source": "s\\udfff"}'
        response = await client.post(FEEDBACK, content=body, headers=APPS)
    assert response.status_code == 400 and response.json()["error"]["code"] == "invalid_feedback"


LONE_SURROGATE_REQUESTS = {
    "session_named": ({"x-spillover-session": "conv-1"}, _chat_with(LONE), False),
    "session_in_metadata": ({}, _chat_with('"x"')[:-1] + b', "metadata": {"session_id": "s\\ud83d"}}', False),
    "idempotency_keyed": ({"idempotency-key": "k-2"}, _chat_with(LONE), False),
    "cloud_bound": ({}, _chat_with(LONE), True),
    "cloud_bound_low_surrogate_key": ({}, _chat_with('{"\\udc00": 1}'), True),
    "cloud_bound_tool_arguments": (
        {},
        json.dumps(
            {
                **CHAT,
                "messages": [
                    {"role": "user", "content": "x"},
                    {
                        "role": "assistant",
                        "tool_calls": [
                            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": "\\ud800"}'}}
                        ],
                    },
                    {"role": "tool", "tool_call_id": "c1", "content": "y"},
                ],
            }
        ).encode(),
        True,
    ),
}


@pytest.mark.parametrize("name", sorted(LONE_SURROGATE_REQUESTS))
async def test_no_500_on_lone_surrogates(name: str) -> None:
    """A lone surrogate is a 400 naming where it is; nothing reaches the engine or the provider. A tool
    call's `arguments` is a string holding JSON: its escaped surrogate passes the body's check and goes to
    an OpenAI-compatible provider as the text it is (a correct answer, not a 500)."""
    headers, body, saturated = LONE_SURROGATE_REQUESTS[name]
    gateway = build(saturated=saturated, idempotent=True)
    async with gateway.client() as c:
        response = await c.post("/v1/chat/completions", content=body, headers={**APPS, **headers})
    if name == "cloud_bound_tool_arguments":
        assert response.status_code == 200, response.text
        return
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "invalid_json" and "surrogate" in error["message"]
    assert gateway.provider_requests == []
    if name in ("session_named", "idempotency_keyed", "cloud_bound"):
        assert error["param"] == "messages[0].content"
