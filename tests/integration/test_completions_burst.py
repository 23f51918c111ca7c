"""`POST /v1/completions` bursts like chat, on the real stack with the official `openai` client: saturated, a
completion goes to cloud-sim, which serves the legacy completions API (configs/local.yaml: `completions: true`),
streamed and not, booked with its tokens; one asking for `echo` — which cloud-sim does not serve (`echo:
false`) — never goes there: it waits for local room (local vLLM serves echo) or gets the 429 of a request that
could only wait."""

from __future__ import annotations

import uuid

import httpx
import openai
import pytest

from tests.integration.conftest import Stack
from tests.integration.qwen_load import QWEN, cloud_requests, saturated_qwen

pytestmark = pytest.mark.integration

PROMPT = "The capital of France is"


@pytest.fixture
def client(stack: Stack) -> openai.OpenAI:
    return openai.OpenAI(base_url=stack.openai_base, api_key="unused", max_retries=0, timeout=120)


def test_a_saturated_model_bursts_completions_and_keeps_echo_local(stack: Stack, client: openai.OpenAI) -> None:
    plain_id, stream_id, echo_id = (f"completion-{k}-{uuid.uuid4().hex}" for k in ("plain", "stream", "echo"))
    with saturated_qwen(stack):
        raw = client.completions.with_raw_response.create(
            model=QWEN, prompt=PROMPT, max_tokens=4, extra_headers={"x-request-id": plain_id}
        )
        assert (raw.headers["x-spillover-route"], raw.headers["x-spillover-target"]) == ("cloud", "cloud:cloud-sim")
        assert "kv_usage" in raw.headers["x-spillover-reason"]
        answer = raw.parse()
        assert answer.choices[0].text == "[cloud-sim:sim-qwen] The capital of"
        assert answer.usage is not None and answer.usage.completion_tokens == 4

        streamed = client.completions.with_raw_response.create(
            model=QWEN, prompt=PROMPT, max_tokens=4, stream=True, extra_headers={"x-request-id": stream_id}
        )
        assert streamed.headers["x-spillover-route"] == "cloud"
        text = "".join(c.choices[0].text for c in streamed.parse() if c.choices)
        assert text == answer.choices[0].text

        echo = httpx.post(
            f"{stack.openai_base}/completions",
            json={"model": QWEN, "prompt": PROMPT, "max_tokens": 2, "echo": True},
            headers={"x-request-id": echo_id, "x-spillover-deadline-ms": "1500"},
            timeout=60,
        )
    assert echo.status_code in (200, 429), echo.text
    if echo.status_code == 200:
        assert echo.headers["x-spillover-route"] == "local" and echo.json()["choices"][0]["text"].startswith(PROMPT)
    else:
        assert echo.json()["error"]["code"] == "local_capacity_exhausted"
    sent = cloud_requests(stack)
    assert sent[plain_id]["path"] == sent[stream_id]["path"] == "/v1/completions"
    assert echo_id not in sent
    record = httpx.get(f"{stack.openai_base}/spillover/decisions/{echo_id}", timeout=10).json()
    removed = {c["target"]: c["reason"] for c in record["candidates"] if c["status"] == "removed"}
    assert removed[f"cloud:cloud-sim/{QWEN}"] == "completions echo not supported"
