"""ray-cluster.yaml passes Ray's own cluster-launcher validation (the path `ray up` takes)."""

from __future__ import annotations

from pathlib import Path

import jsonschema
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]


def _validate(config: dict) -> dict:
    from ray.autoscaler._private.util import prepare_config, validate_config

    prepared = prepare_config(config)
    validate_config(prepared)
    return prepared


def test_ray_cluster_yaml_is_valid() -> None:
    config = yaml.safe_load((REPO / "ray-cluster.yaml").read_text())
    prepared = _validate(config)
    assert prepared["provider"]["type"] == "local"
    assert any("SPILLOVER_EXTRA=gpu scripts/setup" in c for c in prepared["setup_commands"])
    assert any("ray start --head" in c for c in prepared["head_start_ray_commands"])


def test_validation_catches_a_bad_key() -> None:
    config = yaml.safe_load((REPO / "ray-cluster.yaml").read_text())
    config["worker_start_ray_command"] = []  # typo of worker_start_ray_commands
    with pytest.raises(jsonschema.ValidationError):
        _validate(config)
