"""Backoff, the gateway retry budget, the per-request attempt budget and Retry-After parsing.

Fake clock and seeded Random throughout: no sleeps, no timing assertions.
"""

from __future__ import annotations

import random

import pytest

from router.resilience.retry import AttemptBudget, Backoff, RetryBudget
from tests.fakes import FakeClock

# --- Backoff ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("retry_number", "ceiling"),
    [(0, 0.1), (1, 0.2), (2, 0.4), (3, 0.8), (4, 1.6), (5, 2.0), (10, 2.0), (5000, 2.0)],
)
def test_backoff_draws_stay_within_full_jitter_bounds(retry_number: int, ceiling: float) -> None:
    backoff = Backoff(rng=random.Random(7))
    assert backoff.ceiling_s(retry_number) == pytest.approx(ceiling)
    draws = [backoff.delay_s(retry_number) for _ in range(2000)]
    assert all(0.0 <= d <= ceiling for d in draws)
    # Full jitter uses the whole range, not just its top: both halves are hit.
    assert min(draws) < ceiling * 0.1
    assert max(draws) > ceiling * 0.9


def test_backoff_mean_is_half_the_ceiling() -> None:
    backoff = Backoff(base_s=0.5, cap_s=4.0, rng=random.Random(11))
    draws = [backoff.delay_s(2) for _ in range(5000)]  # ceiling 2.0
    assert sum(draws) / len(draws) == pytest.approx(1.0, abs=0.05)


def test_backoff_is_reproducible_with_the_same_seed() -> None:
    a = Backoff(rng=random.Random(3))
    b = Backoff(rng=random.Random(3))
    assert [a.delay_s(n % 6) for n in range(50)] == [b.delay_s(n % 6) for n in range(50)]


@pytest.mark.parametrize("retry_after", [0.05, 1.0, 2.0, 30.0])
def test_backoff_honours_retry_after_as_a_floor_even_above_the_cap(retry_after: float) -> None:
    backoff = Backoff(base_s=0.1, cap_s=2.0, rng=random.Random(5))
    draws = [backoff.delay_s(3, retry_after_s=retry_after) for _ in range(500)]
    assert all(d >= retry_after for d in draws)
    assert all(d <= max(retry_after, 0.8) for d in draws)


def test_backoff_retry_after_above_cap_is_exact() -> None:
    backoff = Backoff(base_s=0.1, cap_s=2.0, rng=random.Random(5))
    assert backoff.delay_s(10, retry_after_s=30.0) == 30.0


def test_backoff_none_retry_after_is_plain_jitter() -> None:
    a = Backoff(rng=random.Random(9))
    b = Backoff(rng=random.Random(9))
    assert a.delay_s(2, retry_after_s=None) == b.delay_s(2)


