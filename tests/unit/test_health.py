"""The per-target health state machine: table-driven, fake clock, seeded Random, pure."""

from __future__ import annotations

import random
from typing import Any

import pytest

from router.health import MAX_TRANSITIONS, Health, HealthBoard, HealthMachine, HealthSettings
from tests.fakes import FakeClock

SETTINGS = HealthSettings()
G, Y, R, B = Health.GREEN, Health.YELLOW, Health.RED, Health.BLACK
T0 = 1_000.0


Step = tuple[Any, ...]


def run(machine: HealthMachine, clock: FakeClock, steps: list[Step]) -> None:
    """A tiny script: ("wait", s) ("probe", level, ok) ("live", ok[, n]) ("cred",) ("down", reason)."""
    for step in steps:
        kind, *args = step
        if kind == "wait":
            clock.advance(args[0])
        elif kind == "probe":
            machine.probe(args[0], args[1])
        elif kind == "live":
            for _ in range(args[1] if len(args) > 1 else 1):
                machine.outcome(args[0])
        elif kind == "cred":
            machine.credential_failed()
        elif kind == "down":
            machine.mark_down(args[0])
        else:
            raise AssertionError(f"unknown step {step}")


def fresh(settings: HealthSettings = SETTINGS) -> tuple[HealthMachine, FakeClock]:
    clock = FakeClock(T0)
    return HealthMachine("local:qwen", settings, clock), clock


GOOD5: list[Step] = [("wait", 10), ("probe", "liveness", True)] * 5  # five good probes over 50s


@pytest.mark.parametrize(
    ("steps", "state", "share", "reason"),
    [
        pytest.param([], G, 1.0, "no failures seen", id="starts-green"),
        pytest.param([("probe", "latency", False)], Y, 0.7, "latency probe failed", id="green-latency-fail-yellow"),
        pytest.param([("probe", "correctness", False)], Y, 0.7, "correctness probe failed", id="green-correct-fail"),
        pytest.param([("probe", "liveness", False)], Y, 0.7, "liveness probe failed", id="one-liveness-fail-yellow"),
        pytest.param(
            [("probe", "liveness", False)] * 3, R, 0.0, "3 consecutive liveness probes failed", id="3-liveness-red"
        ),
        pytest.param(
            [("probe", "liveness", False)] * 2 + [("probe", "liveness", True), ("probe", "liveness", False)],
            Y,
            0.7,
            "liveness probe failed",
            id="liveness-streak-broken-stays-yellow",
        ),
        pytest.param([("live", False, 4)], G, 1.0, "no failures seen", id="4-failures-below-min-count"),
        pytest.param(
            [("live", True, 4), ("live", False)],
            Y,
            0.7,
            "error ratio 0.20 over 5 requests in 120s >= 0.2",
            id="ratio-0.2-over-5-yellow",
        ),
        pytest.param([("live", True, 9), ("live", False)], G, 1.0, "no failures seen", id="ratio-0.1-stays-green"),
        pytest.param(
            [("live", False, 2), ("wait", 120), ("live", True, 3), ("live", False)],
            G,
            1.0,
            "no failures seen",
            id="old-failures-leave-the-window",
        ),
        pytest.param([("probe", "latency", False), ("wait", 29.9)], Y, 0.7, "latency probe failed", id="yellow-29.9s"),
        pytest.param([("probe", "latency", False), ("wait", 30)], G, 1.0, "no failures for 30s", id="yellow-clears"),
        pytest.param(
            [("probe", "latency", False)] + [("wait", 20), ("probe", "latency", False)] * 5 + [("wait", 19.9)],
            Y,
            0.7,
            "latency probe failed",
            id="flaky-yellow-119.9s",
        ),
        pytest.param(
            [("probe", "latency", False)] + [("wait", 20), ("probe", "latency", False)] * 6,
            R,
            0.0,
            "yellow for 120s",
            id="flaky-yellow-120s-red",
        ),
        pytest.param([("down", "stats of every replica stale")], R, 0.0, "stats of every replica stale", id="down"),
        pytest.param([("cred",)], B, 0.0, "credential failed", id="credential-black"),
        pytest.param([("down", "x"), ("cred",)], B, 0.0, "credential failed", id="red-to-black"),
        pytest.param([("cred",), ("wait", 599), ("probe", "liveness", True)], B, 0.0, "credential failed", id="b-599"),
        pytest.param(
            [("cred",), ("wait", 600), ("probe", "liveness", True)],
            R,
            0.0,
            "good liveness probe 600s after the credential failure",
            id="black-600s-good-probe-red",
        ),
        pytest.param([("cred",), ("wait", 700), ("probe", "liveness", False)], B, 0.0, "credential failed", id="b-bad"),
        pytest.param([("cred",), ("down", "stale"), ("live", False, 10)], B, 0.0, "credential failed", id="b-sticks"),
        pytest.param(
            [("cred",), ("wait", 500), ("cred",), ("wait", 500), ("probe", "liveness", True)],
            B,
            0.0,
            "credential failed",
            id="repeat-credential-restarts-wait",
        ),
    ],
)
def test_transitions(steps: list[Step], state: Health, share: float, reason: str) -> None:
    machine, clock = fresh()
    run(machine, clock, steps)
    assert machine.state is state
    assert machine.share() == pytest.approx(share)
    assert machine.reason == reason
    assert machine.ramping is False


