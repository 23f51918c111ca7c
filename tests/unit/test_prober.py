"""Health probes feed the health machines: liveness, latency (SLO), correctness, and black on a refused key."""

from __future__ import annotations

import asyncio
from typing import Any

from cluster.config import parse_config
from router.errors import TargetUnavailable, UpstreamError
from router.health import Health, HealthBoard, HealthSettings
from router.snapshot import ClusterSnapshot, ReplicaStats
from serve_apps.prober import ProbeCheck, Prober, cloud_checks, local_checks
from tests.fakes import FakeClock, FakeEngine, FakeProvider

T0 = 1_800_000_000.0


def config(**golden: Any) -> Any:
    model: dict[str, Any] = {"alias": "m", "source": "prepared:x", "family": "llama"}
    if golden:
        model["golden"] = golden
    return parse_config(
        {
            "models": [model],
            "resilience": {"health": {"liveness_probe_s": 1, "latency_probe_s": 5, "correctness_probe_s": 60}},
        },
        "test",
    )


def board(clock: FakeClock, **settings: Any) -> HealthBoard:
    return HealthBoard(HealthSettings(**settings), clock)


async def test_liveness_follows_fresh_stats_and_three_misses_make_the_model_red() -> None:
    clock = FakeClock(T0)
    stats = ReplicaStats("m", "r1", "n1", T0, 0.1, 0, 0, 0, 0, 364, 128)
    snapshot = ClusterSnapshot(taken_at=T0, replicas=(stats,), max_age_s=1.0)
    health = board(clock)
    checks = local_checks(config().models[0], config(), FakeEngine(), lambda: snapshot, clock)
    assert [c.level for c in checks] == ["liveness", "latency"]  # no golden: no correctness probe
    prober = Prober(checks, health, latency_slo_s=5, timeout_s=5, clock=clock)
    await prober.run_due(clock.now)
    assert prober.results[("local:m", "liveness")] is True
    for _ in range(3):  # the replica stopped pushing stats (stale after max_age_s = 1 s)
        clock.now += 1.5
        await prober.run_due(clock.now)
    assert health.get("local:m").state is Health.RED


async def test_checks_run_on_their_own_periods() -> None:
    clock, calls = FakeClock(T0), []

    async def check() -> bool:
        calls.append(clock.now)
        return True

    prober = Prober(
        [ProbeCheck("cloud:x", "liveness", 10, check)], board(clock), latency_slo_s=1, timeout_s=1, clock=clock
    )
    for _ in range(25):
        await prober.run_due(clock.now)
        clock.now += 1
    assert [t - T0 for t in calls] == [0, 10, 20]


async def test_a_slow_latency_probe_fails_it() -> None:
    clock = FakeClock(T0)

    async def slow() -> bool:
        await asyncio.sleep(0.2)
        return True

    health = board(clock)
    prober = Prober([ProbeCheck("cloud:x", "latency", 1, slow)], health, latency_slo_s=0.01, timeout_s=5, clock=clock)
    await prober.run_due(clock.now)
    assert prober.results[("cloud:x", "latency")] is False
    assert health.get("cloud:x").state is Health.YELLOW


async def test_the_golden_prompt_must_be_answered_right() -> None:
    clock = FakeClock(T0)
    cfg = config(prompt="What is the capital of France?", expect="paris")
    backend = FakeEngine(answer="The capital is Lyon.")
    alive = ClusterSnapshot(T0, (ReplicaStats("m", "r1", "n1", T0, 0.1, 0, 0, 0, 0, 364, 128),), 1.0)
    checks = local_checks(cfg.models[0], cfg, backend, lambda: alive, clock)
    correctness = next(c for c in checks if c.level == "correctness")
    assert await correctness.run() is False
    backend.answer = "PARIS."
    assert await correctness.run() is True
    assert backend.calls[-1][2]["messages"][0]["content"] == "What is the capital of France?"


async def test_a_refused_key_found_by_the_liveness_probe_makes_the_provider_black() -> None:
    clock = FakeClock(T0)
    health = board(clock)
    refused = UpstreamError("cloud provider 'sim' refused our credentials (HTTP 401)", code="provider_auth_failed")
    checks = [c for c in cloud_checks(FakeProvider(probe_error=refused), "m", config()) if c.level == "liveness"]
    await Prober(checks, health, latency_slo_s=1, timeout_s=1, clock=clock).run_due(clock.now)
    assert health.get("cloud:sim").state is Health.BLACK
    assert "provider_auth_failed" in health.get("cloud:sim").reason


async def test_an_unreachable_provider_is_a_failed_probe_not_black() -> None:
    clock = FakeClock(T0)
    health = board(clock)
    down = TargetUnavailable("unreachable", code="provider_unreachable")
    checks = [c for c in cloud_checks(FakeProvider(probe_error=down), "m", config()) if c.level == "liveness"]
    await Prober(checks, health, latency_slo_s=1, timeout_s=1, clock=clock).run_due(clock.now)
    assert health.get("cloud:sim").state is Health.YELLOW


async def test_a_model_not_up_yet_is_no_evidence_and_stays_green() -> None:
    clock = FakeClock(T0)
    health = board(clock)
    backend = FakeEngine()
    empty = ClusterSnapshot(taken_at=T0, replicas=(), max_age_s=1.0)
    checks = local_checks(config().models[0], config(), backend, lambda: empty, clock)
    prober = Prober(checks, health, latency_slo_s=5, timeout_s=5, clock=clock)
    for _ in range(10):  # the replica takes a while to start: no stats at all yet
        await prober.run_due(clock.now)
        clock.now += 5
    assert health.get("local:m").state is Health.GREEN
    assert prober.results[("local:m", "liveness")] is None and backend.calls == []  # no chat sent either
