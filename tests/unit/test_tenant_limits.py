"""Per-tenant concurrency limit and monthly budget: the config keys as hostile input, the spend
ledger's per-tenant month, `TenantLimits`, and the gateway's HTTP layer answering 429
tenant_concurrency_exceeded (with retry-after) and 402 tenant_budget_exceeded. Fake clocks; no
timing assertion."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.responses import StreamingResponse

from cluster.config.deployment import dump_config, load_config, parse_config
from cluster.config.tenants import authenticator_for
from router.errors import ConfigError, TenantBudgetExceeded, TenantConcurrencyExceeded
from router.request.auth import TenantPolicy
from router.request.openai_request import Kind
from serve_apps.backend import BackendReply
from serve_apps.dispatch.interfaces import LocalDispatch
from serve_apps.gateway_parts import EdgeSettings, GatewayParts
from serve_apps.http.surface import GatewayHTTP, ServedModel
from serve_apps.limits.spend_ledger import SpendLedger
from serve_apps.limits.tenants import TenantLimits
from tests.fakes import FakeClock as Clock

REPO = Path(__file__).resolve().parents[2]
MODEL = "smollm2-135m-instruct"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
KEYS = {"APPS_KEY": "sk-apps-tenant", "RICH_KEY": "sk-rich-tenant"}
APPS, RICH = ({"authorization": f"Bearer {k}"} for k in KEYS.values())


def raw_config(**tenant: Any) -> dict[str, Any]:
    raw = dump_config(load_config(REPO / "configs/local.yaml"))
    raw["gateway"]["auth"] = True
    raw["tenants"] = [
        {"name": "apps", "api_key_env": "APPS_KEY", **tenant},
        {"name": "rich", "api_key_env": "RICH_KEY"},
    ]
    return raw


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("max_concurrent", 0),
        ("max_concurrent", -1),
        ("max_concurrent", 2.5),
        ("max_concurrent", "3"),
        ("max_concurrent", True),
        ("max_concurrent", [1]),
        ("monthly_budget_usd", 0),
        ("monthly_budget_usd", -10),
        ("monthly_budget_usd", float("nan")),
        ("monthly_budget_usd", float("inf")),
        ("monthly_budget_usd", "50"),
        ("monthly_budget_usd", True),
        ("monthly_budget_usd", {"usd": 5}),
    ],
)
def test_hostile_tenant_limits_are_config_errors_naming_the_field(key: str, value: Any) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(raw_config(**{key: value}), "tenants.yaml")
    assert any(field == f"tenants[0].{key}" for field, _ in caught.value.problems), caught.value.problems


def test_valid_tenant_limits_reach_the_tenant_policy() -> None:
    config = parse_config(raw_config(max_concurrent=3, monthly_budget_usd=50), "tenants.yaml")
    auth = authenticator_for(config, KEYS)
    assert auth is not None
    tenant = auth.authenticate(APPS["authorization"])
    assert tenant.max_concurrent == 3 and tenant.monthly_budget_usd == 50.0
    assert auth.authenticate(RICH["authorization"]).max_concurrent is None


def ts(*date: int) -> float:
    return datetime(*date, tzinfo=UTC).timestamp()  # type: ignore[misc]


def test_the_ledger_sums_each_tenants_month(tmp_path: Path) -> None:
    clock = Clock(ts(2026, 11, 1))
    ledger = SpendLedger(tmp_path / "spend.db", clock=clock)
    ledger.add("r1", "cloud:a/m", "a", "ok", 1.5, "apps")
    ledger.add("r2", "cloud:a/m", "a", "error", 0.5, "apps")
    ledger.add("r3", "cloud:a/m", "a", "ok", 2.0, "rich")
    ledger.add("r4", "cloud:a/m", "a", "ok", 9.0)  # auth off: no tenant
    clock.now = ts(2026, 10, 31, 23)
    ledger.add("r0", "cloud:a/m", "a", "ok", 100.0, "apps")  # last month
    clock.now = ts(2026, 11, 20)
    assert ledger.recent_tenant_totals() == {"apps": 2.0, "rich": 2.0}
    assert ledger.month_total() == 13.0


def test_a_ledger_from_before_the_tenant_column_gets_it(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    with sqlite3.connect(path) as conn:
        conn.execute(
            "CREATE TABLE spend (id INTEGER PRIMARY KEY AUTOINCREMENT, at REAL NOT NULL, request_id TEXT NOT NULL, "
            "target_id TEXT NOT NULL, provider TEXT NOT NULL, outcome TEXT NOT NULL, cost_usd REAL NOT NULL)"
        )
        conn.execute("INSERT INTO spend VALUES (1, ?, 'old', 'cloud:a/m', 'a', 'ok', 3.0)", (ts(2026, 11, 2),))
    ledger = SpendLedger(path, clock=Clock(ts(2026, 11, 3)))
    ledger.add("new", "cloud:a/m", "a", "ok", 1.0, "apps")
    assert ledger.month_total() == 4.0 and ledger.month_tenant_totals() == {"apps": 1.0}


def policy(**limits: Any) -> TenantPolicy:
    return TenantPolicy("apps", **limits)


async def test_concurrency_slots_are_counted_and_released_once() -> None:
    limits = TenantLimits()
    first, second = await limits.admit(policy(max_concurrent=2)), await limits.admit(policy(max_concurrent=2))
    with pytest.raises(TenantConcurrencyExceeded) as caught:
        await limits.admit(policy(max_concurrent=2))
    assert caught.value.status_code == 429 and caught.value.retry_after_s == 1.0
    assert caught.value.code == "tenant_concurrency_exceeded"
    first.release()
    first.release()  # twice: still one slot given back
    assert limits.inflight("apps") == 1
    await limits.leases.flush()
    await limits.admit(policy(max_concurrent=2))
    second.release()
    assert limits.inflight("apps") == 1
    assert await limits.admit(None) is not None  # auth off: nothing to count


async def test_the_budget_refuses_once_the_month_spend_reached_it() -> None:
    spend = {"apps": 49.99}
    limits = TenantLimits(lambda: spend)
    (await limits.admit(policy(monthly_budget_usd=50.0))).release()
    spend["apps"] = 50.0
    with pytest.raises(TenantBudgetExceeded) as caught:
        await limits.admit(policy(monthly_budget_usd=50.0))
    assert caught.value.status_code == 402 and caught.value.code == "tenant_budget_exceeded"
    assert "$50.00" in caught.value.message
    (await limits.admit(TenantPolicy("rich"))).release()  # no budget configured: never refused
    assert limits.inflight("apps") == 0  # a refusal holds no slot


async def test_a_stream_holds_its_slot_until_it_was_sent() -> None:
    limits = TenantLimits()
    slot = await limits.admit(policy(max_concurrent=1))
    seen: list[int] = []

    async def events() -> AsyncIterator[str]:
        for _ in range(3):
            seen.append(limits.inflight("apps"))
            yield "data: {}\n\n"

    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async def receive() -> dict[str, Any]:
        await asyncio.Event().wait()  # the client stays
        return {"type": "http.disconnect"}

    response = slot.held(StreamingResponse(events(), media_type="text/event-stream"))
    await response({"type": "http", "asgi": {"spec_version": "2.4"}}, receive, send)  # type: ignore[arg-type]
    assert seen == [1, 1, 1] and limits.inflight("apps") == 0
    assert sent[0]["status"] == 200 and sent[-1] == {"type": "http.response.body", "body": b"", "more_body": False}


class GatedBackend:
    """A local engine whose answers wait until the test opens the gate."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.calls = 0

    async def call(self, alias: str, kind: Kind, body: dict[str, Any], request_id: str) -> BackendReply:
        self.calls += 1
        await self.gate.wait()
        message = {"role": "assistant", "content": "ok"}
        return BackendReply(body={"object": "chat.completion", "choices": [{"index": 0, "message": message}]})

    async def check_health(self, alias: str, timeout_s: float) -> str | None:
        return None


