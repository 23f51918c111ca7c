"""A gateway with only cloud routes and no local model, as a person runs it: `spillover serve --config
FILE` in a subprocess (its own Ray, Serve and the gateway; no vLLM engine), in front of two real
cloud-sim subprocesses, one speaking the OpenAI API and one the Anthropic Messages API (key required).

    routes:
      chat            cloud:sim-openai/chat, then cloud:sim-anthropic/chat
      chat-anthropic  cloud:sim-anthropic/chat, then cloud:sim-openai/chat
      tight           cloud:sim-openai/tight   (an entry whose max_output_tokens is 4)
      strict          cloud:sim-openai/strict, then cloud:sim-openai-b/strict (a third simulator; prompts
                      free, $10 per 1M output tokens: the cost ceiling's arithmetic is exact)

A pytest process of its own (one process holds one Ray; scripts/test runs it after the others).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from bench.cloud_sim.process import running_cloud_sim
from cluster.config.deployment import parse_config
from tests.local_serve import free_port, serving

START_TIMEOUT_S = 300
TTFT_S = "0.3"  # the simulators' time to first token (see cloud_only)
KEY_ENV = "SPILLOVER_TEST_ROUTES_ANTHROPIC_KEY"
ANTHROPIC_KEY = "sk-ant-routes-sim-key-never-printed-51c9"
CAPS = {
    "snapshot": "sim-2026-11",
    "context_window": 32768,
    "tools": True,
    "region": "sim",
    "data_policy": "no_retention",
}


@dataclass(frozen=True)
class CloudOnly:
    base_url: str  # the gateway, without /v1
    openai_sim: str  # control root of the OpenAI-protocol simulator
    anthropic_sim: str  # control root of the Anthropic-protocol simulator
    spare_sim: str  # control root of the second OpenAI-protocol simulator (sim-openai-b)
    log: Path  # `spillover serve`'s output
    pid: int  # of `spillover serve` (the Ray it started runs as its children)

    @property
    def openai_base(self) -> str:
        return f"{self.base_url}/v1"


def cloud_only_config(ports: dict[str, int], ledger: Path) -> dict:
    openai_entry = {
        **CAPS,
        "name": "sim-chat",
        "json_schema": True,
        "price_in_per_mtok": 0.15,
        "price_out_per_mtok": 0.6,
    }
    strict = {**openai_entry, "price_in_per_mtok": 0, "price_out_per_mtok": 10}
    raw = {
        "gateway": {"port": ports["gateway"], "readiness_timeout_s": START_TIMEOUT_S},
        "cluster": {"num_cpus": 2},
        "models": [],
        "cloud": {
            "providers": [
                {
                    "name": "sim-openai",
                    "base_url": f"http://127.0.0.1:{ports['openai']}/v1",
                    "timeout_s": 5,
                    "models": {
                        "chat": openai_entry,
                        "tight": {**openai_entry, "max_output_tokens": 4},
                        "strict": strict,
                    },
                },
                {
                    "name": "sim-openai-b",
                    "base_url": f"http://127.0.0.1:{ports['spare']}/v1",
                    "timeout_s": 5,
                    "models": {"strict": strict},
                },
                {
                    "name": "sim-anthropic",
                    "type": "anthropic",
                    "base_url": f"http://127.0.0.1:{ports['anthropic']}/v1",
                    "api_key_env": KEY_ENV,
                    "timeout_s": 5,
                    "models": {
                        "chat": {**CAPS, "name": "sim-claude", "price_in_per_mtok": 0.15, "price_out_per_mtok": 0.6}
                    },
                },
            ]
        },
        "routes": [
            {"alias": "chat", "targets": ["cloud:sim-openai/chat", "cloud:sim-anthropic/chat"]},
            {"alias": "chat-anthropic", "targets": ["cloud:sim-anthropic/chat", "cloud:sim-openai/chat"]},
            {"alias": "tight", "targets": ["cloud:sim-openai/tight"]},
            {"alias": "strict", "targets": ["cloud:sim-openai/strict", "cloud:sim-openai-b/strict"]},
        ],
        "resilience": {"breaker": {"window_s": 10, "min_requests": 3, "open_s": 3}},
        "spend": {"ledger": str(ledger)},
    }
    parse_config(raw, "cloud-only test config")  # fail here, not in the subprocess, if it is invalid
    return raw


@pytest.fixture(scope="session")
def cloud_only(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CloudOnly]:
    folder = tmp_path_factory.mktemp("cloud-only")
    ports = {name: free_port() for name in ("openai", "anthropic", "spare", "gateway")}
    config = folder / "cloud-only.yaml"
    config.write_text(yaml.safe_dump(cloud_only_config(ports, folder / "spend")))
    env = {**os.environ, KEY_ENV: ANTHROPIC_KEY, "PYTHONUNBUFFERED": "1", "RAY_DEDUP_LOGS": "1"}
    os.environ[KEY_ENV] = ANTHROPIC_KEY  # the Anthropic simulator reads it too
    # The two `chat` entries cost the same and answer after TTFT_S: the live health score
    # (router/resilience/health_score.py) weighs latency against a target's own best p95 and cost against the
    # cheapest, and these tests assert the route's order — a price gap plus the machine's own latency noise on a
    # 20 ms answer shed a share of the first target's requests to the second on a slower CPU. Routing by the
    # score is tested in tests/integration/test_traffic_weights.py.
    anthropic_args = ["--api", "anthropic", "--ttft-s", TTFT_S, "--api-key-env", KEY_ENV]
    log_path = folder / "serve.log"
    with (
        running_cloud_sim(ports["openai"], ["sim-chat"], extra_args=["--ttft-s", TTFT_S]) as openai_url,
        running_cloud_sim(ports["anthropic"], ["sim-claude"], extra_args=anthropic_args) as anthropic_url,
        running_cloud_sim(ports["spare"], ["sim-chat"], extra_args=["--ttft-s", "0.02"]) as spare_url,
        serving(["--config", str(config)], env, log_path, timeout_s=START_TIMEOUT_S) as serve,
    ):
        yield CloudOnly(
            f"http://127.0.0.1:{ports['gateway']}",
            openai_url.removesuffix("/v1"),
            anthropic_url.removesuffix("/v1"),
            spare_url.removesuffix("/v1"),
            log_path,
            serve.pid,
        )