@pytest.mark.parametrize(
    "kwargs", [{"base_s": 0.0}, {"base_s": -1.0}, {"cap_s": 0.0}, {"base_s": float("nan")}, {"cap_s": float("inf")}]
)
def test_backoff_rejects_bad_settings(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        Backoff(rng=random.Random(0), **kwargs)


def test_backoff_rejects_negative_retry_number() -> None:
    with pytest.raises(ValueError):
        Backoff(rng=random.Random(0)).delay_s(-1)


# --- RetryBudget -----------------------------------------------------------------------------


def drain(budget: RetryBudget, tries: int) -> int:
    """How many of `tries` withdrawals the budget grants."""
    return sum(budget.try_withdraw() for _ in range(tries))


def test_idle_gateway_still_gets_the_floor() -> None:
    clock = FakeClock()
    budget = RetryBudget(ratio=0.1, min_per_s=1.0, window_s=10.0, clock=clock)
    assert budget.balance() == pytest.approx(10.0)
    assert drain(budget, 50) == 10
    assert budget.try_withdraw() is False


def test_budget_allows_ratio_of_requests_plus_floor_and_refuses_the_rest() -> None:
    clock = FakeClock()
    budget = RetryBudget(ratio=0.1, min_per_s=1.0, window_s=10.0, clock=clock)
    for _ in range(1000):
        budget.deposit()
        clock.advance(0.005)  # 1000 requests in 5 s, all inside the window
    assert budget.balance() == pytest.approx(110.0)
    assert drain(budget, 1000) == 110  # 10% of 1000 + 1/s * 10 s
    assert budget.balance() == pytest.approx(0.0)


def test_no_floor_means_pure_ratio() -> None:
    clock = FakeClock()
    budget = RetryBudget(ratio=0.1, min_per_s=0.0, window_s=10.0, clock=clock)
    assert budget.try_withdraw() is False
    for _ in range(30):
        budget.deposit()
    assert drain(budget, 10) == 3  # 30 x 0.1 = 3.0000000000000004 in floats: still exactly 3


def test_budget_recovers_after_the_window() -> None:
    clock = FakeClock()
    budget = RetryBudget(ratio=0.1, min_per_s=1.0, window_s=10.0, clock=clock)
    assert drain(budget, 20) == 10
    clock.advance(5.0)
    assert budget.try_withdraw() is False  # spent withdrawals still inside the window
    clock.advance(5.0)
    assert drain(budget, 20) == 10  # the window has passed: the floor is back


def test_deposits_expire_with_the_window() -> None:
    clock = FakeClock()
    budget = RetryBudget(ratio=0.5, min_per_s=0.0, window_s=10.0, clock=clock)
    for _ in range(10):
        budget.deposit()
    assert budget.balance() == pytest.approx(5.0)
    clock.advance(9.999)
    assert budget.balance() == pytest.approx(5.0)
    clock.advance(0.001)
    assert budget.balance() == pytest.approx(0.0)
    assert budget.try_withdraw() is False


def test_sliding_window_guarantee_under_random_traffic() -> None:
    """At every granted retry, retries in the trailing window <= ratio x requests + floor."""
    rng = random.Random(2024)
    clock = FakeClock(0.0)
    ratio, min_per_s, window_s = 0.1, 0.5, 4.0
    budget = RetryBudget(ratio=ratio, min_per_s=min_per_s, window_s=window_s, clock=clock)
    deposits: list[float] = []
    grants: list[float] = []
    refused = 0
    for _ in range(20_000):
        clock.advance(rng.expovariate(200.0))  # ~200 events per second
        if rng.random() < 0.6:
            budget.deposit()
            deposits.append(clock.now)
        elif budget.try_withdraw():
            grants.append(clock.now)
            t = clock.now
            in_window = sum(1 for g in grants if g > t - window_s)
            requests = sum(1 for d in deposits if d > t - window_s)
            assert in_window <= ratio * requests + min_per_s * window_s + 1e-9
        else:
            refused += 1
    # Retry demand (~0.67 per request) far exceeds the 10% budget: most are refused, some granted.
    assert refused > len(grants) > 0
    assert len(grants) <= ratio * len(deposits) + min_per_s * clock.now + 1


@pytest.mark.parametrize(
    "kwargs",
    [{"ratio": -0.1}, {"min_per_s": -1.0}, {"window_s": 0.0}, {"window_s": float("inf")}, {"ratio": float("nan")}],
)
def test_budget_rejects_bad_settings(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        RetryBudget(clock=FakeClock(), **kwargs)


# --- AttemptBudget ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("attempts_made", "now", "delay", "allowed"),
    [
        (1, 0.0, 0.1, True),  # second attempt, plenty of time
        (2, 0.0, 0.1, True),  # third attempt of three
        (3, 0.0, 0.1, False),  # attempts exhausted
        (1, 9.0, 0.5, True),  # starts at 9.5 < 10
        (1, 9.5, 0.5, False),  # would start exactly at the deadline
        (1, 9.0, 2.0, False),  # backoff runs past the deadline
        (1, 10.5, 0.0, False),  # deadline already passed
    ],
)
def test_attempt_budget(attempts_made: int, now: float, delay: float, allowed: bool) -> None:
    budget = AttemptBudget(deadline=10.0)
    assert budget.max_attempts == 3
    assert budget.next_allowed(attempts_made, now, delay) is allowed


def test_single_attempt_budget_never_retries() -> None:
    budget = AttemptBudget(max_attempts=1, deadline=1e9)
    assert budget.next_allowed(1, 0.0, 0.0) is False
    assert budget.next_allowed(0, 0.0, 0.0) is True


def test_attempt_budget_rejects_zero_attempts() -> None:
    with pytest.raises(ValueError):
        AttemptBudget(max_attempts=0, deadline=10.0)
