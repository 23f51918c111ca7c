"""The session id (router/sessions/session_id.py): only an explicit name makes a session (the header, then
`metadata.session_id`; never `user` or `prompt_cache_key`), and hostile values at every source."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from router.errors import InvalidRequest
from router.sessions.session_id import pin_key, session_id_of
from serve_apps.dispatch.interfaces import LocalDispatch
from serve_apps.http.surface import GatewayHTTP, ServedModel
from tests.fakes import FakeEngine

BODY = {"prompt_cache_key": "pck", "metadata": {"session_id": "meta"}, "user": "alice"}


def test_the_header_comes_first_then_metadata_and_never_user_or_prompt_cache_key() -> None:
    assert session_id_of(BODY, {"x-spillover-session": " s1 "}).value == "s1"  # type: ignore[union-attr]
    assert session_id_of(BODY, {}).source == "metadata.session_id"  # type: ignore[union-attr]
    assert session_id_of(BODY, {}).value == "meta"  # type: ignore[union-attr]
    # OpenAI's end-user id and prefix-cache hint keep their meaning: neither names a conversation
    assert session_id_of({"user": "alice", "prompt_cache_key": "pck"}, {}) is None
    assert session_id_of({"messages": []}, {}) is None
    assert session_id_of({"metadata": {"session_id": ""}}, {}) is None  # an empty id names no session


@pytest.mark.parametrize("value", ["", " ", "x" * 129, "caf\u00e9", "a\x00b", "a\nb"])
def test_a_bad_header_is_a_400_naming_it(value: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        session_id_of({}, {"x-spillover-session": value})
    assert caught.value.code == "invalid_session" and caught.value.param == "x-spillover-session"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"metadata": {"session_id": 7}}, "metadata.session_id"),
        ({"metadata": {"session_id": ["a"]}}, "metadata.session_id"),
        ({"metadata": {"session_id": "u" * 5000}}, "metadata.session_id"),
    ],
)
def test_a_bad_body_field_is_a_400_naming_it(body: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        session_id_of(body, {})
    assert caught.value.code == "invalid_session" and caught.value.param == param


def test_a_long_or_unicode_body_id_is_keyed_by_its_hash() -> None:
    def named(value: str) -> Any:
        return session_id_of({"metadata": {"session_id": value}}, {})

    long, uni = named("u" * 300), named("j\u00f6rg")
    assert long is not None and long.value.startswith("sha256:") and len(long.value) == 39
    assert uni is not None and uni.value != named("jorg").value


def test_pins_are_per_tenant_and_model() -> None:
    keys = {pin_key("a", "m", "s"), pin_key("b", "m", "s"), pin_key(None, "m", "s"), pin_key("a", "n", "s")}
    assert len(keys) == 4


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    engine = FakeEngine()
    gateway = GatewayHTTP(engine, [ServedModel("m", "llama", "cpu", 4096)], LocalDispatch(engine), created=1)
    transport = httpx.ASGITransport(app=gateway.app)
    async with httpx.AsyncClient(transport=transport, base_url="http://gw") as c:
        yield c


@pytest.mark.parametrize(
    ("headers", "extra"),
    [({"x-spillover-session": "x" * 500}, {}), ({}, {"user": {"id": 1}}), ({}, {"metadata": {"session_id": []}})],
)
async def test_over_http_a_bad_session_is_a_clear_400(
    client: httpx.AsyncClient, headers: dict[str, str], extra: dict[str, Any]
) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **extra}
    response = await client.post("/v1/chat/completions", json=body, headers=headers)
    assert response.status_code == 400
    error = response.json()["error"]
    # `user` is checked with the body (a string, router/request/openai_request.py) before it names a session
    assert error["code"] in ("invalid_session", "invalid_request") and "Traceback" not in response.text
