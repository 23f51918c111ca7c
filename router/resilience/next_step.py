"""The next step of one request's walk over its candidates. Pure: no clock, no I/O, nothing awaited.

The dispatcher's attempt loop asks two questions and carries out the answers:

    what now?                      `next_step(cursor, domains, attempts_made, budget, now, retry_granted)`
                                   -> try the candidate at `cursor.index` (after `cursor.delay_s`),
                                      skip it, stop (the attempt budget is spent) or give up (none left)
    that attempt failed: what now? `after_failed(cursor, step, delay_s, domain)`
                                   -> the same candidate again after the delay, the next one, or None
                                      (give up: the failure is the client's answer)

A candidate the loop's own doors refused (a refusal, the resilience gate) moves on with `moved(cursor)`.
The rules are router/resilience/retry.py's (`before_attempt`, `after_failure`, fed by the retry table of
router/resilience/failure.py); this module keeps the walk's position so that the loop holds no counters.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Literal

from router.resilience.retry import AfterFailure, AttemptBudget, before_attempt

Action = Literal["attempt", "skip", "stop", "exhausted"]


@dataclass(frozen=True)
class Cursor:
    """Where a walk stands: the candidate to try next, the retries of it made so far, the delay to wait
    before trying it, and the failure domain of the last attempt that failed ("" before any)."""

    index: int = 0
    same: int = 0
    delay_s: float = 0.0
    failed_domain: str = ""


@dataclass(frozen=True)
class Step:
    """What the loop does now: `attempt` the candidate at `cursor.index` after `cursor.delay_s`, `skip` it
    (the gateway-wide retry budget refused a fail-over into the domain that just failed; `cursor` is already
    past it), `stop` (attempt budget spent: `why` says so) or `exhausted` (no candidate left)."""

    action: Action
    cursor: Cursor
    why: str = ""


def moved(cursor: Cursor) -> Cursor:
    """The next candidate, tried at once: a skip, a refusal or a fail-over."""
    return replace(cursor, index=cursor.index + 1, same=0, delay_s=0.0)


def next_step(
    cursor: Cursor,
    domains: Sequence[str],
    attempts_made: int,
    budget: AttemptBudget,
    now: float,
    retry_granted: Callable[[], bool],
) -> Step:
    """The step for the candidate at `cursor` (`domains`: each candidate's failure domain, in order;
    `attempts_made`: the attempts started so far, skips not counted)."""
    if cursor.index >= len(domains):
        return Step("exhausted", cursor)
    into_failed = attempts_made > 0 and not cursor.same and domains[cursor.index] == cursor.failed_domain
    step = before_attempt(
        attempts_made, budget, now, cursor.delay_s, into_failed_domain=into_failed, retry_granted=retry_granted
    )
    if step == "stop":
        return Step("stop", cursor, f"attempt budget spent ({attempts_made} of {budget.max_attempts}, or the deadline)")
    if step == "skip":
        return Step("skip", moved(cursor), "gateway retry budget exhausted")
    return Step("attempt", cursor)


def after_failed(cursor: Cursor, step: AfterFailure, delay_s: float, domain: str) -> Cursor | None:
    """Where the walk goes after the candidate at `cursor` failed in `domain`, given retry.py's `step`
    (`delay_s`: the backoff before a retry of the same candidate); None to give up."""
    if step == "give_up":
        return None
    if step == "retry_same":
        return replace(cursor, same=cursor.same + 1, delay_s=delay_s, failed_domain=domain)
    return replace(moved(cursor), failed_domain=domain)
