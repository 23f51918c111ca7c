"""Live health scores per target and scenario (router/health_score.py), fed by every attempt the
dispatcher makes, and the live latency the scorers read (`TargetState.latency_ms`).

Each target × scenario has a `TargetScore`; its weight steps at most `max_step` points per
`min_interval_s`. `latency_ms()` gives each target id's median latency of successful attempts over
the window, so the latency scorer ranks by what was measured instead of the configured expectation.
Exported at `GET /v1/spillover/traffic` (`scores`) and in `/metrics`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client import CollectorRegistry, Gauge

from router.decision import Attempt
from router.health_score import ScoreSettings, TargetScore

MAX_KEYS = 1000  # target x scenario pairs kept (both come from the config: bounded anyway)


class LiveScores:
    def __init__(
        self,
        settings: ScoreSettings | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self._settings = settings or ScoreSettings()
        self._clock = clock
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
            weight = entry.step()
            if self._gauges is not None:
                self._gauges[0].labels(*key).set(entry.score())
                self._gauges[1].labels(*key).set(weight)

    def latency_ms(self) -> dict[str, float]:
        out: dict[str, list[float]] = {}
        for (target, _), entry in self._scores.items():
            p50 = entry.p50()
            if p50 is not None:
                out.setdefault(target, []).append(p50)
        return {target: 1000.0 * sorted(values)[len(values) // 2] for target, values in out.items()}

    def view(self) -> dict[str, Any]:
        return {
            f"{target} {scenario}": {"score": round(e.score(), 1), "weight": round(e.weight, 1), "p95_s": e.p95()}
            for (target, scenario), e in self._scores.items()
        }
