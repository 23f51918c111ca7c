"""Scorers: rank the targets that passed every filter. Higher is better; the framework clamps each
raw score to 0..1 and weighs it by the scenario strategy's row of `Policy.weights`.

    quality    the quality learned for the request's bucket once it has enough samples (router/learning/quality.py,
               in the target's state), else the target's configured quality (0..1)
    cost       1 − estimated request cost / scale; scale = `scale_usd` when given, else the most
               expensive surviving candidate (so costs compare proportionally; free local → 1).
               Unpriced → 0: an unknown price may be any price.
    latency    1 − expected latency / scale; expected = the target's configured expected_latency_ms (live
               latency moves traffic through the health-score weight, not here); scale = `scale_ms` or the
               slowest surviving candidate. Unknown → 0.5: neither rewarded nor punished.
    locality   local 1, cloud 0 (tier order already puts local first; this ranks within mixed lists)
"""

from __future__ import annotations

from dataclasses import dataclass

from router.request.contract import RequestContract
from router.routing.capabilities import Target, estimate_cost_usd
from router.routing.plugins import Scorer, ScoreView, expected_latency_ms

UNKNOWN_LATENCY_SCORE = 0.5


@dataclass(frozen=True)
class QualityScorer:
    name: str = "quality"

    def score(self, contract: RequestContract, target: Target, view: ScoreView) -> float:
        return target.caps.quality if view.state.quality is None else view.state.quality


@dataclass(frozen=True)
class CostScorer:
    scale_usd: float | None = None
    name: str = "cost"

    def score(self, contract: RequestContract, target: Target, view: ScoreView) -> float:
        estimate = estimate_cost_usd(target.caps, contract.est_prompt_tokens, contract.max_output_tokens)
        if estimate is None:
            return 0.0
        scale = self.scale_usd or view.peers.max_cost_usd
        if not scale:
            return 1.0  # every candidate is free
        return 1.0 - estimate / scale


@dataclass(frozen=True)
class LatencyScorer:
    scale_ms: float | None = None
    name: str = "latency"

    def score(self, contract: RequestContract, target: Target, view: ScoreView) -> float:
        latency = expected_latency_ms(target)
        if latency is None:
            return UNKNOWN_LATENCY_SCORE
        scale = self.scale_ms or view.peers.max_latency_ms
        if not scale:
            return 1.0
        return 1.0 - latency / scale


@dataclass(frozen=True)
class LocalityScorer:
    name: str = "locality"

    def score(self, contract: RequestContract, target: Target, view: ScoreView) -> float:
        return 1.0 if target.kind == "local" else 0.0


DEFAULT_SCORERS: tuple[Scorer, ...] = (QualityScorer(), CostScorer(), LatencyScorer(), LocalityScorer())