def gateway(backend: GatedBackend, spend: dict[str, float], **tenant: Any) -> httpx.AsyncClient:
    config = parse_config(raw_config(**tenant), "tenants.yaml")
    http = GatewayHTTP(
        backend,
        [ServedModel(MODEL, "llama", "cpu", 4096)],
        LocalDispatch(backend),
        created=0,
        edge=EdgeSettings(authenticator=authenticator_for(config, KEYS)),
        parts=GatewayParts(tenant_limits=TenantLimits(lambda: spend)),
    )
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=http.app), base_url="http://gw")


async def test_the_gateway_answers_429_with_retry_after_past_max_concurrent() -> None:
    backend = GatedBackend()
    async with gateway(backend, {}, max_concurrent=1) as client:
        first = asyncio.create_task(client.post("/v1/chat/completions", json=CHAT, headers=APPS))
        while backend.calls == 0:
            await asyncio.sleep(0)
        refused = await client.post("/v1/chat/completions", json=CHAT, headers=APPS)
        other = asyncio.create_task(client.post("/v1/chat/completions", json=CHAT, headers=RICH))
        backend.gate.set()
        assert (await first).status_code == 200 and (await other).status_code == 200
        again = await client.post("/v1/chat/completions", json=CHAT, headers=APPS)
    assert refused.status_code == 429 and refused.headers["retry-after"] == "1"
    error = refused.json()["error"]
    assert error["code"] == "tenant_concurrency_exceeded" and error["type"] == "rate_limit_error"
    assert again.status_code == 200 and backend.calls == 3


async def test_the_gateway_answers_402_once_the_budget_is_spent() -> None:
    backend = GatedBackend()
    backend.gate.set()
    spend = {"apps": 10.0}
    async with gateway(backend, spend, monthly_budget_usd=10) as client:
        refused = await client.post("/v1/chat/completions", json=CHAT, headers=APPS)
        other = await client.post("/v1/chat/completions", json=CHAT, headers=RICH)
        spend["apps"] = 9.0
        allowed = await client.post("/v1/chat/completions", json=CHAT, headers=APPS)
        models = await client.get("/v1/models", headers=APPS)
    assert refused.status_code == 402 and "retry-after" not in refused.headers
    assert refused.json()["error"]["code"] == "tenant_budget_exceeded"
    assert refused.json()["error"]["type"] == "insufficient_quota"
    assert other.status_code == allowed.status_code == models.status_code == 200
    assert backend.calls == 2
