"""The routing pipeline framework: filter → score → pick, over immutable inputs.

    run_pipeline(contract, targets, states, policy) -> PipelineResult

1. Every target runs through the filters in order; the first failing one removes it with its
   reason (`removed`: target id, filter name, reason). The survivors are `capable`.
2. Capable targets whose state says `available=False` (health, breaker) are `unavailable`: they
   satisfy the contract but cannot take the request now. They get no tier.
3. Every scorer scores every remaining target: raw → clamped to 0..1 (NaN → 0) → × the weight of
   the contract's strategy (`Policy.weights`); total = Σ weighted / Σ weights, so totals are 0..1.
4. Tiers: `[[local...], [cloud...]]`, each ranked by total (highest first, ties by target id), or,
   given a route's `order`, in that order (the scores are still computed and recorded).
   Fallback order is this data: the caller tries tier 0 while local has room, then tier 1.

Each plugin call is timed with the injected `timer`; `timings` sums seconds per plugin, keyed
"filter:<name>" / "scorer:<name>" (a filter and a scorer may share a name, e.g. cost).
When `capable` is empty, `no_capable_model(result)` builds the 422 NO_CAPABLE_MODEL error whose
body lists every candidate's reason (target ids and reasons only: nothing secret lives there).
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from router.errors import NoCapableModel
from router.request.contract import RequestContract
from router.routing.capabilities import Target, estimate_cost_usd
from router.routing.filters import DEFAULT_FILTERS
from router.routing.plugins import UNKNOWN_STATE, Filter, Peers, Scorer, ScoreView, TargetState, expected_latency_ms
from router.routing.policy import Policy
from router.routing.scorers import DEFAULT_SCORERS

_MESSAGE_REASONS = 3  # reasons quoted in the error message; the body's `reasons` has all


@dataclass(frozen=True)
class Removal:
    target: str
    filter: str
    reason: str

    def to_dict(self) -> dict[str, str]:
        return {"target": self.target, "filter": self.filter, "reason": self.reason}


@dataclass(frozen=True)
class ScorerScore:
    raw: float
    clamped: float
    weight: float
    weighted: float


@dataclass(frozen=True)
class ScoreCard:
    target: str
    scores: Mapping[str, ScorerScore]
    total: float


@dataclass(frozen=True)
class PipelineResult:
    candidates: tuple[str, ...]  # every target given, in input order
    removed: tuple[Removal, ...]
    capable: tuple[str, ...]
    unavailable: tuple[str, ...]
    scores: Mapping[str, ScoreCard]
    tiers: tuple[tuple[str, ...], tuple[str, ...]]  # (local, cloud), ranked
    timings: Mapping[str, float]  # seconds per plugin ("filter:<name>", "scorer:<name>"), summed over targets

    @property
    def ranked(self) -> tuple[str, ...]:
        return self.tiers[0] + self.tiers[1]


def clamp(value: float) -> float:
    if math.isnan(value):
        return 0.0
    return min(1.0, max(0.0, value))


def _peers(contract: RequestContract, targets: Sequence[Target]) -> Peers:
    costs = [estimate_cost_usd(t.caps, contract.est_prompt_tokens, contract.max_output_tokens) for t in targets]
    latencies = [expected_latency_ms(t) for t in targets]
    known_costs = [c for c in costs if c is not None]
    known_latencies = [lat for lat in latencies if lat is not None]
    return Peers(
        max_cost_usd=max(known_costs) if known_costs else None,
        max_latency_ms=max(known_latencies) if known_latencies else None,
    )


def run_pipeline(
    contract: RequestContract,
    targets: Sequence[Target],
    states: Mapping[str, TargetState],
    policy: Policy,
    *,
    timer: Callable[[], float] = time.perf_counter,
    filters: Sequence[Filter] = DEFAULT_FILTERS,
    scorers: Sequence[Scorer] = DEFAULT_SCORERS,
    order: Sequence[str] | None = None,
) -> PipelineResult:
    """`states` maps target id → run-time state; a missing id counts as available, nothing measured.
    With `order` (a route's target ids), each tier keeps that order instead of the ranking by score."""
    timings: dict[str, float] = defaultdict(float)
    removed: list[Removal] = []
    capable: list[Target] = []
    keyed_filters = [(f"filter:{f.name}", f) for f in filters]
    keyed_scorers = [(f"scorer:{s.name}", s) for s in scorers]
    for target in targets:
        state = states.get(target.id, UNKNOWN_STATE)
        for key, f in keyed_filters:
            start = timer()
            reason = f.apply(contract, target, state)
            timings[key] += timer() - start
            if reason is not None:
                removed.append(Removal(target.id, f.name, reason))
                break
        else:
            capable.append(target)

    unavailable = [t.id for t in capable if not states.get(t.id, UNKNOWN_STATE).available]
    ranked = [t for t in capable if t.id not in unavailable]
    weights = policy.weights_for(contract.strategy)
    peers = _peers(contract, ranked)
    cards: dict[str, ScoreCard] = {}
    for target in ranked:
        view = ScoreView(states.get(target.id, UNKNOWN_STATE), peers)
        scores: dict[str, ScorerScore] = {}
        for key, s in keyed_scorers:
            start = timer()
            raw = float(s.score(contract, target, view))
            timings[key] += timer() - start
            clamped = clamp(raw)
            weight = weights.get(s.name, 0.0)
            scores[s.name] = ScorerScore(raw, clamped, weight, clamped * weight)
        weight_sum = sum(sc.weight for sc in scores.values())
        total = sum(sc.weighted for sc in scores.values()) / weight_sum if weight_sum else 0.0
        cards[target.id] = ScoreCard(target.id, scores, total)

    def tier(kind: str) -> tuple[str, ...]:
        ids = [t.id for t in ranked if t.kind == kind]
        if order is not None:
            position = {target_id: n for n, target_id in enumerate(order)}
            return tuple(sorted(ids, key=lambda i: (position.get(i, len(position)), i)))
        return tuple(sorted(ids, key=lambda i: (-cards[i].total, i)))

    return PipelineResult(
        candidates=tuple(t.id for t in targets),
        removed=tuple(removed),
        capable=tuple(t.id for t in capable),
        unavailable=tuple(unavailable),
        scores=cards,
        tiers=(tier("local"), tier("cloud")),
        timings=dict(timings),
    )


def no_capable_model(result: PipelineResult, model: str | None = None) -> NoCapableModel:
    """The 422 error for a result without capable targets; every removal is in its `reasons`."""
    reasons: list[dict[str, Any]] = [r.to_dict() for r in result.removed]
    what = f"model {model!r}" if model else "this request"
    if not result.candidates:
        return NoCapableModel(f"no target is configured for {what}", reasons=reasons)
    quoted = "; ".join(f"{r.target}: {r.reason}" for r in result.removed[:_MESSAGE_REASONS])
    more = len(result.removed) - _MESSAGE_REASONS
    suffix = f"; and {more} more (see reasons)" if more > 0 else ""
    return NoCapableModel(
        f"no target can serve {what} under its contract ({len(result.candidates)} candidates): {quoted}{suffix}",
        reasons=reasons,
    )
