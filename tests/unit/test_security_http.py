"""Hostile input against the gateway's real HTTP layer: operator routes, body size, malformed input.

The harness (real dispatcher, pipeline, authenticator and provider adapter; stand-in engine and
provider server) is tests/unit/security_gateway.py.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from cluster.config.deployment import GatewaySection
from tests.unit.security_gateway import APPS, BOUND_S, CHAT, OPS, build

# --- item 1: operator endpoints need an admin tenant when auth is on ---------------------------------


@pytest.mark.parametrize(
    ("method", "path"),
    [("GET", "/v1/spillover/cluster"), ("GET", "/v1/spillover/resilience"), ("POST", "/v1/spillover/resilience/reset")],
)
async def test_item1_operator_endpoints_need_an_admin_tenant(method: str, path: str) -> None:
    async with build().client() as c:
        anonymous = await c.request(method, path)
        tenant = await c.request(method, path, headers=APPS)
        admin = await c.request(method, path, headers=OPS)
    assert anonymous.status_code == 401 and anonymous.json()["error"]["code"] == "invalid_api_key"
    assert tenant.status_code == 403 and tenant.json()["error"]["code"] == "forbidden"
    assert admin.status_code == 200, admin.text


# --- item 5: body size limit, auth before the body -----------------------------------------------------


class CountingBody:
    """A request body that streams `chunks` chunks of `size` bytes and counts how many were read."""

    def __init__(self, chunks: int, size: int = 16 * 1024) -> None:
        self.chunks, self.size, self.read = chunks, size, 0

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for _ in range(self.chunks):
            self.read += 1
            yield b" " * self.size


def test_body_size_limit_default_is_8_mib() -> None:
    assert GatewaySection().max_body_bytes == 8 * 1024 * 1024


async def test_body_size_limit_413_before_buffering() -> None:
    limit = 64 * 1024
    body = CountingBody(chunks=6400)  # 100 MiB, never sent in full
    started = time.monotonic()
    async with build(max_body_bytes=limit).client() as c:
        response = await c.post("/v1/chat/completions", content=body, headers=APPS)
    assert response.status_code == 413 and response.json()["error"]["code"] == "request_too_large"
    assert body.read <= limit // body.size + 1  # stopped at the chunk that crossed the limit
    assert time.monotonic() - started < BOUND_S


async def test_body_size_limit_declared_length_413_without_reading() -> None:
    body = CountingBody(chunks=10)
    async with build(max_body_bytes=64 * 1024).client() as c:
        headers = {**APPS, "content-length": str(10**12)}
        response = await c.post("/v1/chat/completions", content=body, headers=headers)
    assert response.status_code == 413 and body.read == 0


async def test_body_size_limit_auth_checked_before_the_body_is_read() -> None:
    body = CountingBody(chunks=6400)
    async with build(max_body_bytes=64 * 1024).client() as c:
        wrong = await c.post("/v1/chat/completions", content=body, headers={"authorization": "Bearer sk-guess"})
    assert wrong.status_code == 401 and body.read == 0


async def test_body_size_limit_applies_to_operator_routes() -> None:
    body = CountingBody(chunks=6400)
    async with build(max_body_bytes=64 * 1024).client() as c:
        response = await c.post("/v1/spillover/resilience/reset", content=body, headers=OPS)
    assert response.status_code == 413 and body.read <= 5


async def test_body_under_the_limit_is_served() -> None:
    async with build(max_body_bytes=64 * 1024).client() as c:
        padded = {**CHAT, "messages": [{"role": "user", "content": "x" * 30_000}]}
        response = await c.post("/v1/chat/completions", json=padded, headers=APPS)
    assert response.status_code == 200, response.text


# --- item 6: malformed input is a 400, never a 500 -------------------------------------------------------


def _raw(body: dict[str, Any]) -> bytes:
    return json.dumps(body).encode()


MALFORMED_BODIES = {
    "nested_100k_deep": b'{"model":"m","messages":' + b"[" * 100_000 + b"]" * 100_000 + b"}",
    "nested_65_deep": _raw(
        {**CHAT, "messages": [{"role": "user", "content": "x", "extra": json.loads("[" * 65 + "]" * 65)}]}
    ),
    "nan": _raw(CHAT)[:-1] + b', "temperature": NaN}',
    "integer_5000_digits": _raw(CHAT)[:-1] + b', "max_tokens": ' + b"9" * 5000 + b"}",
    "tool_calls_5": _raw(
        {**CHAT, "messages": [{"role": "assistant", "tool_calls": 5}, {"role": "user", "content": "x"}]}
    ),
    "content_5": _raw({**CHAT, "messages": [{"role": "user", "content": 5}]}),
    "tools_5": _raw({**CHAT, "tools": 5}),
    "temperature_text": _raw({**CHAT, "temperature": "hot"}),
    "stop_5": _raw({**CHAT, "stop": 5}),
    "response_format_text": _raw({**CHAT, "response_format": "json"}),
    "not_utf8": b"\xff\xfe\x00",
}


@pytest.mark.parametrize("name", sorted(MALFORMED_BODIES))
async def test_malformed_input_body_is_400_never_500(name: str) -> None:
    started = time.monotonic()
    async with build().client() as c:
        response = await c.post("/v1/chat/completions", content=MALFORMED_BODIES[name], headers=APPS)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["code"] in {"invalid_json", "invalid_request"}
    assert time.monotonic() - started < BOUND_S


MALFORMED_HEADERS = {
    "deadline_400_digits": {"x-spillover-deadline-ms": "9" * 400},
    "deadline_1e400": {"x-spillover-deadline-ms": "1e400"},
    "deadline_nan": {"x-spillover-deadline-ms": "nan"},
    "deadline_negative": {"x-spillover-deadline-ms": "-5"},
    "cost_inf": {"x-spillover-max-cost-usd": "inf"},
    "cost_400_digits": {"x-spillover-max-cost-usd": "9" * 400},
    "level_unknown": {"x-spillover-level": "L9"},
}


@pytest.mark.parametrize("name", sorted(MALFORMED_HEADERS))
async def test_malformed_input_absurd_headers_are_400(name: str) -> None:
    async with build().client() as c:
        response = await c.post("/v1/chat/completions", json=CHAT, headers={**APPS, **MALFORMED_HEADERS[name]})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == next(iter(MALFORMED_HEADERS[name]))


@pytest.mark.parametrize("raw_id", ["日本語".encode(), b"\xe9t\xe9", b"a b", b"x" * 129])
async def test_malformed_input_non_ascii_request_id_is_replaced(raw_id: bytes) -> None:
    gateway = build(saturated=True)  # bursts: the id would be sent on to the provider
    async with gateway.client() as c:
        response = await c.post("/v1/chat/completions", json=CHAT, headers={**APPS, "x-request-id": raw_id})
    assert response.status_code == 200, response.text
    new_id = response.headers["x-request-id"]
    assert new_id.encode() != raw_id and new_id.isascii() and new_id.isalnum()
    assert gateway.provider_requests[0].headers["x-request-id"] == new_id
