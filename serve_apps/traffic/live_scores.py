"""Live health scores per target and scenario (router/resilience/health_score.py), fed by every attempt the
dispatcher makes, and each target's measured latency.

Each target × scenario has a `TargetScore`; its weight steps at most `max_step` points per
`min_interval_s`, when an attempt is seen and when routing reads it (`weight`, so a target that
gets no traffic any more still regains weight once its bad evidence has left the window). The
cost component is 1 - how much dearer the target's configured price (prompt + output per 1M
tokens) is than the cheapest priced target scored in the same scenario, relative to the dearest
(1 for the cheapest, and when unpriced or free). The weight routes: see
serve_apps/traffic/weight_routing.py. Live latency is not fed to the ranking's latency scorer, whose
configured expectation stays (docs/traffic.md: live latency moves traffic only through the bounded weight).
Exported at `GET /v1/spillover/traffic` (`scores`: score, weight and the p95 of successful attempts) and in
`/metrics`.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Gauge

from router.learning.decision import Attempt
from router.resilience.health_score import ScoreSettings, TargetScore
from router.traffic.traffic import endpoint_of

MAX_KEYS = 1000  # target x scenario pairs kept (both come from the config: bounded anyway)


class LiveScores:
    def __init__(
        self,
        settings: ScoreSettings | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        registry: CollectorRegistry | None = None,
        prices: Mapping[str, float] | None = None,
    ) -> None:
        self._settings = settings or ScoreSettings()
        self._clock = clock
        self._prices = dict(prices or {})  # target id -> USD per 1M prompt + output tokens
        self._scores: dict[tuple[str, str], TargetScore] = {}
        self._gauges = (
            None
            if registry is None
            else (
                Gauge("spillover_target_score", "Live health score 0..100", ["target", "scenario"], registry=registry),
                Gauge(
                    "spillover_target_weight",
                    "Routing weight following the score in bounded steps",
                    ["target", "scenario"],
                    registry=registry,
                ),
            )
        )

    def observe(self, scenario: str, attempts: Iterable[Attempt]) -> None:
        for attempt in attempts:
            if attempt.outcome == "skipped":
                continue
            key = (attempt.target, scenario)
            if key not in self._scores:
                if len(self._scores) >= MAX_KEYS:
                    continue
                self._scores[key] = TargetScore(self._settings, self._clock)
            entry = self._scores[key]
            entry.observe(
                ok=attempt.outcome == "ok",
                violation=attempt.outcome == "contract_violation",
                latency_s=attempt.latency_s,
            )
            self._step(key, entry)

    def cost(self, target: str, scenario: str) -> float:
        """1 - (price - the cheapest price) / the dearest price, among the priced targets scored in
        this scenario: the cheapest (and any as cheap) 1, free or unpriced 1."""
        price = self._prices.get(target)
        priced = [p for t, s in self._scores if s == scenario and (p := self._prices.get(t, 0.0)) > 0]
        if not price or not priced:
            return 1.0
        return max(0.0, 1.0 - (price - min(priced)) / max(priced))

    def _step(self, key: tuple[str, str], entry: TargetScore) -> float:
        cost = self.cost(*key)
        weight = entry.step(cost)
        if self._gauges is not None:
            self._gauges[0].labels(*key).set(entry.score(cost))
            self._gauges[1].labels(*key).set(weight)
        return weight

    def weight(self, target: str, scenario: str) -> tuple[float, float]:
        """The routing weight (stepped now if its interval has passed) and the score; 100 unseen."""
        entry = self._scores.get((target, scenario))
        if entry is None:
            return 100.0, 100.0
        return self._step((target, scenario), entry), entry.score(self.cost(target, scenario))

    def tick(self) -> None:
        """Time-driven steps (called at each traffic sync), so the gauges follow without traffic."""
        for key, entry in self._scores.items():
            self._step(key, entry)

    def reset(self, endpoint: str | None = None) -> list[str]:
        """Forget the scores of one health key (`cloud:<provider>`, `local:<alias>`) or all."""
        keys = [k for k in self._scores if endpoint is None or endpoint_of(k[0]) == endpoint]
        for key in keys:
            del self._scores[key]
            if self._gauges is not None:
                for gauge in self._gauges:
                    with contextlib.suppress(KeyError):
                        gauge.remove(*key)
        return sorted({f"score {target} {scenario}" for target, scenario in keys})

    def view(self) -> dict[str, Any]:
        return {
            f"{target} {scenario}": {
                "score": round(e.score(self.cost(target, scenario)), 1),
                "weight": round(e.weight, 1),
                "p95_s": e.p95(),
            }
            for (target, scenario), e in self._scores.items()
        }
