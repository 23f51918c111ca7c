"""Backoff delays, retry budgets and the next-attempt decision of the dispatcher's attempt loop.

Pure: the clock and the randomness are injected, nothing sleeps or awaits. The dispatcher asks
three questions before a second or later attempt of a request:

    may this request try again at all?        AttemptBudget.next_allowed (attempts, deadline)
    may the gateway afford one more retry?    RetryBudget.try_withdraw   (gateway-wide bucket)
    how long to wait first?                   Backoff.delay_s            (full jitter, Retry-After)
    wait out a 429's Retry-After, or not?     retry_after_choice         (scenario strategy, bound, deadline)
    until when, exactly?                      wait_out_delay             (until its breakers let it through)

`after_failure` (fed by the retry table's rule for the failure, router/resilience/failure.py) and
`before_attempt` put these answers together into the loop's decisions; serve_apps/dispatch/dispatcher.py
only carries them out.

`RetryBudget` is what keeps retries from amplifying an outage: when every target fails, a
gateway retrying every request 3 times sends 3x the load to already-failing targets. Capping
retries at a fraction of the request rate (gRPC retry throttling, Finagle's RetryBudget) bounds
that amplification to `1 + ratio` while a small floor still lets an idle gateway retry.
"""

from __future__ import annotations

import math
import random
from collections import deque
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Literal

from router.resilience.failure import Rule

MAX_SAME_TARGET_RETRIES = 1  # a second failure of the same target moves on (or gives up)

# Exponents above this only matter for absurd base values; clamping keeps `2**n` finite.
_MAX_EXPONENT = 1000
# Float slack so that e.g. 30 deposits x 0.1 still buys 3 retries.
_EPSILON = 1e-9


class Backoff:
    """Full-jitter exponential backoff (AWS Architecture Blog, "Exponential Backoff and Jitter").

    `delay_s(n)` draws uniformly from `[0, min(cap_s, base_s * 2**n)]`: full jitter spreads the
    retries of many clients that failed together, instead of having them return in lockstep.
    A provider's Retry-After is a floor, honoured even above `cap_s`: retrying earlier would
    only earn another 429.
    """

    def __init__(self, *, base_s: float = 0.1, cap_s: float = 2.0, rng: random.Random) -> None:
        if not (math.isfinite(base_s) and base_s > 0):
            raise ValueError(f"base_s must be a positive number, got {base_s!r}")
        if not (math.isfinite(cap_s) and cap_s > 0):
            raise ValueError(f"cap_s must be a positive number, got {cap_s!r}")
        self.base_s = base_s
        self.cap_s = cap_s
        self._rng = rng

    def ceiling_s(self, retry_number: int) -> float:
        """The upper bound of the jitter for retry `retry_number` (0 for the first retry)."""
        if retry_number < 0:
            raise ValueError(f"retry_number must be >= 0, got {retry_number!r}")
        return min(self.cap_s, self.base_s * float(2 ** min(retry_number, _MAX_EXPONENT)))

    def delay_s(self, retry_number: int, retry_after_s: float | None = None) -> float:
        """Seconds to wait before retry `retry_number` (0-based); at least `retry_after_s`."""
        delay = self._rng.uniform(0.0, self.ceiling_s(retry_number))
        if retry_after_s is not None and math.isfinite(retry_after_s):
            delay = max(delay, retry_after_s)
        return delay


class RetryBudget:
    """A gateway-wide retry budget over a sliding window of `window_s` seconds.

    Every request calls `deposit()`; every second or later attempt of a request (a retry on
    the same target or a fail-over to another) must first win `try_withdraw()`.

    Implementation: two deques of timestamps, one per deposit and one per granted withdrawal,
    pruned by the injected clock to the trailing window `(now - window_s, now]`. The balance is

        ratio * deposits_in_window + min_per_s * window_s - withdrawals_in_window

    and a withdrawal is granted when the balance is at least 1. Tokens therefore expire with
    the deposit that made them, and the floor `min_per_s * window_s` is always available, so an
    idle gateway can still retry (at `min_per_s` per second on average over the window; a burst
    of up to the whole floor at once is allowed). Memory is O(requests per window).

    Guarantee: whenever a withdrawal is granted at time t,

        withdrawals in (t - window_s, t]  <=  ratio * deposits in (t - window_s, t] + min_per_s * window_s

    It follows that over any interval (a, a + window_s], retries <= ratio * requests in
    (a - window_s, a + window_s] + min_per_s * window_s (the window's requests plus those of the
    window before, whose retries may land in it).
    """

    def __init__(
        self,
        *,
        ratio: float = 0.1,
        min_per_s: float = 1.0,
        window_s: float = 10.0,
        clock: Callable[[], float],
    ) -> None:
        if not (math.isfinite(ratio) and ratio >= 0):
            raise ValueError(f"ratio must be a number >= 0, got {ratio!r}")
        if not (math.isfinite(min_per_s) and min_per_s >= 0):
            raise ValueError(f"min_per_s must be a number >= 0, got {min_per_s!r}")
        if not (math.isfinite(window_s) and window_s > 0):
            raise ValueError(f"window_s must be a positive number, got {window_s!r}")
        self.ratio = ratio
        self.min_per_s = min_per_s
        self.window_s = window_s
        self._clock = clock
        self._deposits: deque[float] = deque()
        self._withdrawals: deque[float] = deque()

    def _prune(self) -> float:
        """Drop events that left the trailing window; returns the clock reading used."""
        now = self._clock()
        horizon = now - self.window_s
        for events in (self._deposits, self._withdrawals):
            while events and events[0] <= horizon:
                events.popleft()
        return now

    def _now_and_balance(self) -> tuple[float, float]:
        now = self._prune()
        floor = self.min_per_s * self.window_s
        return now, self.ratio * len(self._deposits) + floor - len(self._withdrawals)

    def deposit(self) -> None:
        """Record one request (its first attempt): earns `ratio` retry tokens for `window_s`."""
        now = self._prune()
        self._deposits.append(now)

    def try_withdraw(self) -> bool:
        """Spend one token for a retry or fail-over attempt; False means: do not retry."""
        now, balance = self._now_and_balance()
        if balance + _EPSILON < 1.0:
            return False
        self._withdrawals.append(now)
        return True

    def balance(self) -> float:
        """Tokens available now (floor included), for metrics; may be fractional."""
        return self._now_and_balance()[1]


