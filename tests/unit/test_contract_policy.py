"""Policy and scenario models: data with a version, validated with the field path and reason."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from router.routing.policy import DEFAULT_WEIGHTS, SCORER_NAMES, Policy, Scenario
from router.routing.scorers import DEFAULT_SCORERS


def test_defaults() -> None:
    policy = Policy()
    assert policy.version == "1"
    assert policy.default_name == "default"
    assert policy.scenarios["default"] == Scenario()
    s = Scenario()
    assert (s.level, s.strategy, s.allowed_targets, s.residency) == ("L2", "quality", ["*"], "any")
    assert (s.max_cost_usd, s.deadline_ms, s.quality_floor) == (None, None, 0)
    assert policy.weights == DEFAULT_WEIGHTS


def test_scorer_names_match_the_default_scorers() -> None:
    assert tuple(s.name for s in DEFAULT_SCORERS) == SCORER_NAMES


def test_weights_merge_per_strategy() -> None:
    policy = Policy(weights={"cost": {"cost": 1.0}})
    assert policy.weights_for("cost") == {"cost": 1.0}
    assert policy.weights_for("quality") == DEFAULT_WEIGHTS["quality"]


def test_from_yaml_like_data() -> None:
    policy = Policy.model_validate(
        {
            "version": "2025-06-01",
            "require_scenario": True,
            "scenarios": {
                "ticket_routing": {"level": "L1", "residency": ["eu-west"], "allowed_targets": ["local:*"]},
                "marketing-copy": {"level": "L3", "strategy": "cost", "max_cost_usd": 0.01},
            },
        }
    )
    assert policy.default_name is None
    assert policy.scenarios["ticket_routing"].residency == ["eu-west"]


@pytest.mark.parametrize(
    ("data", "fragment"),
    [
        ({"default_scenario": "nope"}, "default_scenario 'nope' is not among the scenarios \\['default'\\]"),
        ({"scenarios": {"a": {}}}, "need a default"),
        ({"scenarios": {}}, "at least 1 item"),
        ({"scenarios": {"bad name": {}}, "require_scenario": True}, "scenario names"),
        ({"weights": {"quality": {"speed": 1}}}, "unknown scorers \\['speed'\\]"),
        ({"weights": {"quality": {"cost": -1}}}, "weights must be >= 0"),
        ({"weights": {"quality": {"cost": 0}}}, "at least one weight must be > 0"),
        ({"weights": {"fastest": {"cost": 1}}}, "quality"),
        ({"version": ""}, "at least 1 character"),
        ({"colour": 1}, "Extra inputs are not permitted"),
        ({"scenarios": {"default": {"level": "L4"}}}, "L1"),
        ({"scenarios": {"default": {"residency": []}}}, "at least one non-empty region"),
        ({"scenarios": {"default": {"residency": ["eu", "any"]}}}, "not regions"),
        ({"scenarios": {"default": {"residency": "nowhere"}}}, "residency"),
        ({"scenarios": {"default": {"allowed_targets": []}}}, "at least 1 item"),
        ({"scenarios": {"default": {"allowed_targets": [" "]}}}, "non-empty"),
        ({"scenarios": {"default": {"max_cost_usd": 0}}}, "greater than 0"),
        ({"scenarios": {"default": {"quality_floor": 2}}}, "less than or equal to 1"),
    ],
)
def test_invalid_policies(data: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ValidationError, match=fragment):
        Policy.model_validate(data)


def test_policy_is_frozen() -> None:
    with pytest.raises(ValidationError):
        Policy().version = "2"  # type: ignore[misc]


def test_round_trips_through_plain_data() -> None:
    policy = Policy(
        version="3",
        default_scenario="eu",
        scenarios={"eu": Scenario(level="L1", residency=["eu-west"], max_cost_usd=0.1), "x": Scenario()},
        weights={"cost": {"cost": 2.0, "quality": 1.0}},
    )
    assert Policy.model_validate(policy.model_dump(mode="json")) == policy
    assert Policy.model_validate(Policy().model_dump(mode="json")) == Policy()
