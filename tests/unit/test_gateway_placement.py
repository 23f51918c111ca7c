"""Where clients call: the shipped configs serve on `gateway.direct_port`, and `configs/gpu.yaml` places its
gateway replicas with `gateway.resources` on the node that `ray-cluster.yaml` gives that resource (the head),
with room for every replica autoscaling may start (docs/architecture.md "Ingress"). tests/cluster_launch
deploys this placement on two real Ray nodes and calls the head's direct port."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from cluster.config.deployment import load_config
from cluster.config.gateway import GatewaySection

REPO = Path(__file__).resolve().parents[2]


def _head_resources() -> dict[str, float]:
    cluster = yaml.safe_load((REPO / "ray-cluster.yaml").read_text())
    (start,) = [c for c in cluster["head_start_ray_commands"] if "ray start --head" in c]
    (flag,) = [w for w in shlex.split(start) if w.startswith("--resources=")]
    return dict(json.loads(flag.removeprefix("--resources=")))


def test_the_shipped_configs_serve_clients_on_the_direct_port() -> None:
    for name in ("local.yaml", "gpu.yaml", "gpu-sim.yaml"):
        gateway = load_config(str(REPO / "configs" / name)).gateway
        assert (gateway.port, gateway.direct_port) == (8000, 8001), name


def test_gpu_yaml_puts_every_gateway_replica_on_the_head() -> None:
    gateway = load_config(str(REPO / "configs" / "gpu.yaml")).gateway
    head = _head_resources()
    assert gateway.autoscaling is not None and gateway.resources
    for name, amount in gateway.resources.items():
        assert head[name] >= amount * gateway.autoscaling.max_replicas, name
    workers = yaml.safe_load((REPO / "ray-cluster.yaml").read_text())["worker_start_ray_commands"]
    assert not any(name in " ".join(workers) for name in gateway.resources)  # the head only: one address


@pytest.mark.parametrize(
    ("resources", "message"),
    [
        ({"CPU": 1}, "not a custom resource name"),
        ({"GPU": 1}, "not a custom resource name"),
        ({"bad name;rm": 1}, "not a custom resource name"),
        ({"spillover_gateway": 0}, r"not in \(0, 10000\]"),
        ({"spillover_gateway": float("nan")}, r"not in \(0, 10000\]"),
        ({"spillover_gateway": float("inf")}, r"not in \(0, 10000\]"),
    ],
)
def test_gateway_resources_must_be_custom_and_positive(resources: dict[str, float], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        GatewaySection(resources=resources)


def test_gateway_resources_default_to_any_node() -> None:
    assert GatewaySection().resources == {}
    assert GatewaySection(resources={"spillover_gateway": 0.5}).resources == {"spillover_gateway": 0.5}
