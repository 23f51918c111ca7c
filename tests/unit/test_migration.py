"""Graded migration on a fake clock: steps 1/5/25/50/100%, gates, rollback, quota holds, staggering."""

from __future__ import annotations

import pytest

from router.traffic.migration import Gates, Migration, splitter, stagger_delay_s
from tests.fakes import FakeClock

OLD, NEW = "local:m", "cloud:sim"


def migration(clock: FakeClock, **gates: object) -> Migration:
    return Migration(OLD, NEW, Gates(**{"step_s": 10.0, "min_requests": 3, **gates}), clock)  # type: ignore[arg-type]


def good_step(m: Migration, clock: FakeClock, *, new_latency: float = 1.0) -> None:
    for _ in range(3):
        m.observe(OLD, ok=True, latency_s=1.0)
        m.observe(NEW, ok=True, latency_s=new_latency)
    clock.advance(10)
    m.tick()


def test_a_healthy_switch_goes_1_5_25_50_100_then_completes() -> None:
    clock = FakeClock()
    m = migration(clock)
    shares = [m.share()]
    for _ in range(5):
        good_step(m, clock)
        shares.append(m.share())
    assert shares == [0.01, 0.05, 0.25, 0.5, 1.0, 1.0]
    assert m.phase == "complete"
    assert [e.kind for e in m.events] == ["started", "step", "step", "step", "step", "complete"]


def test_a_step_is_held_its_time_and_until_the_new_target_has_enough_outcomes() -> None:
    clock = FakeClock()
    m = migration(clock)
    m.observe(NEW, ok=True)
    clock.advance(60)
    m.tick()
    assert m.share() == 0.01  # only 1 of 3 outcomes
    m.observe(NEW, ok=True)
    m.observe(NEW, ok=True)
    m.tick()
    assert m.share() == 0.05
    for _ in range(3):
        m.observe(NEW, ok=True)
    clock.advance(9.9)
    m.tick()
    assert m.share() == 0.05  # not held 10 s yet


def test_a_new_target_that_starts_failing_at_25_percent_is_rolled_back_within_its_step() -> None:
    clock = FakeClock()
    m = migration(clock)
    good_step(m, clock)
    good_step(m, clock)
    assert m.share() == 0.25
    m.observe(OLD, ok=True)
    m.observe(NEW, ok=False)
    m.observe(NEW, ok=False)
    assert m.phase == "running"  # 2 outcomes: not judged yet
    m.observe(NEW, ok=False)  # no need to wait for the step's end
    assert (m.phase, m.share()) == ("rolled_back", 0.0)
    assert m.events[-1].kind == "rolled_back"
    assert "rolled back at 25%" in m.reason and "error gate" in m.reason
    clock.advance(100)
    good_step(m, clock)
    assert m.share() == 0.0  # stays rolled back until the operator switches again


def test_the_error_gate_compares_with_the_old_target() -> None:
    clock = FakeClock()
    m = migration(clock, max_error_delta=0.1)
    for _ in range(3):
        m.observe(OLD, ok=False)  # the old target fails as much
    m.observe(NEW, ok=False)
    for _ in range(9):
        m.observe(NEW, ok=True)
    clock.advance(10)
    m.tick()
    assert m.phase == "running" and m.share() == 0.05  # 10% new vs 100% old: passes


def test_the_latency_gate_rolls_back_a_slow_new_target() -> None:
    clock = FakeClock()
    m = migration(clock)
    good_step(m, clock, new_latency=1.9)  # p95 1.9 s > 1.8 x 1.0 s
    assert m.phase == "rolled_back"
    assert "latency gate" in m.reason


def test_the_contract_gate_rolls_back_a_target_that_breaks_output_contracts() -> None:
    clock = FakeClock()
    m = migration(clock)
    good_step(m, clock)
    for _ in range(3):
        m.observe(OLD, ok=True)
        m.observe(NEW, ok=False, violation=True)
    assert m.phase == "rolled_back" and "contract gate" in m.reason


def test_a_standby_quota_that_could_not_take_the_next_share_holds_the_step() -> None:
    clock = FakeClock()
    m = migration(clock)
    refusals = {0.05: "standby rpm 10 < 20 requests/min expected at 5%"}
    for _ in range(3):
        m.observe(NEW, ok=True)
    clock.advance(10)
    m.tick(lambda share: refusals.get(share))
    m.tick(lambda share: refusals.get(share))
    assert m.share() == 0.01
    assert [e.kind for e in m.events] == ["started", "held"]  # said once
    assert "rpm" in m.reason
    m.tick(lambda share: None)
    assert m.share() == 0.05


def test_an_outside_rollback_and_outcomes_of_other_targets() -> None:
    clock = FakeClock()
    m = migration(clock)
    for _ in range(10):
        m.observe("cloud:other", ok=False)
    assert m.phase == "running"
    m.rollback("another gateway replica's error gate")
    assert m.phase == "rolled_back" and "another gateway replica" in m.reason


@pytest.mark.parametrize("share", [0.01, 0.05, 0.25, 0.5, 1.0])
def test_the_split_sends_exactly_the_share(share: float) -> None:
    chosen = sum(splitter(share, i) for i in range(1000))
    assert chosen == round(1000 * share)


def test_staggering_the_first_share_of_replicas_adopts_at_once_the_rest_later() -> None:
    delays = [stagger_delay_s(p / 4, first_share=0.5, stagger_s=10) for p in range(4)]
    assert delays == [0.0, 0.0, 10.0, 10.0]


@pytest.mark.parametrize("steps", [(), (0.5, 0.2, 1.0), (0.1, 0.5), (0.0, 1.0)])
def test_bad_steps_are_refused(steps: tuple[float, ...]) -> None:
    with pytest.raises(ValueError):
        Gates(steps=steps)
