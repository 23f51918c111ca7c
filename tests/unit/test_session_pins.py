"""The pin table and a gateway replica's cache of it (serve_apps/sessions/pins.py), on fake clocks."""

from __future__ import annotations

from typing import Any

from router.sessions.carried import Label
from serve_apps.sessions.pins import PinClient, PinTable, Record, local_pins
from tests.fakes import FakeClock

LABEL = Label().to_json()  # a turn's context that may go anywhere (router/sessions/carried.py)


def test_the_first_turn_pins_and_later_turns_count() -> None:
    clock = FakeClock()
    table = PinTable(clock, ttl_s=60, max_sessions=10)
    first = table.record("k", None, "local:m", {"task": "t"}, LABEL)
    assert (first["target"], first["turns"], first["switches"], first["anchor"]) == ("local:m", 1, 0, {"task": "t"})
    again = table.record("k", "local:m", "local:m", None, LABEL)
    assert (again["turns"], again["anchor"]) == (2, {"task": "t"})  # no new anchor keeps the old one


def test_a_switch_moves_the_pin_only_from_the_target_the_caller_saw() -> None:
    table = PinTable(FakeClock(), ttl_s=60, max_sessions=10)
    table.record("k", None, "local:m", None, LABEL)
    moved = table.record("k", "local:m", "cloud:sim/m", None, LABEL)
    assert (moved["target"], moved["switches"]) == ("cloud:sim/m", 1)
    # a replica that still believed the session was new, or local, does not move it back
    assert table.record("k", None, "local:m", None, LABEL)["target"] == "cloud:sim/m"
    assert table.record("k", "local:m", "local:m", None, LABEL)["target"] == "cloud:sim/m"


def test_pins_expire_after_the_ttl_and_the_table_is_bounded() -> None:
    clock = FakeClock()
    table = PinTable(clock, ttl_s=60, max_sessions=3)
    table.record("old", None, "local:m", None, LABEL)
    clock.advance(61)
    assert table.get("old") is None
    for i in range(5):
        table.record(f"k{i}", None, "local:m", None, LABEL)
    assert len(table) == 3 and table.get("k0") is None and table.get("k4") is not None
    table.get("k2")  # used: the least recently used goes first
    table.record("k5", None, "local:m", None, LABEL)
    assert table.get("k2") is not None and table.get("k3") is None


async def test_a_replica_reuses_what_it_read_for_cache_s_and_then_sees_another_replicas_switch() -> None:
    clock = FakeClock()
    table = PinTable(clock, ttl_s=600, max_sessions=10)
    a = PinClient(*local_pins(table), cache_s=1.0, clock=clock)
    b = PinClient(*local_pins(table), cache_s=1.0, clock=clock)
    await a.record("k", None, "local:m", None, LABEL)
    assert (await b.lookup("k"))[0]["target"] == "local:m"  # type: ignore[index]
    await a.record("k", "local:m", "cloud:sim/m", None, LABEL)
    clock.advance(0.5)
    assert (await b.lookup("k"))[0]["target"] == "local:m"  # type: ignore[index]  # within the staleness bound
    clock.advance(0.5)
    assert (await b.lookup("k"))[0]["target"] == "cloud:sim/m"  # type: ignore[index]


async def test_a_table_that_does_not_answer_costs_the_pin_not_the_request() -> None:
    async def broken_get(key: str) -> Record | None:
        raise ConnectionError("actor gone")

    async def broken_put(key: str, expected: str | None, target: str, anchor: Any, label: Any) -> Record:
        raise ConnectionError("actor gone")

    client = PinClient(broken_get, broken_put, cache_s=1.0, clock=FakeClock())
    assert await client.lookup("k") == (None, False)
    assert await client.record("k", None, "local:m", None, LABEL) is None
    assert client.failures == 2
