"""Each scorer's raw score: higher is better; unknowns scored as documented."""

from __future__ import annotations

from dataclasses import replace

import pytest

from router.request.contract import RequestContract
from router.routing.capabilities import ProviderModel, Target, cloud_target, local_target
from router.routing.plugins import Peers, ScoreView, TargetState
from router.routing.scorers import (
    UNKNOWN_LATENCY_SCORE,
    CostScorer,
    LatencyScorer,
    LocalityScorer,
    QualityScorer,
)

CONTRACT = RequestContract(
    model="qwen", scenario="s", level="L2", strategy="quality", est_prompt_tokens=1000, max_output_tokens=1000
)
LOCAL = local_target("qwen", {"max_model_len": 4096}, quality=0.4)


def _cloud(price: float | None = 1.0, latency: int | None = None, quality: float = 0.8) -> Target:
    entry = ProviderModel(
        name="m",
        snapshot="m-1",
        context_window=8192,
        region="us",
        price_in_per_mtok=price,
        price_out_per_mtok=price,
        quality=quality,
        expected_latency_ms=latency,
    )
    return cloud_target("p", "qwen", entry)


def _view(state: TargetState | None = None, **peers: float | None) -> ScoreView:
    return ScoreView(state or TargetState(), Peers(**peers))  # type: ignore[arg-type]


def test_quality() -> None:
    assert QualityScorer().score(CONTRACT, _cloud(quality=0.8), _view()) == 0.8
    assert QualityScorer().score(CONTRACT, LOCAL, _view()) == 0.4


@pytest.mark.parametrize(
    ("target", "scorer", "peer_max", "expected"),
    [
        # cost of _cloud(1.0) for 1000 + 1000 tokens: $0.002
        (_cloud(1.0), CostScorer(), 0.004, 0.5),
        (_cloud(1.0), CostScorer(), 0.002, 0.0),  # the most expensive candidate
        (_cloud(1.0), CostScorer(scale_usd=0.01), 0.002, 0.8),  # an explicit scale wins over peers
        (_cloud(1.0), CostScorer(scale_usd=0.001), None, -1.0),  # raw; the framework clamps
        (LOCAL, CostScorer(), 0.004, 1.0),  # free
        (LOCAL, CostScorer(), 0.0, 1.0),  # every candidate free
        (LOCAL, CostScorer(), None, 1.0),
        (_cloud(None), CostScorer(), 0.004, 0.0),  # unpriced: never favoured
    ],
)
def test_cost(target: Target, scorer: CostScorer, peer_max: float | None, expected: float) -> None:
    assert scorer.score(CONTRACT, target, _view(max_cost_usd=peer_max)) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("target", "state", "scorer", "peer_max", "expected"),
    [
        (_cloud(latency=500), TargetState(), LatencyScorer(), 1000.0, 0.5),
        (_cloud(latency=250), TargetState(), LatencyScorer(), 1000.0, 0.75),
        (_cloud(latency=500), TargetState(), LatencyScorer(scale_ms=2000), 1000.0, 0.75),
        (_cloud(latency=None), TargetState(), LatencyScorer(), 1000.0, UNKNOWN_LATENCY_SCORE),
        (
            replace(LOCAL, caps=replace(LOCAL.caps, expected_latency_ms=100)),
            TargetState(),
            LatencyScorer(),
            400.0,
            0.75,
        ),
        (_cloud(latency=0), TargetState(), LatencyScorer(), 0.0, 1.0),
    ],
)
def test_latency(target: Target, state: TargetState, scorer: LatencyScorer, peer_max: float, expected: float) -> None:
    assert scorer.score(CONTRACT, target, _view(state, max_latency_ms=peer_max)) == pytest.approx(expected)


def test_locality() -> None:
    assert LocalityScorer().score(CONTRACT, LOCAL, _view()) == 1.0
    assert LocalityScorer().score(CONTRACT, _cloud(), _view()) == 0.0


def test_scorers_are_pure_functions_of_their_inputs() -> None:
    view = _view(TargetState(quality=0.7), max_cost_usd=0.004, max_latency_ms=600.0)
    target = replace(_cloud(), id="cloud:p/qwen")
    for scorer in (QualityScorer(), CostScorer(), LatencyScorer(), LocalityScorer()):
        assert scorer.score(CONTRACT, target, view) == scorer.score(CONTRACT, target, view)
