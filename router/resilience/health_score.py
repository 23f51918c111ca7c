"""A health score per target and scenario from live traffic, and a routing weight that follows it in
bounded steps.

    score = 100 x (0.5 success + 0.25 latency + 0.15 contract + 0.10 cost)

    success   share of the window's attempts that succeeded
    latency   1 while p95 <= latency_factor x the scenario's baseline (the target's own best p95 seen,
              unless configured), then falling linearly to 0 at twice that bound
    contract  1 - output-contract violation ratio
    cost      given by the caller: 1 for the cheapest priced target scored in the scenario (and when
              unpriced or free), less the dearer it is (serve_apps/traffic/live_scores.py)

The weight moves towards the score by at most `max_step` points (15) per step, and steps at most every
`min_interval_s`: one bad minute cannot swing a target from 100 to 0 at once, and neither can one good
request bring it back. Fewer than `min_samples` attempts in the window: no judgement (score 100).
Pure; the clock is injected. Everything a score reads is kept up to date as outcomes enter and leave the
window (counts, and the window's latencies in order), so a score costs the same with 10,000 outcomes as
with ten: it is read on every request.
"""

from __future__ import annotations

import math
from bisect import bisect_left, insort
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from router.percentile import percentile_of_sorted

Clock = Callable[[], float]


@dataclass(frozen=True)
class ScoreSettings:
    window_s: float = 120.0
    min_samples: int = 5
    latency_factor: float = 1.8
    max_step: float = 15.0
    min_interval_s: float = 10.0


def latency_component(p95_s: float | None, baseline_s: float | None, factor: float) -> float:
    if p95_s is None or not baseline_s or baseline_s <= 0:
        return 1.0
    bound = factor * baseline_s
    if p95_s <= bound:
        return 1.0
    return max(0.0, 1.0 - (p95_s - bound) / bound)


def score(success: float, latency: float, contract: float, cost: float) -> float:
    return 100.0 * (0.5 * success + 0.25 * latency + 0.15 * contract + 0.10 * cost)


class TargetScore:
    """One target in one scenario: live outcomes in, `score()` and the bounded `weight` out."""

    def __init__(self, settings: ScoreSettings, clock: Clock, *, baseline_s: float | None = None) -> None:
        self._s = settings
        self._clock = clock
        self._configured_baseline = baseline_s
        self._best_p95: float | None = None
        self._outcomes: deque[tuple[float, bool, bool, float | None]] = deque()  # at, ok, violation, latency
        self._ok = 0  # outcomes in the window that succeeded
        self._violations = 0  # ... that broke the output contract
        self._latencies: list[float] = []  # the window's latencies, sorted
        self.weight = 100.0
        self._stepped_at = -math.inf

    def observe(self, *, ok: bool, violation: bool = False, latency_s: float | None = None) -> None:
        now = self._clock()
        latency = latency_s if ok else None
        self._outcomes.append((now, ok, violation, latency))
        self._ok += ok
        self._violations += violation
        if latency is not None:
            insort(self._latencies, latency)
        self._trim(now)

    def _trim(self, now: float) -> None:
        while self._outcomes and (self._outcomes[0][0] <= now - self._s.window_s or len(self._outcomes) > 10_000):
            _, ok, violation, latency = self._outcomes.popleft()
            self._ok -= ok
            self._violations -= violation
            if latency is not None:
                del self._latencies[bisect_left(self._latencies, latency)]

    def p95(self) -> float | None:
        return percentile_of_sorted(self._latencies, 95)

    def p50(self) -> float | None:
        latencies = self._latencies
        return latencies[len(latencies) // 2] if latencies else None

    def score(self, cost: float = 1.0) -> float:
        self._trim(self._clock())
        n = len(self._outcomes)
        if n < self._s.min_samples:
            return 100.0
        success = self._ok / n
        violations = self._violations / n
        p95 = self.p95()
        if p95 is not None:
            self._best_p95 = p95 if self._best_p95 is None else min(self._best_p95, p95)
        baseline = self._configured_baseline or self._best_p95
        latency = latency_component(p95, baseline, self._s.latency_factor)
        return score(success, latency, 1.0 - violations, cost)

    def step(self, cost: float = 1.0) -> float:
        """Move the weight towards the score: at most `max_step` points, at most once per interval."""
        now = self._clock()
        if now - self._stepped_at < self._s.min_interval_s:
            return self.weight
        target = self.score(cost)
        delta = max(-self._s.max_step, min(self._s.max_step, target - self.weight))
        if delta:
            self.weight += delta
            self._stepped_at = now
        return self.weight
