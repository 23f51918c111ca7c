"""Gateway auth: no key / wrong key / right key, tenant policies narrowing the contract."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from cluster.config.deployment import parse_config
from cluster.config.tenants import authenticator_for
from router.errors import ConfigError, Unauthorized
from router.request.auth import Authenticator, TenantPolicy, narrow_for_tenant
from router.request.contract import RequestContract, derive_contract
from router.request.openai_request import Kind
from router.routing.policy import Policy
from serve_apps.backend import BackendReply
from serve_apps.clocks import Clocks
from serve_apps.dispatch.interfaces import Dispatched
from serve_apps.gateway_parts import EdgeSettings, GatewayParts
from serve_apps.http.surface import GatewayHTTP, ServedModel
from serve_apps.limits.tenants import TenantLimits
from serve_apps.state.memory import MemoryStore
from tests.fakes import FakeEngine

TENANTS = [TenantPolicy("acme"), TenantPolicy("bank", residency="local_only")]
KEYS = {"acme": "sk-acme-123", "bank": "sk-bank-456"}


@pytest.mark.parametrize(
    ("header", "tenant"),
    [("Bearer sk-acme-123", "acme"), ("bearer sk-bank-456", "bank"), ("Bearer  sk-acme-123 ", "acme")],
)
def test_right_key_finds_tenant(header: str, tenant: str) -> None:
    assert Authenticator(TENANTS, KEYS).authenticate(header).name == tenant


@pytest.mark.parametrize(
    ("header", "message"),
    [
        (None, "missing API key"),
        ("", "missing API key"),
        ("Basic abc", "missing API key"),
        ("Bearer sk-acme-12", "invalid API key"),
        ("Bearer sk-nobody", "invalid API key"),
    ],
)
def test_missing_or_wrong_key_is_401(header: str | None, message: str) -> None:
    with pytest.raises(Unauthorized) as caught:
        Authenticator(TENANTS, KEYS).authenticate(header)
    assert caught.value.status_code == 401 and message in caught.value.message
    assert "sk-" not in caught.value.message


def test_tenant_without_key_cannot_authenticate() -> None:
    auth = Authenticator(TENANTS, {"acme": "sk-acme-123", "bank": ""})
    assert auth.authenticate("Bearer sk-acme-123").name == "acme"
    with pytest.raises(Unauthorized):
        auth.authenticate("Bearer ")


def contract(**headers: str) -> RequestContract:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    return derive_contract(body, headers, Policy())


@pytest.mark.parametrize(
    ("tenant", "headers", "residency", "providers"),
    [
        (TenantPolicy("t"), {}, "any", None),
        (TenantPolicy("t", residency="local_only"), {}, "local_only", None),
        (TenantPolicy("t", residency="local_only"), {"x-spillover-residency": "any"}, "local_only", None),
        (
            TenantPolicy("t", residency=frozenset({"eu", "us"})),
            {"x-spillover-residency": "eu"},
            frozenset({"eu"}),
            None,
        ),
        (TenantPolicy("t", allowed_providers=frozenset({"a"})), {"x-spillover-providers": "a,b"}, "any", {"a"}),
    ],
)
def test_tenant_narrows_never_widens(
    tenant: TenantPolicy, headers: dict[str, str], residency: Any, providers: set[str] | None
) -> None:
    narrowed = narrow_for_tenant(contract(**headers), tenant)
    assert narrowed.residency == residency
    assert narrowed.allowed_providers == (None if providers is None else frozenset(providers))


CONFIG = {
    "gateway": {"auth": True},
    "models": [{"alias": "m", "source": "prepared:x", "family": "llama"}],
    "tenants": [
        {"name": "acme", "api_key_env": "ACME_KEY"},
        {"name": "bank", "api_key_env": "BANK_KEY", "residency": "local_only"},
    ],
}


def test_auth_on_needs_tenants() -> None:
    with pytest.raises(ConfigError, match="no tenants are configured"):
        parse_config({**CONFIG, "tenants": []}, "t")


class Recorder:
    def __init__(self) -> None:
        self.contracts: list[RequestContract] = []

    async def dispatch(
        self, kind: Kind, body: dict[str, Any], request_id: str, *, contract: RequestContract, deadline_s: float
    ) -> Dispatched:
        self.contracts.append(contract)
        return Dispatched(BackendReply(body={"ok": True}), "local", "local:m", "local", 0.0)


async def test_gateway_auth_end_to_end() -> None:
    config = parse_config(CONFIG, "t")
    auth = authenticator_for(config, {"ACME_KEY": "sk-acme-123", "BANK_KEY": "sk-bank-456"})
    recorder = Recorder()
    gateway = GatewayHTTP(
        FakeEngine(),
        [ServedModel("m", "llama", "cpu", 4096)],
        recorder,
        created=1,
        edge=EdgeSettings(authenticator=auth),
    )
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=gateway.app), base_url="http://gw") as c:
        none = await c.post("/v1/chat/completions", json=body)
        wrong = await c.post("/v1/chat/completions", json=body, headers={"authorization": "Bearer nope"})
        acme = await c.post("/v1/chat/completions", json=body, headers={"authorization": "Bearer sk-acme-123"})
        bank = await c.post("/v1/chat/completions", json=body, headers={"authorization": "Bearer sk-bank-456"})
        models = await c.get("/v1/models")
        health = await c.get("/healthz")
    for denied in (none, wrong, models):
        assert denied.status_code == 401
        assert denied.json()["error"]["type"] == "authentication_error"
        assert denied.json()["error"]["code"] == "invalid_api_key"
    assert acme.status_code == 200 and bank.status_code == 200 and health.status_code == 200
    assert [c.residency for c in recorder.contracts] == ["any", "local_only"]


def test_auth_off_means_no_authenticator() -> None:
    config = parse_config({**CONFIG, "gateway": {"auth": False}}, "t")
    assert authenticator_for(config, {}) is None


async def test_local_only_tenant_never_reaches_the_cloud_even_when_saturated(tmp_path: Any) -> None:
    import json
    import random
    from pathlib import Path

    from bench.cloud_sim import SimSettings
    from bench.cloud_sim import build_app as build_cloud_sim
    from cluster.config.deployment import dump_config, load_config
    from router.routing.snapshot import ClusterSnapshot, ReplicaStats
    from serve_apps.dispatch.dispatcher import Dispatcher
    from serve_apps.providers import OpenAICompatProvider

    raw = dump_config(load_config(Path(__file__).resolve().parents[2] / "configs/local.yaml"))
    raw["cloud"]["providers"][0].update(enabled=True, api_key_env=None)
    raw["gateway"]["auth"] = True
    raw["tenants"] = CONFIG["tenants"]
    config = parse_config(raw, "t")
    log = tmp_path / "cloud.jsonl"
    sim = build_cloud_sim(
        SimSettings(ttft_s=0, tokens_per_s=0, models=["sim-smollm2"]), rng=random.Random(0), log_path=log
    )
    provider = OpenAICompatProvider(config.cloud.providers[0], transport=httpx.ASGITransport(app=sim))
    saturated = ReplicaStats("smollm2-135m-instruct", "r1", "n", 0.0, 0.95, 4, 0, 0, 0, 364, 128)
    snapshot = ClusterSnapshot(taken_at=0.0, replicas=(saturated,), max_age_s=1e12)
    clock = iter(range(10**6))
    local = FakeEngine(answer="ok")
    dispatcher = Dispatcher(
        config,
        local,
        {"cloud-sim": provider},
        lambda: snapshot,
        poll_s=0.001,
        clocks=Clocks.of(lambda: float(next(clock))),
    )
    auth = authenticator_for(config, {"ACME_KEY": "sk-acme", "BANK_KEY": "sk-bank"})
    gateway = GatewayHTTP(
        local,
        [ServedModel("smollm2-135m-instruct", "llama", "cpu", 4096)],
        dispatcher,
        created=1,
        edge=EdgeSettings(authenticator=auth),
        parts=GatewayParts(policy=config.policy),
    )
    body = {"model": "smollm2-135m-instruct", "messages": [{"role": "user", "content": "hi"}]}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=gateway.app), base_url="http://gw") as c:
        bank = await c.post(
            "/v1/chat/completions", json=body, headers={"authorization": "Bearer sk-bank", "x-request-id": "bank-1"}
        )
        acme = await c.post(
            "/v1/chat/completions", json=body, headers={"authorization": "Bearer sk-acme", "x-request-id": "acme-1"}
        )
    assert bank.status_code == 429 and bank.json()["error"]["code"] == "local_capacity_exhausted"
    assert acme.status_code == 200 and acme.headers["x-spillover-route"] == "cloud"
    seen = [json.loads(line)["headers"].get("x-request-id") for line in log.read_text().splitlines()]
    assert seen == ["acme-1"]


def test_token_bucket_refills_at_its_rate() -> None:
    from router.limits.rate_limit import TokenBucket

    now = [0.0]
    bucket = TokenBucket(per_minute=60, burst=2, clock=lambda: now[0])
    assert [bucket.take(), bucket.take()] == [None, None]
    assert bucket.take() == pytest.approx(1.0)  # one token a second
    now[0] = 0.5
    assert bucket.take() == pytest.approx(0.5)
    now[0] = 1.0
    assert bucket.take() is None


async def test_tenant_over_its_rate_gets_429_with_retry_after() -> None:
    now = [30.0]  # half-way through the store's one-minute window
    tenants = [TenantPolicy("acme", requests_per_minute=2)]
    auth = Authenticator(tenants, {"acme": "sk-acme"})
    gateway = GatewayHTTP(
        FakeEngine(),
        [ServedModel("m", "llama", "cpu", 4096)],
        Recorder(),
        created=1,
        edge=EdgeSettings(authenticator=auth),
        parts=GatewayParts(tenant_limits=TenantLimits(store=MemoryStore(clock=lambda: now[0]))),
    )
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    key = {"authorization": "Bearer sk-acme"}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=gateway.app), base_url="http://gw") as c:
        codes = [(await c.post("/v1/chat/completions", json=body, headers=key)).status_code for _ in range(2)]
        limited = await c.post("/v1/chat/completions", json=body, headers=key)
        models = await c.get("/v1/models", headers=key)
    assert codes == [200, 200]
    assert limited.status_code == 429 and limited.json()["error"]["code"] == "tenant_rate_limited"
    assert int(limited.headers["retry-after"]) == 30  # until the window rolls over
    assert models.status_code == 429
