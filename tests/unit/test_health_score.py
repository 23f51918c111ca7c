"""The health score and its bounded routing weight, on a fake clock."""

from __future__ import annotations

import random

import pytest

from router.percentile import percentile
from router.resilience.health_score import ScoreSettings, TargetScore, latency_component, score
from tests.fakes import FakeClock


def test_the_weight_moves_at_most_15_points_per_step_and_once_per_interval() -> None:
    clock = FakeClock()
    target = TargetScore(ScoreSettings(min_interval_s=10), clock)
    for _ in range(10):
        target.observe(ok=False)
    assert target.score() == pytest.approx(100 * (0.25 + 0.15 + 0.10))  # no success at all: 50
    assert target.step() == 85.0
    assert target.step() == 85.0  # within the interval: no second step
    clock.advance(10)
    assert target.step() == 70.0
    clock.advance(10)
    assert target.step() == 55.0
    clock.advance(10)
    assert target.step() == 50.0  # reaches the score, never passes it
    clock.advance(200)  # the window forgets the failures: back up, 15 points a step
    for _ in range(5):
        target.observe(ok=True, latency_s=1.0)
    assert [target.step() for _ in range(1)] == [65.0]


def test_latency_against_the_baseline() -> None:
    assert latency_component(1.7, 1.0, 1.8) == 1.0
    assert latency_component(2.7, 1.0, 1.8) == pytest.approx(0.5)
    assert latency_component(4.0, 1.0, 1.8) == 0.0
    assert latency_component(None, 1.0, 1.8) == latency_component(3.0, None, 1.8) == 1.0


def test_a_slow_target_loses_its_latency_points_against_its_own_best_p95() -> None:
    clock = FakeClock()
    target = TargetScore(ScoreSettings(), clock)
    for _ in range(5):
        target.observe(ok=True, latency_s=1.0)
    assert target.score() == 100.0
    clock.advance(121)
    for _ in range(5):
        target.observe(ok=True, latency_s=3.6)  # 2 x (1.8 x 1.0): the latency component is 0
    assert target.score() == pytest.approx(75.0)


def test_violations_and_cost_and_too_few_samples() -> None:
    clock = FakeClock()
    target = TargetScore(ScoreSettings(), clock, baseline_s=1.0)
    target.observe(ok=False, violation=True)
    assert target.score() == 100.0  # fewer than min_samples: no judgement
    for _ in range(4):
        target.observe(ok=True, latency_s=0.5)
    assert target.score(cost=0.0) == pytest.approx(score(0.8, 1.0, 0.8, 0.0))


def test_the_kept_counts_and_order_match_a_recount_as_the_window_moves() -> None:
    # the score reads counts and a sorted latency list kept as outcomes enter and leave the window
    # (window_s and the 10,000 cap); a recount from the outcomes themselves must agree at every step
    rng = random.Random(7)
    clock = FakeClock()
    target = TargetScore(ScoreSettings(window_s=5.0), clock)
    for _ in range(3000):
        clock.advance(rng.choice((0.0, 0.01, 0.5)))
        ok = rng.random() < 0.8
        target.observe(ok=ok, violation=not ok and rng.random() < 0.5, latency_s=rng.choice((0.1, 0.2, rng.random())))
        kept = list(target._outcomes)
        assert target._ok == sum(1 for _, good, _, _ in kept if good)
        assert target._violations == sum(1 for _, _, bad, _ in kept if bad)
        assert target.p95() == percentile([x[3] for x in kept if x[3] is not None], 95)
