"""The same fault sequence routes the same way whether it starts 10 s or 5 minutes after start-up,
and a provider back from a 60 s outage gets traffic again within 30 s, on the default settings.

Real parts: the dispatcher, the resilience state (breakers, health machines), the Prober with the
real cloud checks, the OpenAI-compatible provider adapter, and two cloud-sim apps reached through
`httpx.ASGITransport`. The primary's `outage` fault answers 503 to chat and to `GET /v1/models`, as
a provider that is down does, so probes and traffic both meet it. Fake: the clock (one for breakers,
health, the probe schedule and cloud-sim; backoff sleeps do not advance it) and the local model,
which is never a candidate (the requests carry a tool it lacks).

The probes run from start-up (every 0.5 s a pass, as the gateway's loop does every 0.25 s); the same
traffic, one request a second, starts 10 s before the fault. Only how long the probes have been
running differs: 10 s, 17.5 s (off their 10 s and 30 s phases) or 5 minutes.
"""

from __future__ import annotations

import random
from typing import Any

import httpx
import pytest

from bench.cloud_sim.server import build_app
from bench.cloud_sim.settings import SimSettings
from cluster.config.deployment import SpilloverConfig, parse_config
from router.request.contract import derive_contract
from router.routing.policy import Policy
from router.routing.snapshot import ClusterSnapshot
from serve_apps.backend import BackendReply
from serve_apps.clocks import Clocks
from serve_apps.dispatch.dispatcher import Dispatcher
from serve_apps.dispatch.parts import DispatchParts
from serve_apps.providers import OpenAICompatProvider
from serve_apps.resilience.prober import Prober, cloud_checks
from serve_apps.resilience.state import Resilience
from tests.fakes import FakeClock

T0 = 1_800_000_000.0
OUTAGE_S = 60
TOOLS = {
    "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
    "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}],
    "max_tokens": 16,
}


def config() -> SpilloverConfig:
    caps = {
        "snapshot": "m-2026-11",
        "context_window": 32768,
        "region": "us",
        "tools": True,
        "json_schema": True,
        "price_out_per_mtok": 2.0,
    }
    providers = [
        {"name": name, "base_url": f"https://{name}.sim/v1", "models": {"m": {"name": "sim-m", **caps, **price}}}
        for name, price in (("a", {"price_in_per_mtok": 0.1}), ("b", {"price_in_per_mtok": 5.0}))
    ]
    model = {"alias": "m", "source": "prepared:x", "family": "llama", "engine_args": {"max_model_len": 4096}}
    return parse_config({"models": [model], "cloud": {"providers": providers}}, "test (default resilience)")


class NoLocal:
    async def call(self, alias: str, kind: str, body: dict[str, Any], request_id: str) -> BackendReply:
        raise AssertionError("the local model cannot take tool requests")

    async def check_health(self, alias: str, timeout_s: float) -> str | None:
        return None


async def _no_sleep(seconds: float) -> None:
    return None


async def routes(fault_at: float, seconds: float) -> list[tuple[float, str]]:
    """(seconds since the fault began, target) of every request. Probes run from start-up; requests,
    one a second, from 10 s before the fault until `seconds` after it began."""
    clock = FakeClock(T0)
    cfg = config()
    sims = {
        name: build_app(
            SimSettings(models=("sim-m",), ttft_s=0, tokens_per_s=0), rng=random.Random(1), clock=clock, sleep=_no_sleep
        )
        for name in ("a", "b")
    }
    providers = {
        p.name: OpenAICompatProvider(p, transport=httpx.ASGITransport(app=sims[p.name])) for p in cfg.cloud.providers
    }
    resilience = Resilience(cfg, clock=clock, wall=clock, rng=random.Random(7))
    empty = ClusterSnapshot(taken_at=T0, replicas=(), max_age_s=1.0)
    dispatcher = Dispatcher(
        cfg,
        NoLocal(),
        providers,
        lambda: empty,
        clocks=Clocks.of(clock, sleep=_no_sleep),
        parts=DispatchParts(resilience=resilience),
    )
    health = cfg.resilience.health
    checks = [check for provider in providers.values() for check in cloud_checks(provider, "m", cfg)]
    prober = Prober(
        checks,
        resilience.health,
        latency_slo_s=health.latency_slo_s,
        timeout_s=health.probe_timeout_s,
        recovery_probe_s=health.recovery_probe_s,
        clock=clock,
    )
    primary = sims["a"].state.cloud_sim
    seen: list[tuple[float, str]] = []
    for step in range(int((fault_at + seconds) * 2)):
        t = step / 2
        clock.now = T0 + t
        primary.settings = primary.initial_settings.merged({"outage": fault_at <= t < fault_at + OUTAGE_S})
        await prober.run_due(clock.now)
        if (t - fault_at) % 1 == 0 and t >= fault_at - 10:  # probes ran since start-up; the same traffic
            contract = derive_contract({"model": "m", **TOOLS}, {}, Policy())
            done = await dispatcher.dispatch("chat", dict(TOOLS), f"r{step}", contract=contract, deadline_s=30)
            seen.append((t - fault_at, done.target))
    for provider in providers.values():
        await provider.aclose()
    return seen


async def test_a_provider_back_from_a_60s_outage_gets_traffic_within_30s() -> None:
    seen = await routes(fault_at=10, seconds=150)
    assert {target for t, target in seen if t < 0} == {"cloud:a"}
    assert {target for t, target in seen if 5 <= t < OUTAGE_S} == {"cloud:b"}  # every request answered by b
    back = min(t for t, target in seen if t >= OUTAGE_S and target == "cloud:a")
    assert back - OUTAGE_S <= 30, seen
    assert {target for t, target in seen if t >= OUTAGE_S + 60} == {"cloud:a"}  # ramp complete, all back


@pytest.mark.parametrize("later", [300.0, 17.5])
async def test_the_same_faults_route_the_same_way_whenever_they_start(later: float) -> None:
    early = await routes(fault_at=10, seconds=150)
    assert await routes(fault_at=later, seconds=150) == early
