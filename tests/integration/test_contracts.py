"""Contract routing on the real stack: capabilities decide where a request may run, and L1
structured answers are validated before they reach the client."""

from __future__ import annotations

import json
import uuid

import httpx
import pytest

from tests.integration.conftest import Stack
from tests.integration.test_burst import cloud_requests

pytestmark = pytest.mark.integration

SMOL = "smollm2-135m-instruct"
TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
SCHEMA = {"type": "object", "properties": {"capital": {"type": "string"}}, "required": ["capital"]}


def post(stack: Stack, body: dict, **headers: str) -> httpx.Response:
    request_id = headers.pop("request_id", uuid.uuid4().hex)
    headers = {"x-request-id": request_id, **{k.replace("_", "-"): v for k, v in headers.items()}}
    return httpx.post(f"{stack.openai_base}/chat/completions", json=body, headers=headers, timeout=120)


def test_tools_go_to_the_tool_capable_cloud_even_with_local_room(stack: Stack) -> None:
    request_id = f"tools-{uuid.uuid4().hex}"
    body = {
        "model": SMOL,
        "messages": [{"role": "user", "content": "Weather in Paris?"}],
        "tools": [TOOL],
        "tool_choice": "required",
        "max_tokens": 30,
    }
    response = post(stack, body, request_id=request_id)
    assert response.status_code == 200, response.text
    assert response.headers["x-spillover-route"] == "cloud"
    assert "tool" in response.headers["x-spillover-reason"]
    assert request_id in cloud_requests(stack)
    decision = httpx.get(f"{stack.openai_base}/spillover/decisions/{request_id}", timeout=10).json()
    removed = {c["target"]: c for c in decision["candidates"] if c["status"] == "removed"}
    assert f"local:{SMOL}" in removed and decision["chosen"] == "cloud:cloud-sim"


def test_tools_with_no_capable_target_is_422(stack: Stack) -> None:
    body = {"model": SMOL, "messages": [{"role": "user", "content": "Weather?"}], "tools": [TOOL]}
    response = post(stack, body, x_spillover_residency="local_only")
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["code"] == "no_capable_model"
    clouds = {f"cloud:{p}/{SMOL}" for p in ("cloud-sim", "cloud-sim-b", "cloud-sim-badkey", "cloud-anthropic")}
    assert {r["target"] for r in error["reasons"]} == {f"local:{SMOL}", *clouds}
    assert "127.0.0.1" not in response.text


def test_l1_json_schema_answer_validates_or_is_502(stack: Stack) -> None:
    """SmolLM2 (135M) rarely writes schema-valid JSON on its own: the answer either validates
    (repaired or from another target) or the request ends as 502 contract_violation."""
    fmt = {"type": "json_schema", "json_schema": {"name": "capital", "schema": SCHEMA}}
    body = {
        "model": SMOL,
        "messages": [{"role": "user", "content": "Capital of France as JSON."}],
        "response_format": fmt,
        "max_tokens": 40,
        "temperature": 0,
    }
    response = post(stack, body, x_spillover_level="L1")
    assert response.status_code in (200, 502), response.text
    if response.status_code == 200:
        content = response.json()["choices"][0]["message"]["content"]
        assert "capital" in json.loads(content)
    else:
        assert response.json()["error"]["code"] == "contract_violation"


def test_schema_invalid_cloud_answer_is_502_never_200(stack: Stack) -> None:
    """Only cloud-sim can take this request (beyond SmolLM2's context, and the providers header
    leaves out the spare sims); cloud-sim is told to answer with JSON that ignores the schema:
    the L1 request ends as 502 contract_violation."""
    control = str(stack.config.cloud.providers[0].base_url).removesuffix("/v1") + "/control"
    fmt = {"type": "json_schema", "json_schema": {"name": "capital", "schema": SCHEMA}}
    body = {
        "model": SMOL,
        "messages": [{"role": "user", "content": "hello " * 5000}],
        "response_format": fmt,
        "max_tokens": 20,
    }
    httpx.post(f"{control}/faults", json={"schema_invalid_rate": 1.0}, timeout=10).raise_for_status()
    try:
        bad = post(stack, body, x_spillover_level="L1", x_spillover_providers="cloud-sim")
        warned = post(stack, body, x_spillover_level="L2", x_spillover_providers="cloud-sim")
    finally:
        httpx.post(f"{control}/reset", timeout=10).raise_for_status()
    assert bad.status_code == 502, bad.text
    error = bad.json()["error"]
    assert error["code"] == "contract_violation" and error["errors"]
    assert warned.status_code == 200 and "x-spillover-contract" in warned.headers  # L2: passes, flagged
    good = post(stack, body, x_spillover_level="L1")
    assert good.status_code == 200
    assert "capital" in json.loads(good.json()["choices"][0]["message"]["content"])


def test_invalid_json_schema_is_400(stack: Stack) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objekt"}}}
    body = {"model": SMOL, "messages": [{"role": "user", "content": "x"}], "response_format": fmt}
    response = post(stack, body)
    assert response.status_code == 400 and response.json()["error"]["code"] == "invalid_json_schema"
    assert "objekt" in response.json()["error"]["message"]
