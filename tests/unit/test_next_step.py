"""The pure next-step planner of a request's walk (router/resilience/next_step.py): no clock, no I/O."""

from __future__ import annotations

from router.resilience.next_step import Cursor, after_failed, moved, next_step
from router.resilience.retry import AttemptBudget

ALWAYS, NEVER = (lambda: True), (lambda: False)


def budget(max_attempts: int = 3, deadline: float = 100.0) -> AttemptBudget:
    return AttemptBudget(max_attempts=max_attempts, deadline=deadline)


def test_the_first_candidate_is_always_tried() -> None:
    step = next_step(Cursor(), ["local"], 0, budget(), now=0.0, retry_granted=NEVER)
    assert (step.action, step.cursor) == ("attempt", Cursor())


def test_no_candidate_left_is_exhausted() -> None:
    assert next_step(Cursor(index=2), ["a", "b"], 2, budget(), 0.0, ALWAYS).action == "exhausted"
    assert next_step(Cursor(), [], 0, budget(), 0.0, ALWAYS).action == "exhausted"


def test_a_spent_attempt_budget_stops_and_says_why() -> None:
    step = next_step(Cursor(index=1), ["a", "b"], 3, budget(max_attempts=3), 0.0, ALWAYS)
    assert step.action == "stop" and step.why == "attempt budget spent (3 of 3, or the deadline)"


def test_a_delay_past_the_deadline_stops() -> None:
    cursor = Cursor(index=0, same=1, delay_s=5.0, failed_domain="a")
    assert next_step(cursor, ["a"], 1, budget(deadline=4.0), now=0.0, retry_granted=ALWAYS).action == "stop"
    assert next_step(cursor, ["a"], 1, budget(deadline=6.0), now=0.0, retry_granted=ALWAYS).action == "attempt"


def test_a_fail_over_into_the_domain_that_failed_is_skipped_without_a_retry_grant() -> None:
    cursor = Cursor(index=1, failed_domain="cloud:p")
    skipped = next_step(cursor, ["cloud:p", "cloud:p", "local"], 1, budget(), 0.0, NEVER)
    assert (skipped.action, skipped.cursor.index, skipped.why) == ("skip", 2, "gateway retry budget exhausted")
    assert next_step(cursor, ["cloud:p", "cloud:p", "local"], 1, budget(), 0.0, ALWAYS).action == "attempt"
    # another domain needs no grant
    assert next_step(cursor, ["cloud:p", "cloud:q"], 1, budget(), 0.0, NEVER).action == "attempt"


def test_a_retry_of_the_same_candidate_needs_no_second_grant_here() -> None:
    """A retry of the same target was granted when after_failure chose it; the step before it asks nothing."""
    asked: list[int] = []

    def grant() -> bool:
        asked.append(1)
        return False

    cursor = Cursor(index=0, same=1, delay_s=0.2, failed_domain="cloud:p")
    assert next_step(cursor, ["cloud:p"], 1, budget(), 0.0, grant).action == "attempt"
    assert asked == []


def test_after_a_failure_retry_the_same_fail_over_or_give_up() -> None:
    cursor = Cursor(index=1)
    assert after_failed(cursor, "retry_same", 0.3, "cloud:p") == Cursor(1, 1, 0.3, "cloud:p")
    assert after_failed(Cursor(1, 1, 0.3, "cloud:p"), "fail_over", 0.0, "cloud:p") == Cursor(2, 0, 0.0, "cloud:p")
    assert after_failed(cursor, "give_up", 0.0, "cloud:p") is None


def test_moved_resets_the_retries_and_keeps_the_failed_domain() -> None:
    assert moved(Cursor(0, 1, 0.5, "local")) == Cursor(1, 0, 0.0, "local")


def test_a_walk_over_three_candidates_in_order() -> None:
    """local fails (fail over), cloud:p is rate-limited once (retry the same after its delay), then answers."""
    domains = ["local", "cloud:p", "cloud:q"]
    cursor, made, tried = Cursor(), 0, []
    outcomes = iter([("local", "fail_over", 0.0), ("cloud:p", "retry_same", 1.5)])
    while True:
        step = next_step(cursor, domains, made, budget(max_attempts=4), now=0.0, retry_granted=ALWAYS)
        assert step.action == "attempt"
        tried.append((domains[step.cursor.index], step.cursor.delay_s))
        made += 1
        failure = next(outcomes, None)
        if failure is None:
            break
        after = after_failed(step.cursor, failure[1], failure[2], failure[0])
        assert after is not None
        cursor = after
    assert tried == [("local", 0.0), ("cloud:p", 0.0), ("cloud:p", 1.5)]
