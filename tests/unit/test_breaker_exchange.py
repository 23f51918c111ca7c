"""Two gateway replicas share breakers through the exchange: the bound, resets, bad peers."""

from __future__ import annotations

from typing import Any

from router.resilience.breaker import Breakers, BreakerSettings
from serve_apps.resilience.breaker_exchange import RESETS_KEPT, BreakerExchange, BreakerSync
from tests.fakes import FakeClock

PERIOD_S = 0.5


def replica(name: str, exchange: BreakerExchange, clock: FakeClock) -> tuple[Breakers, BreakerSync]:
    breakers = Breakers(BreakerSettings(min_requests=2, failure_ratio=0.5, open_s=10), clock)

    async def swap(r: str, export: dict[str, Any], epoch: int) -> tuple[int, list[dict[str, Any]]]:
        return exchange.swap(r, export, epoch)

    return breakers, BreakerSync(breakers, swap, name, period_s=PERIOD_S)


async def tick(clock: FakeClock, *syncs: BreakerSync) -> None:
    """One sync period: every replica exchanges once, in order."""
    for sync in syncs:
        await sync.once()
    clock.now += PERIOD_S


async def test_a_breaker_opened_on_one_replica_is_honoured_by_the_other_within_two_periods() -> None:
    clock = FakeClock(1_800_000_000.0)
    exchange = BreakerExchange(clock)
    a, sync_a = replica("a", exchange, clock)
    b, sync_b = replica("b", exchange, clock)
    await tick(clock, sync_b, sync_a)  # b pulls before a pushes: the worst order for the bound
    opened_at = clock.now
    a.record("cloud:sim/m", "sim", ok=False)
    a.record("cloud:sim/m", "sim", ok=False)
    assert not a.allows("cloud:sim/m", "sim")[0]
    assert b.allows("cloud:sim/m", "sim")[0]
    honoured_at = None
    for _ in range(4):
        await tick(clock, sync_b, sync_a)
        if not b.allows("cloud:sim/m", "sim")[0]:
            honoured_at = clock.now
            break
    assert honoured_at is not None and honoured_at - opened_at <= 2 * PERIOD_S


async def test_a_429_cooling_travels_too() -> None:
    clock = FakeClock(1_800_000_000.0)
    exchange = BreakerExchange(clock)
    a, sync_a = replica("a", exchange, clock)
    b, sync_b = replica("b", exchange, clock)
    a.cool_domain("sim", 5.0)
    await tick(clock, sync_a, sync_b)
    allowed, why = b.allows("cloud:sim/other-model", "sim")
    assert not allowed and "cooling" in why
    clock.now += 5.0
    assert b.allows("cloud:sim/other-model", "sim")[0]  # expires on its own, no further sync needed


async def test_an_operator_reset_is_not_undone_by_the_other_replicas_copies() -> None:
    clock = FakeClock(1_800_000_000.0)
    exchange = BreakerExchange(clock)
    a, sync_a = replica("a", exchange, clock)
    b, sync_b = replica("b", exchange, clock)
    a.cool_domain("sim", 60.0)
    await tick(clock, sync_a, sync_b)
    assert not b.allows("cloud:sim/m", "sim")[0]
    a.reset()
    exchange.reset()  # what POST /v1/spillover/resilience/reset does
    await tick(clock, sync_b, sync_a)  # b learns of the reset before a pulls b's stale copy
    await tick(clock, sync_b, sync_a)
    assert a.allows("cloud:sim/m", "sim")[0] and b.allows("cloud:sim/m", "sim")[0]


async def test_a_peer_with_a_foreign_export_is_skipped() -> None:
    clock = FakeClock(1_800_000_000.0)
    exchange = BreakerExchange(clock)
    _, sync_a = replica("a", exchange, clock)
    exchange.swap("old-version", {"version": 99, "open": {}}, 0)
    assert await sync_a.once() == 0  # logged and skipped, no exception


def test_silent_replicas_are_forgotten() -> None:
    clock = FakeClock(1_800_000_000.0)
    exchange = BreakerExchange(clock, forget_after_s=60)
    exchange.swap("gone", {"version": 1, "open": {}}, 0)
    clock.now += 61
    assert exchange.swap("here", {"version": 1, "open": {}}, 0) == (0, [])


def shared_domains(name: str, exchange: BreakerExchange, clock: FakeClock) -> tuple[Breakers, BreakerSync]:
    """A replica whose providers p and q share the failure domain `acct`; r has its own."""
    settings = BreakerSettings(min_requests=2, failure_ratio=0.5, open_s=10)
    breakers = Breakers(settings, clock, failure_domains={"p": "acct", "q": "acct", "r": "r"})

    async def swap(r: str, export: dict[str, Any], epoch: int) -> tuple[int, list[dict[str, Any]]]:
        return exchange.swap(r, export, epoch)

    async def resets_since(epoch: int) -> tuple[int, list[str | None]]:
        return exchange.resets_since(epoch)

    return breakers, BreakerSync(breakers, swap, name, period_s=PERIOD_S, resets_since=resets_since)


async def test_a_reset_of_one_provider_leaves_another_domains_open_breaker_open_on_every_replica() -> None:
    clock = FakeClock(1_800_000_000.0)
    exchange = BreakerExchange(clock)
    a, sync_a = shared_domains("a", exchange, clock)
    b, sync_b = shared_domains("b", exchange, clock)
    a.cool_domain("acct", 60.0)
    a.cool_domain("r", 60.0)
    await tick(clock, sync_a, sync_b)
    assert not b.allows("cloud:q/m", "acct")[0] and not b.allows("cloud:r/m", "r")[0]
    a.reset("cloud:p")
    exchange.reset("cloud:p")  # what POST /v1/spillover/resilience/reset {"target": "cloud:p"} does
    for _ in range(3):
        await tick(clock, sync_b, sync_a)
    for replica_breakers in (a, b):
        assert replica_breakers.allows("cloud:p/m", "acct")[0] and replica_breakers.allows("cloud:q/m", "acct")[0]
        allowed, why = replica_breakers.allows("cloud:r/m", "r")
        assert not allowed and "cooling" in why


async def test_a_replica_that_missed_several_resets_applies_each() -> None:
    clock = FakeClock(1_800_000_000.0)
    exchange = BreakerExchange(clock)
    a, sync_a = shared_domains("a", exchange, clock)
    for domain in ("acct", "r", "s"):
        a.cool_domain(domain, 60.0)
    await tick(clock, sync_a)
    exchange.reset("cloud:p")
    exchange.reset("cloud:r")
    await tick(clock, sync_a)
    assert a.allows("cloud:p/m", "acct")[0] and a.allows("cloud:r/m", "r")[0]
    assert not a.allows("cloud:s/m", "s")[0]


def test_the_exchange_answers_everything_for_resets_it_no_longer_keeps() -> None:
    exchange = BreakerExchange(FakeClock(1_800_000_000.0))
    assert exchange.resets_since(0) == (0, [])
    exchange.reset("cloud:p")
    exchange.reset()
    assert exchange.resets_since(0) == (2, ["cloud:p", None]) and exchange.resets_since(1) == (2, [None])
    for _ in range(RESETS_KEPT):
        exchange.reset("cloud:p")
    assert exchange.resets_since(0) == (exchange.epoch, [None])
    assert exchange.resets_since(exchange.epoch - 1) == (exchange.epoch, ["cloud:p"])
