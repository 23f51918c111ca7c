"""Time and bounds: breakers, quotas, rate limits and health run on a monotonic clock, a
provider's Retry-After is capped, and a rate limit below one request per minute is refused.

Two fake clocks stand in for `time.monotonic` and `time.time`: production builds `Resilience`
with exactly those two (its defaults), and the test steps only the wall clock, as NTP or an
operator would.
"""

from __future__ import annotations

import time

import pytest

from cluster.config.deployment import parse_config
from router.errors import ConfigError, ProviderRateLimited, TargetUnavailable, TenantRateLimited
from router.limits.rate_limit import TokenBucket
from router.request.auth import TenantPolicy
from router.routing.capabilities import Registry
from serve_apps.limits.tenants import TenantLimits, TenantRates
from serve_apps.resilience.prober import Prober
from serve_apps.resilience.state import Resilience
from serve_apps.state.memory import MemoryStore
from tests.fakes import FakeClock as Clock

CONFIG = {
    "models": [{"alias": "m", "source": "prepared:x", "family": "llama"}],
    "cloud": {"providers": [{"name": "sim", "base_url": "http://127.0.0.1:1/v1", "rpm": 2, "models": {"m": "m"}}]},
    "resilience": {"breaker": {"min_requests": 2, "open_s": 30}},
}


def _world() -> tuple[Resilience, Clock, Clock]:
    config = parse_config(CONFIG, "test")
    mono, wall = Clock(1000.0), Clock(1_800_000_000.0)
    return Resilience(config, clock=mono, wall=wall), mono, wall


async def _observe(res: Resilience) -> tuple[object, ...]:
    targets = Registry.from_config(res._config.models, res._config.cloud.providers).for_alias("m")
    local = next(t for t in targets if t.kind == "local")
    cloud = next(t for t in targets if t.kind == "cloud")
    quota = await res.quotas.try_reserve("sim", 1)
    return (
        res.breakers.states(),
        res.breakers.target(local.id).retry_in_s(),
        res.unavailable(targets),
        (await res.gate(cloud, has_alternative=False, tokens=1)).refused,
        type(quota).__name__,
        res.health.states(),
        res.budget.balance(),
    )


def test_resilience_defaults_to_the_monotonic_clock() -> None:
    res = Resilience(parse_config(CONFIG, "test"))
    assert res._clock is time.monotonic and res._wall is time.time
    assert res.breakers._clock is time.monotonic


@pytest.mark.parametrize("step_s", [-3600.0, 3600.0, -86400.0 * 365], ids=["back-1h", "forward-1h", "back-1y"])
async def test_wall_clock_step_back_changes_nothing(step_s: float) -> None:
    """An open breaker, a cooling domain, a full quota window, health and the retry budget read
    the same before and after the wall clock jumps."""
    res, _mono, wall = _world()
    targets = Registry.from_config(res._config.models, res._config.cloud.providers).for_alias("m")
    local = next(t for t in targets if t.kind == "local")
    cloud = next(t for t in targets if t.kind == "cloud")
    for _ in range(2):
        res.failed(local, TargetUnavailable("down"))  # opens the local breaker, health yellow
    res.failed(cloud, ProviderRateLimited("slow down", retry_after_s=20))  # cools the sim domain
    await res.quotas.try_reserve("sim", 1)
    res.budget.deposit()
    await _observe(res)  # creates what it reads (lazily made breakers) and fills the quota window
    before = await _observe(res)
    assert before[4] == "Refusal"
    assert before[0]["target:local:m"] == "open" and before[0]["domain:sim"] == "open"
    wall.now += step_s
    assert await _observe(res) == before


def test_breaker_export_speaks_wall_time_and_survives_a_step() -> None:
    """Peers exchange open-until times in wall time; each side converts at the border."""
    res, _mono, wall = _world()
    res.breakers.cool_domain("sim", 20.0)
    export = res.breakers.export()
    assert export["open"]["domain:sim"]["until"] == pytest.approx(wall.now + 20.0)
    peer, peer_mono, _peer_wall = _world()
    peer_mono.now = 5.0  # another process: its monotonic clock means nothing here
    assert peer.breakers.merge(export) == 1
    assert peer.breakers.domain("sim").retry_in_s() == pytest.approx(20.0)
    wall.now -= 3600  # a step on this replica after the export changes nothing here
    assert res.breakers.domain("sim").retry_in_s() == pytest.approx(20.0)


def test_view_shows_transition_times_as_wall_time() -> None:
    res, _mono, wall = _world()
    res.health.get("local:m").mark_down("stale")
    at = res.view()["health"]["local:m"]["transitions"][-1]["at"]
    assert at == pytest.approx(wall.now)


@pytest.mark.parametrize("given", [1e9, float("inf"), float("nan")])
def test_provider_retry_after_is_capped(given: float) -> None:
    """A Retry-After of days (or not a number) cools the domain for at most max_retry_after_s,
    and the client is told the capped value."""
    config = parse_config({**CONFIG, "resilience": {"retry": {"max_retry_after_s": 120}}}, "test")
    mono = Clock(0.0)
    res = Resilience(config, clock=mono, wall=Clock(0.0))
    cloud = next(
        t for t in Registry.from_config(config.models, config.cloud.providers).for_alias("m") if t.kind == "cloud"
    )
    error = ProviderRateLimited("slow down", retry_after_s=given)
    res.failed(cloud, error)
    assert error.retry_after_s == 120
    assert res.breakers.domain("sim").retry_in_s() == pytest.approx(120)
    mono.now = 121
    assert res.breakers.domain("sim").state == "half_open"


def test_retry_after_cap_defaults_to_300_s() -> None:
    assert parse_config(CONFIG, "test").resilience.retry.max_retry_after_s == 300


@pytest.mark.parametrize("rpm", [0.5, 0.01, 0])
def test_requests_per_minute_below_one_is_refused_by_config_validation(rpm: float) -> None:
    config = {**CONFIG, "tenants": [{"name": "t", "api_key_env": "T_KEY", "requests_per_minute": rpm}]}
    with pytest.raises(ConfigError) as caught:
        parse_config(config, "test.yaml")
    assert any("requests_per_minute" in field for field, _ in caught.value.problems)
    with pytest.raises(ValueError, match=">= 1"):
        TokenBucket(rpm)


async def test_tenant_rate_limit_ignores_wall_clock_steps() -> None:
    mono = Clock(0.0)
    rates = TenantRates(MemoryStore(clock=mono))
    tenant = TenantPolicy("t", requests_per_minute=1)
    await rates.check(tenant)
    with pytest.raises(TenantRateLimited):
        await rates.check(tenant)  # the wall clock is not read at all: only `mono` rolls the window over
    mono.now += 60
    await rates.check(tenant)


def test_the_gateways_own_store_runs_on_the_monotonic_clock() -> None:
    assert TenantLimits()._store._clock is time.monotonic  # type: ignore[attr-defined]


def test_prober_schedules_on_the_monotonic_clock() -> None:
    prober = Prober([], Resilience(parse_config(CONFIG, "test")).health, latency_slo_s=1, timeout_s=1)
    assert prober._clock is time.monotonic
