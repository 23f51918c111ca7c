"""Idempotency-Key and the operator resilience routes, over the real Starlette app."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from cluster.config.deployment import parse_config
from router.errors import TargetUnavailable, UpstreamError
from router.request.auth import Authenticator, TenantPolicy
from router.request.idempotency import IdempotencyStore
from serve_apps.dispatch.interfaces import LocalDispatch
from serve_apps.gateway_parts import EdgeSettings, GatewayParts, OperatorParts
from serve_apps.http.idempotent import IdempotentReplies
from serve_apps.http.surface import GatewayHTTP
from serve_apps.resilience.routes import OpsRoutes
from serve_apps.resilience.state import Resilience
from serve_apps.state.memory import MemoryStore
from serve_apps.telemetry.metrics import GatewayMetrics
from tests.fakes import FakeClock, FakeEngine
from tests.unit.test_gateway_http import CHAT, MODELS


def resilience(clock: FakeClock) -> Resilience:
    config = parse_config(
        {
            "models": [{"alias": "small", "source": "prepared:x", "family": "llama"}],
            "cloud": {"providers": [{"name": "sim", "base_url": "http://127.0.0.1:1/v1"}]},
        },
        "test",
    )
    return Resilience(config, clock=clock)


def gateway(backend: FakeEngine, clock: FakeClock, res: Resilience, auth: Authenticator | None = None) -> GatewayHTTP:
    store = IdempotencyStore(MemoryStore(clock=clock), ttl_s=60)
    return GatewayHTTP(
        backend,
        MODELS,
        LocalDispatch(backend),
        created=1,
        edge=EdgeSettings(authenticator=auth),
        parts=GatewayParts(idempotent=IdempotentReplies(store, wait_s=1)),
        operator=OperatorParts(ops=OpsRoutes(res)),
    )


@pytest.fixture
async def setup() -> AsyncIterator[tuple[httpx.AsyncClient, FakeEngine, FakeClock, Resilience]]:
    backend, clock = FakeEngine(), FakeClock(1_800_000_000.0)
    res = resilience(clock)
    transport = httpx.ASGITransport(app=gateway(backend, clock, res).app)
    async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
        yield client, backend, clock, res


async def test_a_repeated_key_replays_the_first_answer_without_running_again(setup: Any) -> None:
    client, backend, clock, _ = setup
    first = await client.post("/v1/chat/completions", json=CHAT, headers={"idempotency-key": "order-1"})
    again = await client.post("/v1/chat/completions", json=CHAT, headers={"idempotency-key": "order-1"})
    assert first.status_code == again.status_code == 200
    assert again.json() == first.json()
    assert again.headers["x-spillover-idempotent-replay"] == "true"
    assert "x-spillover-idempotent-replay" not in first.headers
    assert again.headers["x-spillover-route"] == first.headers["x-spillover-route"]
    assert len(backend.calls) == 1
    clock.now += 61  # past the TTL: runs again
    await client.post("/v1/chat/completions", json=CHAT, headers={"idempotency-key": "order-1"})
    assert len(backend.calls) == 2


async def test_the_same_key_with_another_body_is_a_clear_400(setup: Any) -> None:
    client, _, _, _ = setup
    await client.post("/v1/chat/completions", json=CHAT, headers={"idempotency-key": "k"})
    other = {**CHAT, "messages": [{"role": "user", "content": "something else"}]}
    response = await client.post("/v1/chat/completions", json=other, headers={"idempotency-key": "k"})
    assert response.status_code == 400 and response.json()["error"]["code"] == "idempotency_key_reused"


async def test_failures_are_not_stored_so_the_key_can_be_retried(setup: Any) -> None:
    client, backend, _, _ = setup
    backend.fail = TargetUnavailable("down")
    failed = await client.post("/v1/chat/completions", json=CHAT, headers={"idempotency-key": "k"})
    assert failed.status_code == 503
    backend.fail = None
    ok = await client.post("/v1/chat/completions", json=CHAT, headers={"idempotency-key": "k"})
    assert ok.status_code == 200 and "x-spillover-idempotent-replay" not in ok.headers


async def test_a_streamed_answer_is_replayed_as_a_stream_and_a_failed_one_is_not_kept(setup: Any) -> None:
    client, backend, _, _ = setup
    streamed = {**CHAT, "stream": True}
    first = await client.post("/v1/chat/completions", json=streamed, headers={"idempotency-key": "s"})
    again = await client.post("/v1/chat/completions", json=streamed, headers={"idempotency-key": "s"})
    assert first.status_code == again.status_code == 200 and "data: [DONE]" in first.text
    assert again.text == first.text and again.headers["content-type"].startswith("text/event-stream")
    assert again.headers["x-spillover-idempotent-replay"] == "true"
    assert again.headers["x-spillover-route"] == first.headers["x-spillover-route"]
    assert len(backend.calls) == 1
    backend.fail_mid_stream = UpstreamError("engine died")
    broken = await client.post("/v1/chat/completions", json=streamed, headers={"idempotency-key": "f"})
    assert broken.status_code == 200 and '"error"' in broken.text  # the error event after the first byte
    backend.fail_mid_stream = None
    retried = await client.post("/v1/chat/completions", json=streamed, headers={"idempotency-key": "f"})
    assert "x-spillover-idempotent-replay" not in retried.headers and '"error"' not in retried.text
    assert len(backend.calls) == 3


async def test_bad_keys_are_refused_with_a_reason(setup: Any) -> None:
    client, backend, _, _ = setup
    long_key = await client.post("/v1/chat/completions", json=CHAT, headers={"idempotency-key": "x" * 300})
    assert long_key.status_code == 400 and long_key.json()["error"]["code"] == "invalid_idempotency_key"
    assert backend.calls == []


async def test_resilience_view_and_reset(setup: Any) -> None:
    client, _, _, res = setup
    res.health.get("cloud:sim").credential_failed("provider_auth_failed")
    view = (await client.get("/v1/spillover/resilience")).json()
    assert view["health"]["cloud:sim"]["state"] == "black" and view["health"]["cloud:sim"]["share"] == 0
    assert view["health"]["cloud:sim"]["transitions"][-1]["to"] == "black"
    bad = await client.post("/v1/spillover/resilience/reset", json={"target": "sim"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "target"
    done = await client.post("/v1/spillover/resilience/reset", json={"target": "cloud:sim"})
    assert done.status_code == 200 and "health:cloud:sim" in done.json()["reset"]
    assert res.health.get("cloud:sim").state.value == "green"


async def test_only_admin_tenants_may_reset() -> None:
    backend, clock = FakeEngine(), FakeClock(1_800_000_000.0)
    res = resilience(clock)
    auth = Authenticator(
        [TenantPolicy("ops", admin=True), TenantPolicy("app")], {"ops": "sk-ops-key", "app": "sk-app-key"}
    )
    transport = httpx.ASGITransport(app=gateway(backend, clock, res, auth).app)
    async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
        anonymous = await client.post("/v1/spillover/resilience/reset")
        app = await client.post("/v1/spillover/resilience/reset", headers={"authorization": "Bearer sk-app-key"})
        ops = await client.post("/v1/spillover/resilience/reset", headers={"authorization": "Bearer sk-ops-key"})
    assert anonymous.status_code == 401
    assert app.status_code == 403 and app.json()["error"]["code"] == "forbidden"
    assert ops.status_code == 200


async def test_probes_that_contradict_live_traffic_show_in_the_view_and_the_metrics(setup: Any) -> None:
    client, _, clock, res = setup
    machine = res.health.get("cloud:sim")
    machine.outcome(True)  # a live request succeeded ...
    clock.now += 1
    machine.probe("liveness", False)  # ... and a second later GET /models failed: live decides
    machine.probe_rejected("latency", "cloud provider 'sim' rejected the request (HTTP 400): content filter")
    view = (await client.get("/v1/spillover/resilience")).json()["health"]["cloud:sim"]
    assert view["state"] == "green" and view["half_open"] is False
    assert view["disagreement"] == "liveness probe failed while live requests succeed"
    probe, live = view["probes"]["liveness"], view["live"]
    assert (probe["ok"], probe["counted"], live["ok"]) == (False, False, True)
    assert probe["at"] - live["at"] == pytest.approx(1.0)  # wall-clock times, a second apart
    assert (view["probes_overruled_total"], view["probe_rejections_total"]) == (1, 1)
    assert "content filter" in view["last_probe_rejection"]

    metrics = GatewayMetrics()
    metrics.resilience(res.view())
    metrics.resilience(res.view())  # a second refresh counts nothing twice
    text = metrics.render().decode()
    assert 'spillover_health_disagreement{target="cloud:sim"} 1.0' in text
    assert 'spillover_probes_overruled_total{target="cloud:sim"} 1.0' in text
    assert 'spillover_probe_rejections_total{target="cloud:sim"} 1.0' in text


async def test_the_resilience_view_needs_an_admin_tenant() -> None:
    backend, clock = FakeEngine(), FakeClock(1_800_000_000.0)
    res = resilience(clock)
    auth = Authenticator([TenantPolicy("ops", admin=True), TenantPolicy("app")], {"ops": "sk-ops", "app": "sk-app"})
    transport = httpx.ASGITransport(app=gateway(backend, clock, res, auth).app)
    async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
        anonymous = await client.get("/v1/spillover/resilience")
        app = await client.get("/v1/spillover/resilience", headers={"authorization": "Bearer sk-app"})
        ops = await client.get("/v1/spillover/resilience", headers={"authorization": "Bearer sk-ops"})
    assert (anonymous.status_code, app.status_code, ops.status_code) == (401, 403, 200)
    assert "disagreement" in ops.json()["health"].get("cloud:sim", {"disagreement": None})


async def test_a_reset_of_one_provider_closes_its_configured_domain_and_tells_the_other_replicas() -> None:
    clock = FakeClock(1_800_000_000.0)
    providers = [
        {"name": "p", "base_url": "http://127.0.0.1:1/v1", "domain": "acct"},
        {"name": "q", "base_url": "http://127.0.0.1:2/v1", "domain": "acct"},
        {"name": "r", "base_url": "http://127.0.0.1:3/v1"},
    ]
    models = [{"alias": "small", "source": "prepared:x", "family": "llama"}]
    res = Resilience(parse_config({"models": models, "cloud": {"providers": providers}}, "test"), clock=clock)
    res.breakers.cool_domain("acct", 60.0)
    res.breakers.cool_domain("r", 60.0)
    told: list[str | None] = []

    async def on_reset(target: str | None) -> None:
        told.append(target)

    engine = FakeEngine()
    http = GatewayHTTP(
        engine, MODELS, LocalDispatch(engine), created=1, operator=OperatorParts(ops=OpsRoutes(res, on_reset=on_reset))
    )
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=http.app), base_url="http://gw") as client:
        done = await client.post("/v1/spillover/resilience/reset", json={"target": "cloud:p"})
    assert done.status_code == 200 and "domain:acct" in done.json()["reset"] and told == ["cloud:p"]
    assert res.breakers.allows("cloud:q/m", "acct")[0]
    assert not res.breakers.allows("cloud:r/m", "r")[0]
