"""A recorded run for the replay tests: the real Dispatcher (fake engine and providers) writing its
decision log through the real DecisionStore sink, as the gateway's `gateway.decisions_log` does."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from cluster.config.deployment import SpilloverConfig, dump_config, parse_config
from router.learning.decision import DecisionStore
from router.request.contract import derive_contract
from router.routing.snapshot import ClusterSnapshot, ReplicaStats
from serve_apps.clocks import Clocks
from serve_apps.dispatch.dispatcher import Dispatcher
from serve_apps.dispatch.parts import DispatchParts
from tests.fakes import FakeEngine, FakeProvider

T0 = 5000.0
CLOUD_MODEL = {
    "snapshot": "s-1",
    "context_window": 32768,
    "region": "us",
    "tools": True,
    "json_schema": True,
    "price_in_per_mtok": 0.1,
    "price_out_per_mtok": 0.4,
    "data_policy": "no_retention",
}
TOOLS = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]
SCHEMA = {"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "object", "required": ["x"]}}}


def config_data() -> dict[str, Any]:
    dear = {**CLOUD_MODEL, "name": "b-m", "price_in_per_mtok": 1.0, "price_out_per_mtok": 4.0}
    return {
        "models": [{"alias": "m", "source": "prepared:x", "family": "llama", "engine_args": {"max_model_len": 4096}}],
        "cloud": {
            "providers": [
                {"name": "sim", "base_url": "http://127.0.0.1:1/v1", "models": {"m": {**CLOUD_MODEL, "name": "a-m"}}},
                {"name": "sim2", "base_url": "http://127.0.0.1:2/v1", "models": {"m": dear}},
            ]
        },
        "policy": {
            "version": "v1",
            "scenarios": {"default": {"level": "L2"}, "private": {"level": "L1", "residency": "local_only"}},
        },
    }


def make_config(policy: dict[str, Any] | None = None) -> SpilloverConfig:
    data = config_data()
    if policy is not None:
        data["policy"] = policy
    return parse_config(data, "test")


def write_yaml(path: Path, config: SpilloverConfig) -> Path:
    path.write_text(json.dumps(dump_config(config)))  # JSON is YAML
    return path


# (request id, body, headers): plain chats stay local, tool calls go to cloud (local has no tools)
REQUESTS: list[tuple[str, dict[str, Any], dict[str, str]]] = [
    ("plain-1", {"messages": [{"role": "user", "content": "hi"}]}, {}),
    ("tools-1", {"messages": [{"role": "user", "content": "look it up"}], "tools": TOOLS}, {}),
    ("schema-1", {"messages": [{"role": "user", "content": "json"}], "response_format": SCHEMA}, {}),
    ("schema-2", {"messages": [{"role": "user", "content": "json again"}], "response_format": SCHEMA}, {}),
    ("tools-2", {"messages": [{"role": "user", "content": "and again"}], "tools": TOOLS}, {}),
    ("private-1", {"messages": [{"role": "user", "content": "secret"}]}, {"x-business-scenario": "private"}),
]


def record_run(log: Path, config: SpilloverConfig | None = None) -> list[str]:
    """Dispatch REQUESTS; the decision log's lines go to `log`. Returns the lines."""
    config = config or make_config()
    lines: list[str] = []
    now = [T0]
    replica = ReplicaStats("m", "r1", "n1", T0, 0.1, 0, 0, 0, 0, 364, 128)

    def snapshot() -> ClusterSnapshot:
        return ClusterSnapshot(taken_at=now[0], replicas=(replica,), max_age_s=1.0)

    store = DecisionStore(sink=lines.append)
    d = Dispatcher(
        config,
        FakeEngine(),
        {"sim": FakeProvider("sim"), "sim2": FakeProvider("sim2")},
        snapshot,
        clocks=Clocks.of(lambda: now[0]),
        parts=DispatchParts(decisions=store),
    )

    async def go() -> None:
        for request_id, body, headers in REQUESTS:
            full = {"model": "m", **body}
            contract = derive_contract(full, headers, config.policy)
            await d.dispatch("chat", full, request_id, contract=contract, deadline_s=5)

    asyncio.run(go())
    log.write_text("".join(line + "\n" for line in lines))
    return lines
