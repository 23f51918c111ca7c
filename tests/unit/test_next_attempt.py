"""The attempt loop's decisions (router/resilience/retry.py `after_failure`, `before_attempt`), fed by the
retry table (router/resilience/failure.py): pure, table-driven; the budget grant is a stub that records
whether it was asked (asking it withdraws a token from the gateway-wide budget)."""

from __future__ import annotations

import pytest

from router.resilience.failure import RETRY_TABLE, FailureClass
from router.resilience.retry import MAX_SAME_TARGET_RETRIES, AttemptBudget, after_failure, before_attempt


class Grant:
    """Stands in for RetryBudget.try_withdraw: answers `allow` and counts the withdrawals asked."""

    def __init__(self, allow: bool) -> None:
        self.allow = allow
        self.asked = 0

    def __call__(self) -> bool:
        self.asked += 1
        return self.allow


@pytest.mark.parametrize("failure", list(FailureClass))
@pytest.mark.parametrize("budget", [True, False])
def test_after_a_first_failure_the_table_decides(failure: FailureClass, budget: bool) -> None:
    rule, grant = RETRY_TABLE[failure], Grant(budget)
    step = after_failure(rule, 0, grant)
    if rule.retry_same and budget:
        assert step == "retry_same"
    else:
        assert step == ("fail_over" if rule.fail_over else "give_up")
    assert grant.asked == (1 if rule.retry_same else 0)  # the budget is drawn on only for a same-target retry


def test_a_second_failure_of_the_same_target_moves_on_without_drawing_on_the_budget() -> None:
    rule, grant = RETRY_TABLE[FailureClass.TRANSPORT], Grant(True)
    assert rule.retry_same and rule.fail_over
    assert after_failure(rule, MAX_SAME_TARGET_RETRIES, grant) == "fail_over" and grant.asked == 0


def test_client_errors_give_up_at_once() -> None:
    grant = Grant(True)
    assert after_failure(RETRY_TABLE[FailureClass.CLIENT], 0, grant) == "give_up" and grant.asked == 0


BUDGET = AttemptBudget(max_attempts=3, deadline=100.0)


@pytest.mark.parametrize(
    ("attempts", "now", "delay", "into_failed", "allow", "step", "asked"),
    [
        (0, 200.0, 0.0, True, False, "attempt", 0),  # the first attempt always goes
        (1, 50.0, 0.0, False, False, "attempt", 0),  # failing over elsewhere costs no budget
        (1, 50.0, 0.0, True, True, "attempt", 1),  # into the failed domain: one token
        (1, 50.0, 0.0, True, False, "skip", 1),  # ... and skipped without one
        (3, 50.0, 0.0, False, True, "stop", 0),  # attempts spent
        (1, 99.5, 1.0, False, True, "stop", 0),  # would start after the deadline
    ],
)
def test_before_an_attempt(
    attempts: int, now: float, delay: float, into_failed: bool, allow: bool, step: str, asked: int
) -> None:
    grant = Grant(allow)
    assert before_attempt(attempts, BUDGET, now, delay, into_failed_domain=into_failed, retry_granted=grant) == step
    assert grant.asked == asked
