"""The launch test's configs, derived in code from the files a user runs (never a second copy).

* `cluster_variant`: ray-cluster.yaml with only the hosts, the SSH user and key, and the checkout's
  location changed. The test hosts share the machine's filesystem, so the checkout (and its .venv)
  is already at the same path on every host: `~/spillover` becomes that path, and the file mount
  copies the checkout onto itself (rsync finds nothing to send).
* `spillover_variant`: configs/local.yaml (SmolLM2 on vLLM-CPU) as a cluster deployment: connect to
  the running cluster, listen beyond loopback with auth on, the gateway replicas on the head (as
  configs/gpu.yaml places them), one tenant whose key comes from the nodes' environment, and a model
  replica that asks for more CPUs than the head has, so Ray must place it on a worker.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

CHECKOUT = "~/spillover"


def _replace_paths(value: Any, checkout: str) -> Any:
    if isinstance(value, str):
        return value.replace(CHECKOUT, checkout)
    if isinstance(value, list):
        return [_replace_paths(v, checkout) for v in value]
    if isinstance(value, dict):
        return {_replace_paths(k, checkout): _replace_paths(v, checkout) for k, v in value.items()}
    return value


def cluster_variant(
    real: dict[str, Any], *, head_ip: str, worker_ips: list[str], user: str, key: Path, checkout: Path
) -> dict[str, Any]:
    variant = _replace_paths(copy.deepcopy(real), str(checkout))
    variant["provider"] = {**variant["provider"], "head_ip": head_ip, "worker_ips": list(worker_ips)}
    variant["auth"] = {**variant["auth"], "ssh_user": user, "ssh_private_key": str(key)}
    return variant


def spillover_variant(local: dict[str, Any], *, key_env: str, model_cpus: int, state_url: str) -> dict[str, Any]:
    config = copy.deepcopy(local)
    config["cluster"] = {"num_cpus": None, "address": "auto"}
    config["gateway"] = {
        **config["gateway"],
        "host": "0.0.0.0",  # every node's Serve proxy binds it; the test calls the head's address
        # as configs/gpu.yaml: the gateway replicas on the head (ray-cluster.yaml gives it the resource), so its
        # direct_port (configs/local.yaml's 8001) is where clients call
        "resources": {"spillover_gateway": 1},
        "auth": True,
        "readiness_timeout_s": 300,
    }
    config["tenants"] = [{"name": "launch-test", "api_key_env": key_env}]
    # the head's Redis (ray-cluster.yaml starts it) from the first deploy, as configs/gpu.yaml does: the scale
    # step then changes gateway.replicas alone, which Serve applies without restarting the model's replica
    config["state"] = {"url": state_url}
    (model,) = config["models"]
    model["num_cpus"] = model_cpus
    # float32 eager, where local.yaml's `precision: auto` ends on every CPU (docs/dtype.md), set outright: this
    # test is about the launcher, and each test host has a private home, so on a CPU with native bf16 auto
    # would first try bf16 compiled with a cold compile cache: minutes inside a 300 s readiness wait
    model["engine_args"] = {**model["engine_args"], "dtype": "float32", "enforce_eager": True}
    return config
