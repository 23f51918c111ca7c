"""A cloud attempt cut by `gateway.request_timeout_s`, over the gateway's real HTTP layer: the client gets
`504 request_timeout`, and the attempt is not forgotten — it is in the decision record (`cancelled`, error
`request_timeout`, its estimated tokens and cost), charged in the spend ledger at that estimate (a provider
may finish, and bill, a request whose caller left), settled in the provider's quota window, and the
half-open breaker trial it held is free again. Health and breakers hear no verdict.

Stand-ins: FakeEngine as the saturated local model, and a provider (httpx.MockTransport, async) that
accepts the request and never answers, as a hung upstream does; everything else is the real code.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from pathlib import Path

import httpx
import pytest

from cluster.config.deployment import dump_config, load_config, parse_config
from router.routing.capabilities import Registry
from router.routing.snapshot import ClusterSnapshot, ReplicaStats
from serve_apps.clocks import Clocks
from serve_apps.dispatch.dispatcher import Dispatcher
from serve_apps.dispatch.parts import DispatchParts
from serve_apps.gateway_parts import EdgeSettings, GatewayParts
from serve_apps.http.surface import GatewayHTTP, ServedModel
from serve_apps.limits.spend_ledger import SpendLedger
from serve_apps.providers import OpenAICompatProvider
from serve_apps.resilience.state import Resilience
from tests.fakes import FakeClock, FakeEngine
from tests.unit.security_gateway import CHAT, MODEL, REPO

TIMEOUT_S = 0.3  # the gateway's request timeout here; the provider never answers


class Hung:
    """A provider that takes the request and never answers; notes when the gateway gave up on it."""

    def __init__(self) -> None:
        self.received = 0
        self.cancelled = 0

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        self.received += 1
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        raise AssertionError("unreachable")


@pytest.mark.timeout(60)
async def test_cloud_attempt_cut_by_timeout_is_recorded_charged_and_releases_quota(tmp_path: Path) -> None:
    raw = dump_config(load_config(REPO / "configs/local.yaml"))
    raw["cloud"]["providers"][0].update(enabled=True, api_key_env=None, rpm=100, tpm=100_000)
    raw["resilience"] = {"retry": {"max_attempts": 1}, "probes": False}
    cfg = parse_config(raw, "test")
    mono, wall = FakeClock(100.0), FakeClock(1_800_000_000.0)
    spend = SpendLedger(tmp_path / "spend.sqlite", clock=wall)
    resilience = Resilience(cfg, clock=mono, wall=wall, spend=spend)
    hung = Hung()
    provider = OpenAICompatProvider(cfg.cloud.providers[0], transport=httpx.MockTransport(hung), env={})
    replica = ReplicaStats(MODEL, "r1", "n1", 0.0, 0.99, 0, 0, 0, 0, 364, 128)  # saturated: it bursts
    snapshot = ClusterSnapshot(taken_at=0.0, replicas=(replica,), max_age_s=1e12)
    local = FakeEngine()
    dispatcher = Dispatcher(
        cfg,
        local,
        {"cloud-sim": provider},
        lambda: snapshot,
        clocks=Clocks.of(mono, wall=wall),
        parts=DispatchParts(resilience=resilience),
    )
    http = GatewayHTTP(
        local,
        [ServedModel(MODEL, "llama", "cpu", 4096)],
        dispatcher,
        created=1,
        edge=EdgeSettings(request_timeout_s=TIMEOUT_S),
        parts=GatewayParts(policy=cfg.policy, decisions=dispatcher.decisions),
    )
    cloud = next(t for t in Registry.from_config(cfg.models, cfg.cloud.providers).for_alias(MODEL) if t.provider)
    breaker = resilience.breakers.target(cloud.id)
    breaker.cool(5.0)  # open, then half-open: the request below is its one trial
    mono.now += 6.0
    assert breaker.state == "half_open" and breaker.can_allow()

    started = time.monotonic()
    transport = httpx.ASGITransport(app=http.app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://gw", timeout=30) as client:
        body = {**CHAT, "max_tokens": 50}
        response = await client.post("/v1/chat/completions", json=body, headers={"x-request-id": "cut-1"})
    assert time.monotonic() - started < 30
    assert response.status_code == 504 and response.json()["error"]["code"] == "request_timeout"
    assert hung.received == 1 and hung.cancelled == 1  # the upstream call itself was abandoned

    record = dispatcher.decisions.get("cut-1")
    assert record is not None and record.reason == "cut by gateway.request_timeout_s"
    (attempt,) = record.attempts
    assert (attempt.target, attempt.outcome, attempt.error, attempt.usage) == (
        cloud.id,
        "cancelled",
        "request_timeout",
        "estimated",
    )
    assert attempt.completion_tokens == 50 and attempt.prompt_tokens > 0 and (attempt.cost_usd or 0) > 0
    assert record.started_at == 1_800_000_000.0  # a timestamp for people: the wall clock

    spend.flush()
    with sqlite3.connect(spend.path) as conn:
        rows = conn.execute("SELECT request_id, target_id, outcome, cost_usd FROM spend").fetchall()
    assert rows == [("cut-1", cloud.id, "cancelled", pytest.approx(attempt.cost_usd))]

    requests, tokens = resilience.quotas.usage()["cloud-sim"]
    assert requests == 1 and tokens == attempt.prompt_tokens + attempt.completion_tokens  # settled, not leaked
    assert breaker.state == "half_open" and breaker.can_allow()  # the trial slot is free; no verdict
    assert resilience.health.get(cloud.endpoint).state.value == "green"
