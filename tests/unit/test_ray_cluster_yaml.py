"""ray-cluster.yaml passes Ray's own cluster-launcher validation (the path `ray up` takes).

tests/cluster_launch runs the file for real (`ray up` on SSH hosts); these checks are the fast part.
"""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
TOKEN = "~/.ray/auth_token"
STATE_PASSWORD = "~/.spillover/state_password"


def _validate(config: dict) -> dict:
    from ray.autoscaler._private.util import prepare_config, validate_config

    prepared = prepare_config(config)
    validate_config(prepared)
    return prepared


def test_ray_cluster_yaml_is_valid() -> None:
    config = yaml.safe_load((REPO / "ray-cluster.yaml").read_text())
    prepared = _validate(config)
    assert prepared["provider"]["type"] == "local"
    assert any("SPILLOVER_EXTRA=${SPILLOVER_EXTRA:-gpu} scripts/setup" in c for c in prepared["setup_commands"])
    assert any("ray start --head" in c for c in prepared["head_start_ray_commands"])


def test_validation_catches_a_bad_key() -> None:
    config = yaml.safe_load((REPO / "ray-cluster.yaml").read_text())
    config["worker_start_ray_command"] = []  # typo of worker_start_ray_commands
    with pytest.raises(jsonschema.ValidationError):
        _validate(config)


def test_ray_dashboard_binds_loopback() -> None:
    """The dashboard's job API runs code on the cluster: it listens on the head's loopback only,
    reached through `ray dashboard ray-cluster.yaml` (an SSH tunnel)."""
    config = yaml.safe_load((REPO / "ray-cluster.yaml").read_text())
    (start,) = [c for c in config["head_start_ray_commands"] if "ray start --head" in c]
    hosts = [word.split("=", 1)[1] for word in start.split() if word.startswith("--dashboard-host")]
    assert hosts == ["127.0.0.1"]
    assert "0.0.0.0" not in json.dumps(config)


def test_every_ray_start_turns_on_token_auth_with_the_shipped_token_file() -> None:
    """Ray's ports (GCS, raylets, workers, Ray Client, dashboard, each node's agent and its job API) run
    code for whoever reaches them unless RAY_AUTH_MODE=token: both start lines set it, the nodes' shells
    too (the Ray CLIs run there), and the token travels as a file from the launching machine, never in
    this file (tests/cluster_launch shows the ports refusing a caller without it)."""
    config = yaml.safe_load((REPO / "ray-cluster.yaml").read_text())
    starts = [c for c in config["head_start_ray_commands"] + config["worker_start_ray_commands"] if "ray start" in c]
    assert len(starts) == 2
    assert all("RAY_AUTH_MODE=token" in c for c in starts)
    assert any("export RAY_AUTH_MODE=token" in c for c in config["setup_commands"])
    assert config["file_mounts"][TOKEN] == TOKEN
    assert "RAY_AUTH_TOKEN" not in json.dumps(config)  # no token (nor a path to one) in the file


def test_every_ray_start_bounds_the_serve_proxies() -> None:
    """Serve's proxies on every node serve with gateway.http_limits (serve_apps/http/limits.py)."""
    from serve_apps.http.limits import CALLBACK, CALLBACK_ENV

    config = yaml.safe_load((REPO / "ray-cluster.yaml").read_text())
    starts = [c for c in config["head_start_ray_commands"] + config["worker_start_ray_commands"] if "ray start" in c]
    assert all(f"{CALLBACK_ENV}={CALLBACK}" in c for c in starts)


def test_launch_test_variant_differs_only_in_hosts_user_key_and_paths() -> None:
    from tests.cluster_launch.launch_config import CHECKOUT, cluster_variant

    real = yaml.safe_load((REPO / "ray-cluster.yaml").read_text())
    checkout = Path("/srv/checkout")
    variant = cluster_variant(
        real, head_ip="10.0.0.1", worker_ips=["10.0.0.2"], user="root", key=Path("/k"), checkout=checkout
    )
    assert variant["provider"] == {"type": "local", "head_ip": "10.0.0.1", "worker_ips": ["10.0.0.2"]}
    assert variant["auth"] == {"ssh_user": "root", "ssh_private_key": "/k"}
    assert variant["file_mounts"] == {str(checkout): ".", TOKEN: TOKEN, STATE_PASSWORD: STATE_PASSWORD}
    back = json.loads(json.dumps(variant).replace(str(checkout), CHECKOUT))
    for key in ("provider", "auth"):
        back[key] = real[key]
    assert back == real
    _validate(variant)


def test_the_head_bounds_the_task_events_its_gcs_keeps() -> None:
    """Every actor call (each request through Serve, each stats push) leaves a task event in the GCS; Ray's
    default keeps 100,000 (~340 MiB): the head keeps what `spillover serve`'s own Ray keeps."""
    from serve_apps.runner import TASK_EVENTS_IN_GCS

    config = yaml.safe_load((REPO / "ray-cluster.yaml").read_text())
    (start,) = [c for c in config["head_start_ray_commands"] if "ray start --head" in c]
    assert f"RAY_task_events_max_num_task_in_gcs={TASK_EVENTS_IN_GCS}" in start.split()


def test_the_head_starts_the_shared_store_that_configs_gpu_yaml_names_before_ray() -> None:
    from cluster.config.deployment import load_config

    config = yaml.safe_load((REPO / "ray-cluster.yaml").read_text())
    starts = config["head_start_ray_commands"]
    (store,) = [i for i, c in enumerate(starts) if "serve_apps.state.local_redis" in c]
    (head,) = [i for i, c in enumerate(starts) if "ray start --head" in c]
    assert store < head  # the store answers before any gateway replica can start
    line = starts[store]
    assert "--host auto" in line and "--port 6380" in line and f"--password-file {STATE_PASSWORD}" in line
    assert config["file_mounts"][STATE_PASSWORD] == STATE_PASSWORD
    assert any("SPILLOVER_STATE_PASSWORD" in c and STATE_PASSWORD in c for c in config["setup_commands"])
    gpu = load_config(str(REPO / "configs" / "gpu.yaml"))
    assert gpu.state.url == f"redis://{config['provider']['head_ip']}:6380/0"
    assert gpu.state.password_env == "SPILLOVER_STATE_PASSWORD"
