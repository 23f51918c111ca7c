"""The pipeline framework: filter order, clamping, strategy weights, tiers, timing, NO_CAPABLE_MODEL."""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass

import pytest

from cluster.config.deployment import parse_config
from router.request.contract import RequestContract, derive_contract
from router.routing.capabilities import ProviderModel, Registry, Target, cloud_target, local_target
from router.routing.filters import CheckFilter
from router.routing.pipeline import clamp, no_capable_model, run_pipeline
from router.routing.plugins import ScoreView, TargetState
from router.routing.policy import Policy

CONTRACT = RequestContract(model="qwen", scenario="s", level="L2", strategy="quality", est_prompt_tokens=100)


def _cloud(provider: str, quality: float, price: float, **extra: object) -> Target:
    entry = ProviderModel.model_validate(
        {
            "name": f"{provider}-model",
            "snapshot": "s1",
            "context_window": 8192,
            "region": "us",
            "price_in_per_mtok": price,
            "price_out_per_mtok": price,
            "quality": quality,
            **extra,
        }
    )
    return cloud_target(provider, "qwen", entry)


LOCAL = local_target("qwen", {"max_model_len": 8192}, quality=0.3)
PREMIUM = _cloud("premium", 0.9, 10.0)
BUDGET = _cloud("budget", 0.5, 0.5)
ONLY = {"quality": {"quality": 1.0}, "cost": {"cost": 1.0}, "latency": {"latency": 1.0}}


@dataclass(frozen=True)
class _Fixed:
    name: str
    value: float

    def score(self, contract: RequestContract, target: Target, view: ScoreView) -> float:
        return self.value


@pytest.mark.parametrize(("raw", "clamped"), [(2.0, 1.0), (-1.0, 0.0), (float("nan"), 0.0), (0.25, 0.25)])
def test_clamp(raw: float, clamped: float) -> None:
    assert clamp(raw) == clamped


def test_framework_clamps_and_weighs() -> None:
    policy = Policy(weights={"quality": {"quality": 3.0, "cost": 1.0}})
    scorers = [_Fixed("quality", 2.0), _Fixed("cost", -5.0), _Fixed("latency", 0.5)]
    result = run_pipeline(CONTRACT, [BUDGET], {}, policy, scorers=scorers)
    card = result.scores[BUDGET.id]
    q, c, lat = card.scores["quality"], card.scores["cost"], card.scores["latency"]
    assert (q.raw, q.clamped, q.weight, q.weighted) == (2.0, 1.0, 3.0, 3.0)
    assert (c.raw, c.clamped, c.weight, c.weighted) == (-5.0, 0.0, 1.0, 0.0)
    assert (lat.clamped, lat.weight, lat.weighted) == (0.5, 0.0, 0.0)  # not in the strategy's row
    assert card.total == pytest.approx(3.0 / 4.0)  # Σ weighted / Σ weights


@pytest.mark.parametrize(
    ("strategy", "cloud_order"),
    [
        ("quality", ("cloud:premium/qwen", "cloud:budget/qwen")),
        ("cost", ("cloud:budget/qwen", "cloud:premium/qwen")),
    ],
)
def test_strategy_weights_rank_the_cloud_tier(strategy: str, cloud_order: tuple[str, ...]) -> None:
    contract = RequestContract(model="qwen", scenario="s", level="L2", strategy=strategy)  # type: ignore[arg-type]
    result = run_pipeline(contract, [PREMIUM, LOCAL, BUDGET], {}, Policy(weights=ONLY))  # type: ignore[arg-type]
    assert result.tiers == (("local:qwen",), cloud_order)
    assert result.ranked == ("local:qwen", *cloud_order)


def test_local_tier_first_even_with_a_lower_score() -> None:
    result = run_pipeline(CONTRACT, [PREMIUM, LOCAL], {}, Policy(weights=ONLY))  # type: ignore[arg-type]
    assert result.scores["local:qwen"].total < result.scores["cloud:premium/qwen"].total
    assert result.tiers == (("local:qwen",), ("cloud:premium/qwen",))


def test_ties_broken_by_target_id() -> None:
    a, b, c = (_cloud(p, 0.5, 1.0) for p in ("zeta", "alpha", "mid"))
    result = run_pipeline(CONTRACT, [a, b, c], {}, Policy())
    assert result.tiers[1] == ("cloud:alpha/qwen", "cloud:mid/qwen", "cloud:zeta/qwen")


def test_first_failing_filter_removes_and_later_ones_do_not_run() -> None:
    calls: list[str] = []

    def record(name: str, reason: str | None) -> CheckFilter:
        def check(contract: RequestContract, target: Target, state: TargetState) -> str | None:
            calls.append(f"{name}:{target.id}")
            return reason if target.kind == "cloud" else None

        return CheckFilter(name, check)

    filters = [record("first", "nope"), record("second", "never")]
    result = run_pipeline(CONTRACT, [BUDGET, LOCAL], {}, Policy(), filters=filters)
    assert [(r.target, r.filter, r.reason) for r in result.removed] == [("cloud:budget/qwen", "first", "nope")]
    assert calls == ["first:cloud:budget/qwen", "first:local:qwen", "second:local:qwen"]
    assert result.capable == ("local:qwen",)


