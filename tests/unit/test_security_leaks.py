"""What must not leak or be overwritten through the gateway: decision records, forwarded fields, error texts.

The harness (real dispatcher, pipeline, authenticator and provider adapter; stand-in engine and
provider server) is tests/unit/security_gateway.py.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from router.errors import TargetUnavailable
from router.learning.decision import DecisionStore
from serve_apps.learning.decision_log import JsonlFile
from serve_apps.providers.openai_compat import CHAT_FIELDS
from tests.fakes import FakeEngine
from tests.unit.security_gateway import APPS, CHAT, KEYS, OPS, OTHER, build, completion

# --- item 7: decision records are the tenant's own ------------------------------------------------------


async def test_decision_records_are_the_tenants_own() -> None:
    async with build().client() as c:
        made = await c.post("/v1/chat/completions", json=CHAT, headers={**APPS, "x-request-id": "shared-1"})
        own = await c.get("/v1/spillover/decisions/shared-1", headers=APPS)
        others = await c.get("/v1/spillover/decisions/shared-1", headers=OTHER)
        admin = await c.get("/v1/spillover/decisions/shared-1", headers=OPS)
    assert made.status_code == 200 and own.status_code == 200
    assert own.json()["request_id"] == "shared-1"
    assert others.status_code == 404 and admin.status_code == 404  # not theirs: as if it did not exist


async def test_decision_record_client_chosen_id_cannot_overwrite_another_tenants() -> None:
    gateway = build()
    async with gateway.client() as c:
        first = await c.post("/v1/chat/completions", json=CHAT, headers={**APPS, "x-request-id": "shared-1"})
        before = (await c.get("/v1/spillover/decisions/shared-1", headers=APPS)).json()
        local_only = {**OTHER, "x-request-id": "shared-1", "x-spillover-residency": "local_only"}
        second = await c.post("/v1/chat/completions", json=CHAT, headers=local_only)
        after = (await c.get("/v1/spillover/decisions/shared-1", headers=APPS)).json()
        theirs = await c.get(f"/v1/spillover/decisions/{second.headers['x-request-id']}", headers=OTHER)
    assert first.status_code == 200 and second.status_code == 200
    assert second.headers["x-request-id"] != "shared-1"  # the other tenant got a new id ...
    assert second.headers["x-spillover-request-id"] == second.headers["x-request-id"]  # ... and is told it
    assert "x-spillover-request-id" not in first.headers
    assert after == before  # the first tenant's record is untouched
    assert theirs.status_code == 200 and theirs.json()["contract"]["residency"] == "local_only"


async def test_decisions_kept_takes_effect() -> None:
    gateway = build(decisions=DecisionStore(max_records=2))
    async with gateway.client() as c:
        for i in range(3):
            await c.post("/v1/chat/completions", json=CHAT, headers={**APPS, "x-request-id": f"r{i}"})
        oldest = await c.get("/v1/spillover/decisions/r0", headers=APPS)
        newest = await c.get("/v1/spillover/decisions/r2", headers=APPS)
    assert len(gateway.decisions) == 2 and oldest.status_code == 404 and newest.status_code == 200


async def test_decisions_log_takes_effect(tmp_path: Path) -> None:
    log = tmp_path / "decisions.jsonl"
    gateway = build(decisions=DecisionStore(max_records=10, sink=JsonlFile(str(log))))
    async with gateway.client() as c:
        for i in range(3):
            await c.post("/v1/chat/completions", json=CHAT, headers={**APPS, "x-request-id": f"r{i}"})
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert [x["request_id"] for x in lines if "kind" not in x] == ["r0", "r1", "r2"]
    assert [x["kind"] for x in lines if "kind" in x] == ["snapshot"]  # the same snapshot for all three: once


async def test_decisions_log_failing_sink_never_fails_a_request(tmp_path: Path) -> None:
    unwritable = JsonlFile(str(tmp_path))  # a directory: every append raises IsADirectoryError
    gateway = build(decisions=DecisionStore(max_records=10, sink=unwritable))
    async with gateway.client() as c:
        response = await c.post("/v1/chat/completions", json=CHAT, headers={**APPS, "x-request-id": "r0"})
        record = await c.get("/v1/spillover/decisions/r0", headers=APPS)
    assert response.status_code == 200 and record.status_code == 200
    assert gateway.decisions.sink_failures == 1


# --- item 9: only what the target may receive is forwarded ----------------------------------------------


async def test_only_known_fields_and_documented_headers_reach_the_provider() -> None:
    gateway = build(saturated=True)
    body = {**CHAT, "store": True, "metadata": {"k": "v"}, "user": "alice", "x_unknown": 1, "temperature": 0.2}
    headers = {
        **APPS,
        "x-request-id": "req-9",
        "x-spillover-level": "L1",
        "cookie": "session=abc",
        "x-forwarded-for": "10.0.0.9",
        "x-custom-secret": "s3cret",
        "openai-organization": "org-clientchosen1",
    }
    async with gateway.client() as c:
        response = await c.post("/v1/chat/completions", json=body, headers=headers)
    assert response.status_code == 200 and response.headers["x-spillover-route"] == "cloud", response.text
    (sent,) = gateway.provider_requests
    payload = json.loads(sent.content)
    assert set(payload) <= CHAT_FIELDS
    assert {"store", "metadata", "user", "x_unknown"}.isdisjoint(payload)
    assert payload["temperature"] == 0.2 and payload["model"] == "sim-smollm2"
    assert sent.headers["authorization"] == "Bearer sk-provider-secret"  # the provider's key, not the tenant's
    assert sent.headers["x-request-id"] == "req-9"
    forwarded = {k.lower() for k in sent.headers} - {"host", "accept-encoding", "connection", "user-agent"}
    assert forwarded == {"x-request-id", "accept", "content-type", "content-length", "authorization"}


# --- item 14: error messages name no environment variable, internal host or account id -----------------


def _provider_error(status: int, message: str) -> Callable[[httpx.Request], httpx.Response]:
    return lambda request: httpx.Response(status, json={"error": {"message": message, "param": None}})


def _unreachable(request: httpx.Request) -> httpx.Response:
    raise httpx.ConnectError("connection to http://10.20.30.40:8443/v1 refused", request=request)


LEAKS = ("SIM_PROVIDER_KEY", "10.20.30.40", "org-Ab12Cd34Ef", "proj_9xYz8wVu7", "127.0.0.1", "http://")


@pytest.mark.parametrize(
    ("name", "provider", "env"),
    [
        ("key_variable_unset", completion, {**KEYS}),
        ("provider_429_names_org", _provider_error(429, "Rate limit reached in organization org-Ab12Cd34Ef"), None),
        ("provider_400_names_host", _provider_error(400, "upstream http://10.20.30.40:8443 proj_9xYz8wVu7"), None),
        ("provider_500_names_host", _provider_error(500, "backend 10.20.30.40 failed for org-Ab12Cd34Ef"), None),
        ("unreachable", _unreachable, None),
    ],
)
async def test_error_messages_name_no_env_var_host_or_account(
    name: str, provider: Callable[[httpx.Request], httpx.Response], env: dict[str, str] | None
) -> None:
    gateway = build(saturated=True, provider=provider, env=env)
    async with gateway.client() as c:
        response = await c.post("/v1/chat/completions", json=CHAT, headers=APPS)
    assert 400 <= response.status_code < 600 and response.status_code != 500, response.text
    text = response.text + response.headers.get("x-spillover-reason", "")
    assert not [leak for leak in LEAKS if leak in text], text


def dying_replica() -> FakeEngine:
    """Fails the way a Ray replica on another node does: TargetUnavailable quoting the node's address."""
    engine = FakeEngine(answer="ok")
    engine.fail = TargetUnavailable("replica on node 10.20.30.40 (http://10.20.30.40:8265) died")
    return engine


async def test_error_messages_fail_over_reason_and_decision_record_name_no_host() -> None:
    gateway = build(local=dying_replica(), attempts=3)  # local, local again (same-target retry), cloud
    async with gateway.client() as c:
        response = await c.post("/v1/chat/completions", json=CHAT, headers={**APPS, "x-request-id": "r1"})
        record = await c.get("/v1/spillover/decisions/r1", headers=APPS)
    assert response.status_code == 200 and response.headers["x-spillover-route"] == "cloud", response.text
    assert "failed before the first byte" in response.headers["x-spillover-reason"]
    assert "10.20.30.40" not in response.headers["x-spillover-reason"]
    assert record.status_code == 200 and "10.20.30.40" not in record.text