def test_transition_records_carry_due_times() -> None:
    machine, clock = fresh()
    run(machine, clock, [("probe", "latency", False), ("wait", 20), ("probe", "latency", False), ("wait", 500)])
    # read long after: yellow cleared 30s after the last failure, not when it was observed
    assert [(t.at, t.from_state, t.to_state, t.share) for t in machine.transitions] == [
        (T0, G, Y, 0.7),
        (T0 + 50, Y, G, 1.0),
    ]


@pytest.mark.parametrize(
    ("state_steps", "expected"), [([("probe", "latency", False)], 0.7), ([], 1.0), ([("cred",)], 0)]
)
def test_share_measured_over_a_seeded_random(state_steps: list[Step], expected: float) -> None:
    machine, clock = fresh()
    run(machine, clock, state_steps)
    rng = random.Random(2024)
    admitted = sum(machine.admits(rng.random()) for _ in range(10_000)) / 10_000
    assert admitted == pytest.approx(expected, abs=0.015)  # 0.015 > 3 sigma of a 10,000-draw binomial


def test_full_recovery_red_cooldown_probes_then_20_50_100() -> None:
    machine, clock = fresh()
    machine.mark_down("every replica's stats stale")
    run(machine, clock, GOOD5)  # T0+50: streak done, cool-down not yet
    assert (machine.state, machine.share(), machine.ramping) == (R, 0.0, False)

    expected = [
        (59.9, R, 0.0, False),
        (60.0, Y, 0.2, True),
        (89.9, Y, 0.2, True),
        (90.0, Y, 0.5, True),
        (120.0, G, 1.0, True),
        (150.0, G, 1.0, False),
    ]
    for at, state, share, ramping in expected:
        clock.now = T0 + at
        assert (machine.state, machine.share(), machine.ramping) == (state, share, ramping), at
    assert [(t.at - T0, t.from_state, t.to_state, t.share, t.reason) for t in machine.transitions] == [
        (0.0, G, R, 0.0, "every replica's stats stale"),
        (60.0, R, Y, 0.2, "5 good probes and 60s cool-down: ramp to 20%"),
        (90.0, Y, Y, 0.5, "ramp 20% held 30s: ramp to 50%"),
        (120.0, Y, G, 1.0, "ramp 50% held 30s: ramp to 100%"),
        (150.0, G, G, 1.0, "ramp complete at 100%"),
    ]


@pytest.mark.parametrize(
    ("steps", "ramping_at"),
    [
        pytest.param([*GOOD5, ("wait", 9.9)], None, id="probes-done-cooldown-not"),
        pytest.param([*GOOD5, ("wait", 10)], 60.0, id="both-done-at-cooldown-end"),
        pytest.param([("wait", 1000), *GOOD5[:-2]], None, id="cooldown-done-4-probes"),
        pytest.param([("wait", 100), *GOOD5], 150.0, id="cooldown-done-5th-probe-starts-ramp"),
        pytest.param(
            [*GOOD5[:6], ("probe", "latency", False), *GOOD5[:8], ("wait", 100)], None, id="failed-probe-resets"
        ),
        pytest.param([*GOOD5[:8], ("live", False), *GOOD5[:2], ("wait", 100)], None, id="live-failure-resets"),
        pytest.param([*GOOD5[:8], ("down", "stale again"), *GOOD5, ("wait", 100)], 90.0, id="down-resets"),
    ],
)
def test_leaving_red_needs_probes_and_cooldown(steps: list[Step], ramping_at: float | None) -> None:
    machine, clock = fresh()
    machine.mark_down("stale")
    run(machine, clock, steps)
    if ramping_at is None:
        assert machine.state is R
        assert machine.share() == 0.0
    else:
        assert machine.transitions[1].at - T0 == ramping_at
        assert machine.transitions[1].to_state is Y
        assert machine.transitions[1].from_state is R


