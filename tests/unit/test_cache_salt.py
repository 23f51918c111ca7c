"""Cross-tenant prefix-cache side channel: with auth on, every local request carries a
per-tenant vLLM `cache_salt` (router/request/cache_salt.py), over the real HTTP layer and dispatcher.

The local backend records the body it is handed: exactly what ServeHandleBackend validates into
ray.serve.llm's ChatCompletionRequest and sends to the engine (the last test checks that the
request model keeps the field).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from cluster.config.deployment import parse_config
from router.request.auth import Authenticator, TenantPolicy
from router.request.cache_salt import MAX_SALT_CHARS, salted, tenant_salt
from serve_apps.clocks import Clocks
from serve_apps.dispatch.dispatcher import Dispatcher
from serve_apps.gateway_parts import EdgeSettings
from serve_apps.http.surface import GatewayHTTP, ServedModel
from tests.fakes import FakeEngine
from tests.unit.test_dispatch import World

BODY = {"model": "m", "messages": [{"role": "user", "content": "the same long system prompt"}]}


async def _client(local: FakeEngine, auth: Authenticator | None) -> AsyncIterator[httpx.AsyncClient]:
    config = parse_config(
        {"models": [{"alias": "m", "source": "prepared:x", "family": "llama", "engine_args": {"max_model_len": 4096}}]},
        "test",
    )
    world = World()
    dispatcher = Dispatcher(config, local, {}, world.snapshot, clocks=Clocks.of(world.clock, sleep=world.sleep))
    gateway = GatewayHTTP(
        local, [ServedModel("m", "llama", "cpu", 4096)], dispatcher, created=1, edge=EdgeSettings(authenticator=auth)
    )
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=gateway.app), base_url="http://gw") as client:
        yield client


@pytest.fixture
async def with_auth() -> AsyncIterator[tuple[httpx.AsyncClient, FakeEngine]]:
    local = FakeEngine(answer="ok")
    auth = Authenticator([TenantPolicy("alpha"), TenantPolicy("beta")], {"alpha": "key-a", "beta": "key-b"})
    async for client in _client(local, auth):
        yield client, local


async def test_cache_salt_isolates_tenants_when_auth_is_on(with_auth: Any) -> None:
    client, local = with_auth
    for key in ("key-a", "key-a", "key-b"):
        response = await client.post("/v1/chat/completions", json=BODY, headers={"authorization": f"Bearer {key}"})
        assert response.status_code == 200, response.text
    salts = [call[2]["cache_salt"] for call in local.calls]
    assert salts[0] == salts[1] != salts[2]  # one tenant shares its own cache, never another's
    assert salts[0] == tenant_salt("alpha") and salts[2] == tenant_salt("beta")


async def test_a_client_cannot_choose_another_tenants_salt(with_auth: Any) -> None:
    client, local = with_auth
    forged = {**BODY, "cache_salt": tenant_salt("alpha")}
    response = await client.post("/v1/chat/completions", json=forged, headers={"authorization": "Bearer key-b"})
    assert response.status_code == 200
    assert local.calls[0][2]["cache_salt"] not in (tenant_salt("alpha"), forged["cache_salt"])
    assert local.calls[0][2]["cache_salt"] == tenant_salt("beta", forged["cache_salt"])  # folded into beta's


async def test_without_auth_the_clients_salt_passes_and_a_bad_one_is_400() -> None:
    local = FakeEngine(answer="ok")
    async for client in _client(local, None):
        plain = await client.post("/v1/chat/completions", json=BODY)
        own = await client.post("/v1/chat/completions", json={**BODY, "cache_salt": "mine"})
        bad = await client.post("/v1/chat/completions", json={**BODY, "cache_salt": "a/b"})
        long = await client.post("/v1/chat/completions", json={**BODY, "cache_salt": "x" * (MAX_SALT_CHARS + 1)})
    assert plain.status_code == own.status_code == 200
    assert "cache_salt" not in local.calls[0][2] and local.calls[1][2]["cache_salt"] == "mine"
    for response in (bad, long):
        assert response.status_code == 400 and response.json()["error"]["param"] == "cache_salt"
    assert len(local.calls) == 2


def test_salted_leaves_the_callers_body_alone() -> None:
    body = {"messages": []}
    assert salted(body, "t")["cache_salt"] == tenant_salt("t") and "cache_salt" not in body


def test_ray_serve_llm_request_keeps_the_cache_salt() -> None:
    """What the local backend sends: ray.serve.llm's ChatCompletionRequest / CompletionRequest
    (subclasses of vLLM's) validate the salted body and keep `cache_salt`, which vLLM's chat and
    completion serving hand to the engine's prefix-cache keys."""
    pytest.importorskip("vllm")
    from ray.serve.llm.openai_api_models import ChatCompletionRequest, CompletionRequest

    salt = tenant_salt("alpha")
    chat = ChatCompletionRequest.model_validate(salted(BODY, "alpha"))
    completion = CompletionRequest.model_validate(salted({"model": "m", "prompt": "hi"}, "alpha"))
    assert chat.cache_salt == completion.cache_salt == salt
