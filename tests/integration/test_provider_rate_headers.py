"""A provider's rate-limit headers gate what the gateway sends, on the real stack: cloud-sim reports its account
limit on every answer (OpenAI's x-ratelimit-* headers, bench/cloud_sim/provider/account_limits.py); once an answer
says no request is left, the gateway sends that provider nothing more until the reset it named — the next request
goes to cloud-sim-b without cloud-sim ever having to refuse one with a 429 — and sends to it again after the reset
(router/limits/rate_headers.py, docs/resilience.md). The window is 6 s here (a provider's is a minute)."""

from __future__ import annotations

import time
import uuid
from typing import Any

import httpx
import pytest

from tests.integration.conftest import CONTROL_HEADERS, Stack
from tests.integration.qwen_load import cloud_requests

pytestmark = pytest.mark.integration

SMOL = "smollm2-135m-instruct"
LONG = [{"role": "user", "content": "hello " * 5000}]  # beyond SmolLM2's window: only the cloud can take it
CLOUDS = {"x-spillover-providers": "cloud-sim,cloud-sim-b"}
WINDOW_S = 6.0


def ask(stack: Stack, prefix: str) -> tuple[str, str]:
    request_id = f"{prefix}-{uuid.uuid4().hex}"
    response = httpx.post(
        f"{stack.openai_base}/chat/completions",
        json={"model": SMOL, "messages": LONG, "max_tokens": 4},
        headers={**CLOUDS, "x-request-id": request_id},
        timeout=60,
    )
    assert response.status_code == 200, response.text
    return request_id, response.headers["x-spillover-target"]


def resilience(stack: Stack) -> dict[str, Any]:
    return dict(httpx.get(f"{stack.base_url}/v1/spillover/resilience", timeout=10).json())


@pytest.mark.usefixtures("resets_after")
def test_a_provider_whose_headers_say_its_account_is_spent_gets_nothing_until_the_reset(stack: Stack) -> None:
    control = f"{stack.sim_url.removesuffix('/v1')}/control/faults"
    limits = {"rpm_limit": 2, "limit_window_s": WINDOW_S}
    httpx.post(control, json=limits, headers=CONTROL_HEADERS, timeout=10).raise_for_status()
    started = time.monotonic()
    sent = [ask(stack, "rate-headers") for _ in range(3)]
    targets = [target for _, target in sent]
    # cloud-sim (cheaper, ranked first) until an answer says none is left, cloud-sim-b after; the gateway's own
    # health probe may take one of the two (every latency_probe_s), so how many reach cloud-sim first may be 1
    spent = targets.index("cloud:cloud-sim-b")
    assert spent >= 1 and set(targets[:spent]) == {"cloud:cloud-sim"} and set(targets[spent:]) == {targets[-1]}, sent
    reported = resilience(stack)["provider_reported"]
    assert reported["cloud-sim"]["requests"]["left"] == 0, reported
    assert 0 < reported["cloud-sim"]["requests"]["reset_in_s"] <= WINDOW_S
    seen = cloud_requests(stack)
    assert all(request_id not in seen for request_id, _ in sent[spent:])  # stopped before the limit, not at a 429
    assert all(row["status"] == 200 for row in seen.values() if row["headers"].get("x-request-id", "").startswith(
        "rate-headers"))  # fmt: skip
    time.sleep(max(0.0, started + WINDOW_S + 0.5 - time.monotonic()))  # the window the provider named is over
    assert ask(stack, "rate-headers-after")[1] == "cloud:cloud-sim"
    # that answer's headers hold in turn until their reset: leave the gateway with no reading of cloud-sim's
    deadline = time.monotonic() + WINDOW_S + 5
    while "cloud-sim" in resilience(stack)["provider_reported"]:
        assert time.monotonic() < deadline, resilience(stack)["provider_reported"]
        time.sleep(0.5)