@pytest.mark.parametrize(
    ("ramp_at", "failure", "reason"),
    [
        pytest.param(60.0, ("live", False), "request failed while ramping at 20%: recovery starts over", id="at-20"),
        pytest.param(95.0, ("live", False), "request failed while ramping at 50%: recovery starts over", id="at-50"),
        pytest.param(
            125.0,
            ("probe", "correctness", False),
            "correctness probe failed while ramping at 100%: recovery starts over",
            id="probe-at-100",
        ),
    ],
)
def test_failure_mid_ramp_goes_back_to_red_and_starts_over(ramp_at: float, failure: Step, reason: str) -> None:
    machine, clock = fresh()
    machine.mark_down("stale")
    run(machine, clock, GOOD5)
    clock.now = T0 + ramp_at
    assert machine.ramping
    run(machine, clock, [failure])
    assert (machine.state, machine.share(), machine.ramping, machine.reason) == (R, 0.0, False, reason)

    run(machine, clock, GOOD5)  # five fresh probes, but the new cool-down runs 60s from the new red
    assert machine.state is R
    clock.now = T0 + ramp_at + 60.0
    assert (machine.state, machine.share()) == (Y, 0.2)


def test_black_leaves_only_to_red_then_recovers_normally() -> None:
    machine, clock = fresh()
    machine.credential_failed("401 from provider")
    assert machine.reason == "credential failed: 401 from provider"
    run(machine, clock, [("wait", 100), ("probe", "liveness", True)] * 5)  # T0+500: not believed
    assert machine.state is B
    run(machine, clock, [("wait", 100), ("probe", "liveness", True)])  # T0+600
    assert machine.state is R
    run(machine, clock, [*GOOD5, ("wait", 10)])  # the believing probe opened red; recovery needs its own
    assert (machine.state, machine.share()) == (Y, 0.2)
    assert [(t.from_state, t.to_state) for t in machine.transitions] == [(G, B), (B, R), (R, Y)]


def test_transitions_are_bounded() -> None:
    machine, clock = fresh()
    run(machine, clock, [("probe", "latency", False), ("wait", 30)] * 40)  # 80 transitions
    log = machine.transitions
    assert len(log) == MAX_TRANSITIONS
    assert (log[-1].from_state, log[-1].to_state, log[-1].at) == (Y, G, clock.now)


def test_a_ramp_that_starts_at_full_share_reports_green() -> None:
    machine, clock = fresh(HealthSettings(ramp=(1.0,), recovery_probes=1, cooldown_s=0.0))
    machine.mark_down("stale")
    machine.probe("latency", True)
    assert (machine.state, machine.share(), machine.ramping) == (G, 1.0, True)
    clock.advance(30.0)
    assert machine.ramping is False


@pytest.mark.parametrize(
    "bad",
    [
        {"ramp": ()},
        {"ramp": (0.5, 0.2, 1.0)},
        {"ramp": (0.0, 1.0)},
        {"ramp": (0.5, 1.5)},
        {"yellow_share": 1.2},
        {"yellow_error_ratio": -0.1},
        {"recovery_probes": 0},
    ],
)
def test_settings_reject_nonsense(bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="health"):
        HealthSettings(**bad)


def test_unknown_probe_level_is_refused() -> None:
    machine, _ = fresh()
    with pytest.raises(ValueError, match="unknown probe level"):
        machine.probe("vibes", False)  # type: ignore[arg-type]
    assert machine.state is G


def test_board_creates_machines_on_demand() -> None:
    clock = FakeClock(T0)
    board = HealthBoard(SETTINGS, clock)
    assert board.states() == {}
    board.get("cloud:sim/gpt").credential_failed()
    board.get("local:qwen").probe("latency", False)
    assert board.get("cloud:sim/gpt") is board.get("cloud:sim/gpt")
    assert board.get("local:qwen").target == "local:qwen"
    assert board.states() == {"cloud:sim/gpt": "black", "local:qwen": "yellow"}
    clock.advance(30.0)
    assert board.states()["local:qwen"] == "green"


def test_board_reset_brings_a_black_target_back_green() -> None:
    clock = FakeClock(T0)
    board = HealthBoard(HealthSettings(), clock)
    board.get("cloud:sim").credential_failed("provider_auth_failed")
    board.get("local:m").mark_down("stale")
    assert board.reset("cloud:sim") == ["health:cloud:sim"]
    assert board.get("cloud:sim").state is Health.GREEN
    assert board.get("local:m").state is Health.RED
    assert sorted(board.reset()) == ["health:cloud:sim", "health:local:m"]
