"""`GET /readyz` with auth on: the bare status stays public (load balancers and `spillover deploy`
poll it without a key), the per-model reasons (which engine is down, what its golden prompt answered,
how stale its stats are) are an admin tenant's to read. Through the gateway's real ASGI app over
FakeEngine (a local model as the gateway reaches it)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from router.request.auth import Authenticator, TenantPolicy
from serve_apps.dispatch.interfaces import LocalDispatch
from serve_apps.gateway_parts import EdgeSettings
from serve_apps.http.surface import GatewayHTTP, ServedModel
from tests.fakes import FakeEngine

TENANTS = [TenantPolicy("apps"), TenantPolicy("ops", admin=True)]
KEYS = {"apps": "sk-apps-1", "ops": "sk-ops-2"}
REASON = "health check failed: replica on 10.0.3.7:8000 is restarting"


@pytest.fixture
def backend() -> FakeEngine:
    return FakeEngine()


@pytest.fixture
async def client(backend: FakeEngine) -> AsyncIterator[httpx.AsyncClient]:
    gateway = GatewayHTTP(
        backend,
        [ServedModel("small", "llama", "cpu", 2048)],
        LocalDispatch(backend),
        created=1,
        edge=EdgeSettings(authenticator=Authenticator(TENANTS, KEYS)),
    )
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=gateway.app), base_url="http://gw") as c:
        yield c


@pytest.mark.parametrize("authorization", [None, "Bearer wrong", "Basic sk-ops-2", "Bearer sk-apps-1"])
async def test_readyz_detail_behind_auth(
    client: httpx.AsyncClient, backend: FakeEngine, authorization: str | None
) -> None:
    headers = {"authorization": authorization} if authorization else {}
    assert (await client.get("/readyz", headers=headers)).json() == {"status": "ready"}
    backend.unhealthy["small"] = REASON
    not_ready = await client.get("/readyz", headers=headers)
    assert not_ready.status_code == 503  # the status code is public, never a 401
    assert not_ready.json() == {"status": "not_ready"}
    assert "10.0.3.7" not in not_ready.text and "small" not in not_ready.text


async def test_readyz_gives_an_admin_the_per_model_detail(client: httpx.AsyncClient, backend: FakeEngine) -> None:
    backend.unhealthy["small"] = REASON
    detail = await client.get("/readyz", headers={"authorization": "Bearer sk-ops-2"})
    assert detail.status_code == 503
    assert detail.json() == {"status": "not_ready", "models": {"small": REASON}}
