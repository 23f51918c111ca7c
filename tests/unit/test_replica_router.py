"""Replica choice: saturated replicas are left out before Ray's prefix-affinity router chooses."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from cluster.config import Watermarks, parse_config
from serve_apps.llm import llm_config_for
from serve_apps.replica_router import ROUTER_PATH, saturated, unsaturated

MARKS = {"kv_cache": 0.85, "gpu_memory": 0.85, "queue": 8}


@dataclass
class Replica:
    name: str
    routing_stats: dict[str, Any] = field(default_factory=dict)


def test_a_replica_is_saturated_by_any_one_term() -> None:
    assert not saturated({}, **MARKS)  # no reading yet: not held against it
    assert not saturated({"kv_cache_usage": 0.5, "num_waiting": 2, "gpu_memory_fraction": 0.3}, **MARKS)
    assert saturated({"kv_cache_usage": 0.9}, **MARKS)
    assert saturated({"num_waiting": 8}, **MARKS)
    assert saturated({"gpu_memory_fraction": 0.95}, **MARKS)


def test_saturated_replicas_are_left_out_unless_all_are() -> None:
    hot, cool = Replica("hot", {"kv_cache_usage": 0.95}), Replica("cool", {"kv_cache_usage": 0.1})
    assert [r.name for r in unsaturated([hot, cool], **MARKS)] == ["cool"]
    assert [r.name for r in unsaturated([hot], **MARKS)] == ["hot"]  # the gateway decides about bursting


def config(**model: Any) -> Any:
    return parse_config({"models": [{"alias": "m", "source": "prepared:x", "family": "qwen", **model}]}, "test")


def test_several_replicas_get_our_router_with_the_models_watermarks() -> None:
    spec = config(replicas=2, imbalanced_threshold=3).models[0]
    llm = llm_config_for(spec, "/models/m", Watermarks(kv_cache=0.5, queue=4, low=0.4))
    router = llm.deployment_config["request_router_config"]
    assert router["request_router_class"] == ROUTER_PATH
    assert router["request_router_kwargs"] == {
        "kv_cache": 0.5,
        "gpu_memory": 0.85,
        "queue": 4,
        "imbalanced_threshold": 3,
    }


def test_one_replica_or_power_of_two_keeps_rays_default() -> None:
    for spec in (config().models[0], config(replicas=2, replica_router="power_of_two").models[0]):
        assert "request_router_config" not in llm_config_for(spec, "/models/m").deployment_config
