"""The per-target health state machine: table-driven, fake clock, seeded Random, pure."""

from __future__ import annotations

import random
from typing import Any

import pytest

from router.resilience.health import MAX_TRANSITIONS, Health, HealthBoard, HealthMachine, HealthSettings
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


GOOD2: list[Step] = [("wait", 3), ("probe", "liveness", True)] * 2  # two good probes over 6s (no live traffic)


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
    run(machine, clock, GOOD2)  # T0+6: streak done, cool-down not yet
    assert (machine.state, machine.share(), machine.ramping) == (R, 0.0, False)

    expected = [
        (9.9, R, 0.0, False),
        (10.0, Y, 0.2, True),
        (19.9, Y, 0.2, True),
        (20.0, Y, 0.5, True),
        (30.0, G, 1.0, True),
        (40.0, G, 1.0, False),
    ]
    for at, state, share, ramping in expected:
        clock.now = T0 + at
        assert (machine.state, machine.share(), machine.ramping) == (state, share, ramping), at
    assert [(t.at - T0, t.from_state, t.to_state, t.share, t.reason) for t in machine.transitions] == [
        (0.0, G, R, 0.0, "every replica's stats stale"),
        (10.0, R, Y, 0.2, "2 good probes and 10s cool-down: ramp to 20%"),
        (20.0, Y, Y, 0.5, "ramp 20% held 10s: ramp to 50%"),
        (30.0, Y, G, 1.0, "ramp 50% held 10s: ramp to 100%"),
        (40.0, G, G, 1.0, "ramp complete at 100%"),
    ]


@pytest.mark.parametrize(
    ("steps", "ramping_at", "half_open"),
    [
        pytest.param([*GOOD2, ("wait", 3.9)], None, False, id="probes-done-cooldown-not"),
        pytest.param([*GOOD2, ("wait", 4)], 10.0, False, id="both-done-at-cooldown-end"),
        pytest.param([("wait", 100), ("probe", "liveness", True)], None, True, id="cooldown-done-1-probe"),
        pytest.param([("wait", 100), *GOOD2], 106.0, False, id="cooldown-done-2nd-probe-starts-ramp"),
        pytest.param(
            [*GOOD2[:2], ("probe", "latency", False), *GOOD2[:2], ("wait", 100)], None, True, id="failed-probe-resets"
        ),
        # the live failure also outranks the next probe (router/resilience/health_evidence.py): no streak at all
        pytest.param([*GOOD2[:2], ("live", False), *GOOD2[:2], ("wait", 100)], None, True, id="live-failure-resets"),
        pytest.param([*GOOD2[:2], ("down", "stale again"), *GOOD2, ("wait", 100)], 10.0, False, id="down-resets"),
    ],
)
def test_leaving_red_needs_probes_and_cooldown(steps: list[Step], ramping_at: float | None, half_open: bool) -> None:
    machine, clock = fresh()
    machine.mark_down("stale")
    run(machine, clock, steps)
    ramps = [t for t in machine.transitions if t.from_state is R and t.to_state is Y]
    if ramping_at is None:
        assert (machine.state, machine.half_open, ramps) == (R, half_open, [])
        assert machine.share() == (SETTINGS.half_open_share if half_open else 0.0)
    else:
        assert ramps[0].at - T0 == ramping_at


@pytest.mark.parametrize(
    ("ramp_at", "failure", "reason", "after_cooldown"),
    [
        pytest.param(
            10.0,
            ("live", False),
            "request failed while ramping at 20%: recovery starts over",
            (R, 0.1),  # the live failure outranks the next probes: half-open, trials decide
            id="at-20",
        ),
        pytest.param(
            25.0, ("live", False), "request failed while ramping at 50%: recovery starts over", (R, 0.1), id="at-50"
        ),
        pytest.param(
            35.0,
            ("probe", "correctness", False),
            "correctness probe failed while ramping at 100%: recovery starts over",
            (Y, 0.2),  # two fresh good probes and the new cool-down
            id="probe-at-100",
        ),
    ],
)
def test_failure_mid_ramp_goes_back_to_red_and_starts_over(
    ramp_at: float, failure: Step, reason: str, after_cooldown: tuple[Health, float]
) -> None:
    machine, clock = fresh()
    machine.mark_down("stale")
    run(machine, clock, GOOD2)
    clock.now = T0 + ramp_at
    assert machine.ramping
    run(machine, clock, [failure])
    assert (machine.state, machine.share(), machine.ramping, machine.reason) == (R, 0.0, False, reason)

    run(machine, clock, GOOD2)  # the new cool-down runs 10s from the new red
    clock.now = T0 + ramp_at + 9.9
    assert (machine.state, machine.share()) == (R, 0.0)
    clock.now = T0 + ramp_at + 10.0
    assert (machine.state, machine.share()) == after_cooldown


def test_black_leaves_only_to_red_then_recovers_normally() -> None:
    machine, clock = fresh()
    machine.credential_failed("401 from provider")
    assert machine.reason == "credential failed: 401 from provider"
    run(machine, clock, [("wait", 100), ("probe", "liveness", True)] * 5)  # T0+500: not believed
    assert machine.state is B
    run(machine, clock, [("wait", 100), ("probe", "liveness", True)])  # T0+600
    assert machine.state is R
    run(machine, clock, [*GOOD2, ("wait", 4)])  # the believing probe opened red; recovery needs its own
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
        {"red_live_failures": 0},
        {"half_open_share": 1.5},
        {"live_evidence_s": -1.0},
    ],
)
def test_settings_reject_nonsense(bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="HealthSettings"):
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