@dataclass(frozen=True, kw_only=True)
class AttemptBudget:
    """The per-request limit on attempts: a count and an absolute deadline on the same clock
    as `RetryBudget`'s. `next_allowed` refuses an attempt that could not even start before the
    deadline after its backoff, so no attempt is launched only to be cut off at once."""

    max_attempts: int = 3
    deadline: float

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {self.max_attempts!r}")

    def next_allowed(self, attempts_made: int, now: float, delay_s: float) -> bool:
        """True when another attempt is left and starting it after `delay_s` is before the deadline."""
        return attempts_made < self.max_attempts and now + delay_s < self.deadline


AfterFailure = Literal["retry_same", "fail_over", "give_up"]
BeforeAttempt = Literal["attempt", "skip", "stop"]


@dataclass(frozen=True)
class RetryAfterChoice:
    """Whether a provider's Retry-After is waited out on the same target (`wait`), and why."""

    wait: bool
    why: str


def retry_after_choice(
    retry_after_s: float | None,
    strategy: str,
    *,
    max_wait_s: float,
    waiting_strategies: Collection[str],
    now: float,
    deadline: float,
) -> RetryAfterChoice | None:
    """The Retry-After rule (None when the failure carried no Retry-After): wait it out and retry
    the same target when the request's scenario strategy is one that waits (by default cost: a
    short wait is cheaper than a dearer fallback and keeps the session's target), the wait is at
    most `max_wait_s`, and the retry can still start before the deadline; otherwise fail over at
    once (latency: another target now beats the same one later)."""
    if retry_after_s is None or not math.isfinite(retry_after_s):
        return None
    wait = f"Retry-After {retry_after_s:g}s"
    if strategy not in waiting_strategies:
        return RetryAfterChoice(False, f"{wait}: strategy {strategy} fails over at once")
    if retry_after_s > max_wait_s:
        return RetryAfterChoice(False, f"{wait} is above the {max_wait_s:g}s bound: fail over")
    if now + retry_after_s >= deadline:
        return RetryAfterChoice(False, f"{wait} does not fit the deadline: fail over")
    return RetryAfterChoice(True, f"{wait}: strategy {strategy} waits and retries the same target")


WAIT_OUT_SLACK_S = 0.5  # how much longer than the Retry-After a wait-out may last to find the target open
WAIT_OUT_MARGIN_S = 0.01  # past the moment the breakers stop refusing


def wait_out_delay(delay_s: float, shut_for_s: float) -> float:
    """The wait before retrying a target whose Retry-After is waited out: `delay_s`, or until its breakers stop
    refusing it (`shut_for_s`) when that is a little later. The domain's cool-down can end a few ms after the
    Retry-After (a view of the same 429 merged through the breaker exchange is one way: its until crosses two
    clocks); retrying a hair early met "cooling after 429 (retry in 0.0s)" and failed over, in a fresh-clone run,
    which the wait was meant to avoid. A cool-down much longer than the wait (another 429 since) is not waited
    for: the retry is refused and the request fails over."""
    if delay_s < shut_for_s <= delay_s + WAIT_OUT_SLACK_S:
        return shut_for_s + WAIT_OUT_MARGIN_S
    return delay_s


def after_failure(
    rule: Rule, same_retries: int, retry_granted: Callable[[], bool], *, wait_out: bool = False
) -> AfterFailure:
    """What follows a failed attempt whose failure the retry table gives `rule`: the same target
    again when the rule allows it (or `wait_out`: the Retry-After rule chose to wait), fewer than
    MAX_SAME_TARGET_RETRIES retries of it were made and the gateway-wide budget grants one
    (`retry_granted`, e.g. `RetryBudget.try_withdraw`, asked only then); else the next candidate
    when the rule allows failing over; else give up."""
    if (rule.retry_same or wait_out) and same_retries < MAX_SAME_TARGET_RETRIES and retry_granted():
        return "retry_same"
    return "fail_over" if rule.fail_over else "give_up"


def before_attempt(
    attempts_made: int,
    budget: AttemptBudget,
    now: float,
    delay_s: float,
    *,
    into_failed_domain: bool,
    retry_granted: Callable[[], bool],
) -> BeforeAttempt:
    """Whether the next candidate is tried: the first attempt always is; a later one stops the
    request when its attempt budget is spent (count or deadline, after `delay_s`), and is skipped
    when it fails over into the failure domain that just failed (`into_failed_domain`) and the
    gateway-wide budget grants no retry (failing over elsewhere adds no load to the struggling one)."""
    if not attempts_made:
        return "attempt"
    if not budget.next_allowed(attempts_made, now, delay_s):
        return "stop"
    if into_failed_domain and not retry_granted():
        return "skip"
    return "attempt"