def test_unavailable_targets_are_capable_but_get_no_tier() -> None:
    states = {PREMIUM.id: TargetState(available=False), LOCAL.id: TargetState()}
    result = run_pipeline(CONTRACT, [PREMIUM, LOCAL, BUDGET], states, Policy())
    assert result.capable == (PREMIUM.id, LOCAL.id, BUDGET.id)
    assert result.unavailable == (PREMIUM.id,)
    assert result.tiers == ((LOCAL.id,), (BUDGET.id,))  # a saturated local target stays: the caller decides
    assert PREMIUM.id not in result.scores


def test_peers_are_the_surviving_candidates() -> None:
    # premium is removed by the cost ceiling, so budget is the most expensive survivor: cost score 0
    contract = RequestContract(
        model="qwen", scenario="s", level="L2", strategy="cost", est_prompt_tokens=1000, max_cost_usd=0.001
    )
    result = run_pipeline(contract, [PREMIUM, BUDGET, LOCAL], {}, Policy())
    assert [r.target for r in result.removed] == [PREMIUM.id]
    assert result.scores[BUDGET.id].scores["cost"].clamped == 0.0
    assert result.scores[LOCAL.id].scores["cost"].clamped == 1.0


def test_timings_per_plugin_with_a_fake_timer() -> None:
    ticks = itertools.count()
    result = run_pipeline(
        CONTRACT,
        [LOCAL, BUDGET, cloud_target("x", "qwen", "bare-name")],
        {},
        Policy(),
        timer=lambda: float(next(ticks)),
    )
    # each call costs one tick; the bare-name target stops at the first filter
    assert result.timings["filter:capabilities_known"] == 3.0
    assert result.timings["filter:quality_floor"] == 2.0
    assert result.timings["filter:cost"] == 2.0
    assert {result.timings[f"scorer:{s}"] for s in ("quality", "cost", "latency", "locality")} == {2.0}
    assert len(result.timings) == 16 + 4  # the 16 default filters and 4 scorers


def test_no_capable_model_lists_every_candidate_without_secrets() -> None:
    config = parse_config(
        {
            "models": [{"alias": "qwen", "source": "x", "family": "qwen", "engine_args": {"max_model_len": 4096}}],
            "cloud": {
                "providers": [
                    {
                        "name": "acme",
                        "base_url": "https://secret-host.example/v1",
                        "api_key_env": "ACME_SECRET_KEY",
                        "models": {"qwen": "acme-large"},
                    }
                ]
            },
        },
        "test",
    )
    registry = Registry(
        (*Registry.from_config(config.models, config.cloud.providers).targets, _cloud("plain", 0.9, 1.0))
    )
    body = {
        "model": "qwen",
        "messages": [{"role": "user", "content": "hi"}],
        "tools": [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}],
    }
    contract = derive_contract(body, {}, Policy())
    result = run_pipeline(contract, registry.for_alias("qwen"), {}, Policy())
    assert result.capable == () and result.tiers == ((), ())

    err = no_capable_model(result, "qwen")
    assert (err.status_code, err.code) == (422, "no_capable_model")
    payload = err.to_openai()
    assert payload["error"]["reasons"] == [
        {"target": "local:qwen", "filter": "tools", "reason": "tools (function calling) not supported"},
        {
            "target": "cloud:acme/qwen",
            "filter": "capabilities_known",
            "reason": "capabilities unknown (configure them; never inferred from the model name)",
        },
        {"target": "cloud:plain/qwen", "filter": "tools", "reason": "tools (function calling) not supported"},
    ]
    assert payload["error"]["code"] == "no_capable_model"
    assert "model 'qwen'" in payload["error"]["message"] and "3 candidates" in payload["error"]["message"]
    text = json.dumps(payload)
    for secret in ("secret-host", "https://", "ACME_SECRET_KEY", "acme-large"):
        assert secret not in text


def test_no_capable_model_without_candidates() -> None:
    err = no_capable_model(run_pipeline(CONTRACT, [], {}, Policy()), "ghost")
    assert err.message == "no target is configured for model 'ghost'"
    assert err.to_openai()["error"]["reasons"] == []


def test_no_capable_model_message_is_bounded() -> None:
    targets = [cloud_target(f"p{i}", "qwen", "name") for i in range(10)]
    err = no_capable_model(run_pipeline(CONTRACT, targets, {}, Policy()))
    assert "and 7 more (see reasons)" in err.message
    assert len(err.reasons) == 10
