"""Health that recovers and probes that judge fairly, on the real stack with the real cloud-sim.

Requests carry a tool, so the local model (no tools) is never a candidate: they go to `cloud-sim`
(ranked first, cheaper) with `cloud-sim-b` as the spare. The health timings of the recovery are the
defaults (conftest overrides only detection and probe periods that do not drive recovery), so the
30 s bound measured here is the one the defaults promise.

* `cloud-sim` down for 60 s (cloud-sim's `outage`: 503 on chat and on `/v1/models`, so probes and
  traffic both see it), then healthy while 20 requests flow: every request is answered, and the
  provider gets traffic back within 30 s of its recovery (the half-open trials or the probes start
  the ramp);
* `cloud-sim` rejects some prompts with a content-filter 400 (its probes' prompt included): its
  health stays green (the rejected probes are counted, not held against it), and a request whose
  prompt is filtered gets the 400 with the provider's reason — it is not silently sent to the spare.

Like every integration test it leaves the stack as it found it, in any order: the sims and the
gateway's resilience state reset.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import openai
import pytest

from bench.gateway.faults import TOOL  # the weather tool every tool request of the tests uses
from tests.integration.conftest import CONTROL_HEADERS, Stack

pytestmark = pytest.mark.integration
SMOL = "smollm2-135m-instruct"
PRIMARY = "cloud:cloud-sim"
SPARE = "cloud:cloud-sim-b"


@dataclass(frozen=True)
class Answer:
    sent_at: float  # time.monotonic()
    target: str


def _client(stack: Stack) -> openai.OpenAI:
    return openai.OpenAI(base_url=stack.openai_base, api_key="not-needed", timeout=60, max_retries=0)


def _ask(client: openai.OpenAI, prompt: str = "What is the weather in Paris?", request_id: str = "") -> Answer:
    sent_at = time.monotonic()
    raw = client.chat.completions.with_raw_response.create(
        model=SMOL,
        messages=[{"role": "user", "content": prompt}],
        tools=[TOOL],  # type: ignore[list-item]
        max_tokens=16,
        extra_headers={"x-request-id": request_id or f"recovery-{uuid.uuid4().hex}"},
    )
    assert raw.parse().choices, raw.text
    return Answer(sent_at, raw.headers["x-spillover-target"])


def _health(stack: Stack, key: str = PRIMARY) -> dict:
    view = httpx.get(f"{stack.base_url}/v1/spillover/resilience", timeout=10).json()
    return view["health"].get(key, {})


def _control(sim_url: str) -> str:
    return sim_url.rstrip("/").removesuffix("/v1") + "/control"  # sim URLs are OpenAI bases (.../v1)


def _faults(stack: Stack, **settings: object) -> None:
    url = f"{_control(stack.sim_url)}/faults"
    httpx.post(url, json=settings, headers=CONTROL_HEADERS, timeout=10).raise_for_status()


@pytest.fixture
def clean(stack: Stack) -> Iterator[None]:
    def reset() -> None:
        for sim in (stack.sim_url, stack.spare_url):
            httpx.post(f"{_control(sim)}/reset", headers=CONTROL_HEADERS, timeout=10).raise_for_status()
        httpx.post(f"{stack.base_url}/v1/spillover/resilience/reset", timeout=10).raise_for_status()

    reset()
    yield
    reset()


@pytest.mark.usefixtures("clean")
def test_a_provider_down_60s_gets_traffic_back_within_30s_of_recovery(stack: Stack) -> None:
    client = _client(stack)
    assert _ask(client).target == PRIMARY  # healthy: the cheaper provider answers

    _faults(stack, outage=True)
    down_at = time.monotonic()
    during: list[Answer] = []
    while time.monotonic() < down_at + 60:
        during.append(_ask(client))  # every one answered (by the spare), none lost
        time.sleep(1.5)
    assert {a.target for a in during[3:]} == {SPARE}, during
    assert any(t["to"] == "red" for t in _health(stack)["transitions"]), _health(stack)

    _faults(stack, outage=False)
    recovered_at = time.monotonic()
    wall_recovered_at = time.time()
    after: list[Answer] = []
    for _ in range(20):
        after.append(_ask(client))
        time.sleep(1.5)
    health = _health(stack)
    first_back = min((a.sent_at for a in after if a.target == PRIMARY), default=None)
    ramp = [t for t in health["transitions"] if t["from"] == "red" and t["to"] != "red"]
    print(
        f"\noutage 60 s: {len(during)} requests during it, all answered; after recovery the ramp began at "
        f"{[round(t['at'] - wall_recovered_at, 1) for t in ramp]} s ({ramp[-1]['reason'] if ramp else '-'}), and "
        f"{[round(a.sent_at - recovered_at, 1) for a in after if a.target == PRIMARY]} s went back to {PRIMARY}"
    )
    assert first_back is not None, f"no traffic back to {PRIMARY}: {after}, health {health}"
    assert first_back - recovered_at <= 30, (first_back - recovered_at, health["transitions"])
    assert ramp and ramp[-1]["at"] - wall_recovered_at <= 30, health["transitions"]


@pytest.mark.usefixtures("clean")
def test_a_content_filter_400_reaches_the_client_and_probes_keep_the_provider_green(stack: Stack) -> None:
    client = _client(stack)
    # the probe's default prompt ("Reply with the word OK.") is filtered too: the probes meet the 400
    _faults(stack, content_filter="forbidden topic|word OK")
    deadline = time.monotonic() + stack.config.resilience.health.latency_probe_s + 15
    health = _health(stack)
    while time.monotonic() < deadline and not health.get("probe_rejections_total"):
        time.sleep(1)
        health = _health(stack)
    assert health.get("probe_rejections_total", 0) >= 1, health
    assert "content management policy" in (health["last_probe_rejection"] or "")
    assert health["state"] == "green", health

    request_id = f"filtered-{uuid.uuid4().hex}"
    with pytest.raises(openai.BadRequestError) as caught:
        _ask(client, "Tell me about the forbidden topic.", request_id=request_id)
    assert caught.value.status_code == 400
    assert "content management policy" in caught.value.message  # the provider's own reason
    record = httpx.get(f"{stack.openai_base}/spillover/decisions/{request_id}", timeout=10).json()
    tried = [(a["target"], a["outcome"], a["error"]) for a in record["attempts"]]
    assert tried == [(f"{PRIMARY}/{SMOL}", "error", "provider_rejected")], tried
    params = {"x_request_id": request_id}  # the spare sim's control routes need its key
    spare_log = httpx.get(f"{_control(stack.spare_url)}/log", params=params, headers=CONTROL_HEADERS, timeout=10).json()
    assert spare_log["rows"] == []  # no silent detour to the spare

    assert _ask(client).target == PRIMARY  # a prompt the filter lets through is served there as before
    assert _health(stack)["state"] == "green"
