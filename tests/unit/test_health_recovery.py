"""Health recovery: half-open trials, live evidence outranking probes, the default 30 s timeline
(router/resilience/health.py, router/resilience/health_evidence.py). Fake clock, pure; the helpers are
test_health.py's."""

from __future__ import annotations

import random

from tests.unit.test_health import T0, G, R, Y, fresh, run


def test_live_success_in_half_open_starts_the_ramp() -> None:
    machine, clock = fresh()
    run(machine, clock, [("live", True, 3), ("live", False, 5)])
    assert (machine.state, machine.reason) == (R, "5 consecutive requests failed")
    clock.advance(9.9)
    assert (machine.state, machine.half_open, machine.share()) == (R, False, 0.0)
    clock.advance(0.1)  # the 10 s cool-down is over: a small share of live requests go through as trials
    assert (machine.state, machine.half_open, machine.share()) == (R, True, 0.1)
    machine.outcome(True)
    assert (machine.state, machine.share(), machine.ramping) == (Y, 0.2, True)
    assert machine.reason == "a live request succeeded while half-open: ramp to 20%"
    assert [(t.at - T0, t.from_state, t.to_state, t.share) for t in machine.transitions] == [
        (0.0, G, Y, 0.7),  # 2 of 5 requests failed
        (0.0, Y, R, 0.0),  # 5 in a row
        (10.0, R, R, 0.1),  # half-open
        (10.0, R, Y, 0.2),
    ]


def test_a_failed_trial_in_half_open_restarts_the_cooldown() -> None:
    machine, clock = fresh()
    run(machine, clock, [("live", False, 5), ("wait", 10)])
    assert machine.half_open
    run(machine, clock, [("wait", 2), ("live", False)])
    assert (machine.state, machine.half_open, machine.share()) == (R, False, 0.0)
    assert machine.reason == "trial request failed while half-open: the cool-down starts again"
    clock.advance(9.9)
    assert not machine.half_open
    clock.advance(0.1)
    assert machine.half_open


def test_a_late_success_during_the_cooldown_proves_nothing() -> None:
    machine, clock = fresh()
    run(machine, clock, [("live", False, 5), ("wait", 5), ("live", True)])  # sent before the target went red
    assert (machine.state, machine.share(), machine.ramping) == (R, 0.0, False)


def test_failed_probes_while_live_requests_succeed_are_overruled_and_shown() -> None:
    machine, clock = fresh()
    run(machine, clock, [("live", True), *[("wait", 1), ("probe", "liveness", False)] * 3])
    assert (machine.state, machine.share()) == (G, 1.0)  # three failed liveness probes would be red alone
    assert machine.evidence.disagreement == "liveness probe failed while live requests succeed"
    assert machine.evidence.overruled_total == 3
    assert machine.evidence.probes["liveness"].counted is False
    run(machine, clock, [("live", True), ("wait", 1), ("probe", "liveness", True)])  # probes agree again
    assert machine.evidence.disagreement is None
    run(machine, clock, [("wait", 10), ("probe", "liveness", False)])  # no live traffic for 10 s: probes count
    assert (machine.state, machine.reason) == (Y, "liveness probe failed")


def test_good_probes_while_live_requests_fail_do_not_lift_red() -> None:
    machine, clock = fresh()
    run(machine, clock, [("live", False, 5), ("wait", 3), ("probe", "latency", True), ("wait", 3)])
    run(machine, clock, [("probe", "latency", True), ("wait", 4)])
    assert (machine.state, machine.half_open, machine.ramping) == (R, True, False)  # trials decide, not probes
    assert machine.evidence.disagreement == "latency probe passed while live requests fail"


def test_a_correctness_probe_is_not_outranked_by_answered_requests() -> None:
    machine, clock = fresh()
    run(machine, clock, [("live", True), ("probe", "correctness", False)])
    assert (machine.state, machine.reason) == (Y, "correctness probe failed")


def test_a_rejected_probe_changes_nothing_but_is_counted() -> None:
    machine, _ = fresh()
    machine.probe_rejected("latency", "cloud provider 'a' rejected the request (HTTP 400): content filter")
    assert (machine.state, machine.share(), machine.transitions) == (G, 1.0, [])
    assert machine.evidence.rejections_total == 1
    assert machine.evidence.last_rejection is not None and "content filter" in machine.evidence.last_rejection


def test_flap_red_recovery_and_ramp_within_30s_with_the_defaults() -> None:
    """A target that flaps (down 15 s, up 5 s, down 20 s) and is healthy from t=60 on, one request a
    second, each sent to it when its health admits the request (what the gateway's gate does)."""
    machine, clock = fresh()
    rng = random.Random(24)

    def up(t: int) -> bool:
        return t < 20 or 35 <= t < 40 or t >= 60

    sent_at: list[int] = []
    for t in range(150):
        clock.now = T0 + t
        if machine.admits(rng.random()):
            sent_at.append(t)
            machine.outcome(up(t))
    log = [(t.at - T0, t.to_state, t.share) for t in machine.transitions]
    assert any(20 <= at < 25 and to is R for at, to, _ in log), log  # 5 failed requests in a row: red at once
    ramp_start = min(at for at, to, share in log if at >= 60 and to is not R)
    assert ramp_start <= 60 + 30, log
    after = [(to, share) for at, to, share in log if at >= ramp_start]
    assert after == [(Y, 0.2), (Y, 0.5), (G, 1.0), (G, 1.0)], log
    assert min(t for t in sent_at if t >= 60) <= 60 + 30  # traffic back within 30 s of recovery
    assert (machine.state, machine.ramping) == (G, False)
