"""The two plugin protocols of the routing pipeline and the immutable views they read.

    Filter.apply(contract, target, state) -> None (keep) | reason (remove), e.g.
        "context window 4096 < needed 5200 (prompt ~5000 + max_tokens 200)"
    Scorer.score(contract, target, view)  -> raw float; the framework clamps it to 0..1 and
        applies the strategy's weight (router/routing/pipeline.py)

Plugins are pure: no I/O, no awaits, no clock reads. Whatever varies per target at run time
(availability, learned quality) arrives in a `TargetState` the caller builds from
its snapshot; local pressure is not a plugin's business (router/routing/burst.py decides it after the
pipeline). What scorers compare against (the most expensive / slowest surviving candidate)
arrives in `Peers`, computed by the framework over the targets that passed every filter.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from router.request.contract import RequestContract
from router.routing.capabilities import Target


@dataclass(frozen=True)
class TargetState:
    """Run-time state of one target, from the caller's snapshot; unknowns are None."""

    available: bool = True  # health checks / breaker allow sending to it
    # learned for the request's bucket (router/learning/quality.py); overrides the configured
    quality: float | None = None


UNKNOWN_STATE = TargetState()


@dataclass(frozen=True)
class Peers:
    """Scales over the candidates that passed the filters (None: no candidate has the value)."""

    max_cost_usd: float | None = None
    max_latency_ms: float | None = None


@dataclass(frozen=True)
class ScoreView:
    state: TargetState
    peers: Peers


class Filter(Protocol):
    @property
    def name(self) -> str: ...

    def apply(self, contract: RequestContract, target: Target, state: TargetState) -> str | None: ...


class Scorer(Protocol):
    @property
    def name(self) -> str: ...

    def score(self, contract: RequestContract, target: Target, view: ScoreView) -> float: ...


def expected_latency_ms(target: Target) -> float | None:
    """The configured expectation: live latency moves traffic through the bounded health-score weight instead
    (docs/traffic.md), never through the ranking, where a measured median would swap the order at once."""
    return None if target.caps.expected_latency_ms is None else float(target.caps.expected_latency_ms)
