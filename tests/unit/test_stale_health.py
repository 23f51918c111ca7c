"""Stale telemetry: it diverts traffic while it lasts, but health reddens only on sustained
evidence (serve_apps/resilience/state.py `watch_local`; README "Resilience").

The snapshot is built exactly as the board poller builds it (`ClusterSnapshot` of the replicas'
last pushed `ReplicaStats`, each stamped with the wall time it was read); the clock is fake.
"""

from __future__ import annotations

from dataclasses import replace

from router.resilience.health import Health
from router.routing.snapshot import ClusterSnapshot, ReplicaStats
from tests.unit.test_dispatch_resilience import T0, World, setup

CHAT = {"messages": [{"role": "user", "content": "hi"}]}
FRESH = ReplicaStats("m", "r1", "n1", T0, 0.1, 0, 0, 0, 0, 364, 128)


class StaleOnce(World):
    """The replica's stats are as fresh as the clock, except while `late_by` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.late_by = 0.0

    def snapshot(self) -> ClusterSnapshot:
        replica = replace(FRESH, read_at=self.now - self.late_by)
        return ClusterSnapshot(taken_at=self.now, replicas=(replica,), max_age_s=1.0)


def _setup() -> tuple[object, StaleOnce]:
    s = setup()
    world = StaleOnce()
    s.dispatcher._snapshot = world.snapshot
    s.dispatcher._clock = s.dispatcher._wall = world.clock
    s.world = world
    return s, world


async def test_one_stale_reading_does_not_turn_local_red() -> None:
    s, world = _setup()
    assert (await s.send("r0", CHAT)).route == "local"  # type: ignore[attr-defined]
    world.late_by = 3.0  # one late stats push: every replica stale for 2 s past max_age_s
    diverted = await s.send("r1", CHAT)  # type: ignore[attr-defined]
    assert diverted.route == "cloud"  # traffic diverted while it lasts (as before)
    machine = s.resilience.health.get("local:m")  # type: ignore[attr-defined]
    assert machine.state is Health.GREEN and machine.transitions == []
    world.late_by = 0.0  # the next push arrives
    world.now += 1.0
    back = await s.send("r2", CHAT)  # type: ignore[attr-defined]
    assert back.route == "local"  # at once: no red cool-down, no ramp
    assert machine.state is Health.GREEN


def stop_pushing_for(world: StaleOnce, late: float) -> None:
    """The replica's last push was `late` seconds ago: time passes, the reading stays."""
    world.now += late - world.late_by
    world.late_by = late


async def test_sustained_staleness_turns_local_red() -> None:
    s, world = _setup()
    assert (await s.send("r0", CHAT)).route == "local"  # type: ignore[attr-defined]
    for late in (3.0, 15.0, 30.0):  # still below max_age_s + stale_red_s (1 + 30 s)
        stop_pushing_for(world, late)
        assert (await s.send(f"r{late}", CHAT)).route == "cloud"  # type: ignore[attr-defined]
        assert s.resilience.health.get("local:m").state is Health.GREEN  # type: ignore[attr-defined]
    stop_pushing_for(world, 31.0)
    await s.send("r-red", CHAT)  # type: ignore[attr-defined]
    machine = s.resilience.health.get("local:m")  # type: ignore[attr-defined]
    assert machine.state is Health.RED and "30s" in machine.reason


async def test_a_reading_older_than_the_gateway_diverts_but_does_not_redden() -> None:
    """After `serve shutdown` and a redeploy the detached TelemetryBoard still holds the old
    replica's last reading (it forgets a replica a minute after its last push) while the new
    replica's engine starts: a new gateway's first look finds only that reading, minutes old. It
    must divert (nothing fresh to route on) but not redden the model for a whole cool-down: the
    staleness happened before this gateway watched."""
    s, world = _setup()
    world.late_by = 600.0  # the board's only reading of the model: the previous deploy's, 10 min old
    assert (await s.send("r1", CHAT)).route == "cloud"  # type: ignore[attr-defined]
    machine = s.resilience.health.get("local:m")  # type: ignore[attr-defined]
    assert machine.state is Health.GREEN
    world.now += 20.0  # the new replica's engine is still loading
    await s.send("r2", CHAT)  # type: ignore[attr-defined]
    assert machine.state is Health.GREEN
    world.late_by = 0.0  # its first push arrives
    assert (await s.send("r3", CHAT)).route == "local"  # type: ignore[attr-defined]
    assert machine.state is Health.GREEN and machine.transitions == []


async def test_a_replica_that_never_reports_reddens_after_the_gateway_watched_long_enough() -> None:
    s, world = _setup()
    world.late_by = 600.0
    await s.send("r1", CHAT)  # type: ignore[attr-defined]
    world.now += 31.0  # this gateway has now seen no fresh reading for max_age_s + stale_red_s
    world.late_by += 31.0
    await s.send("r2", CHAT)  # type: ignore[attr-defined]
    assert s.resilience.health.get("local:m").state is Health.RED  # type: ignore[attr-defined]


async def test_staleness_that_never_ends_between_requests_is_judged_on_the_snapshot() -> None:
    """The evidence is the age of the newest reading, not a memory of earlier requests: a new,
    short staleness long after an earlier one is not mistaken for a sustained one."""
    s, world = _setup()
    world.late_by = 3.0
    await s.send("r1", CHAT)  # type: ignore[attr-defined]
    world.late_by = 0.0
    world.now += 600  # fresh again for ten minutes, no traffic
    world.late_by = 3.0
    await s.send("r2", CHAT)  # type: ignore[attr-defined]
    assert s.resilience.health.get("local:m").state is Health.GREEN  # type: ignore[attr-defined]
