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
Pure; the clock is injected.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from router.percentile import percentile

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
        self.weight = 100.0
        self._stepped_at = -math.inf

    def observe(self, *, ok: bool, violation: bool = False, latency_s: float | None = None) -> None:
        now = self._clock()
        self._outcomes.append((now, ok, violation, latency_s if ok else None))
        self._trim(now)

    def _trim(self, now: float) -> None:
        while self._outcomes and (self._outcomes[0][0] <= now - self._s.window_s or len(self._outcomes) > 10_000):
            self._outcomes.popleft()

    def p95(self) -> float | None:
        return percentile((x[3] for x in self._outcomes if x[3] is not None), 95)

    def p50(self) -> float | None:
        latencies = sorted(x[3] for x in self._outcomes if x[3] is not None)
        return latencies[len(latencies) // 2] if latencies else None

    def score(self, cost: float = 1.0) -> float:
        self._trim(self._clock())
        n = len(self._outcomes)
        if n < self._s.min_samples:
            return 100.0
        success = sum(1 for _, ok, _, _ in self._outcomes if ok) / n
        violations = sum(1 for _, _, v, _ in self._outcomes if v) / n
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
