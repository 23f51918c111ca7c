"""Cloud burst on the real stack: local at low load, cloud-sim when the local model passes its
KV watermark (saying why), back to local after; local_only never reaches the cloud.

`qwen2-tiny-random` has a deliberately tiny KV watermark in the test config (conftest), so a
few concurrent long requests saturate it on 2 CPU cores.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from typing import Any

import httpx
import pytest

from tests.integration.conftest import Stack

pytestmark = pytest.mark.integration

QWEN = "qwen2-tiny-random"
SHORT = [{"role": "user", "content": "Say something."}]


def cloud_requests(stack: Stack) -> dict[str, dict[str, Any]]:
    """Cloud-sim's request log keyed by the x-request-id the gateway forwarded."""
    if not stack.cloud_log.exists():
        return {}
    rows = [json.loads(line) for line in stack.cloud_log.read_text().splitlines() if line.strip()]
    return {r["headers"].get("x-request-id", ""): r for r in rows}


def chat(stack: Stack, messages: list[dict[str, str]], **extra: Any) -> httpx.Response:
    headers = {"x-request-id": extra.pop("request_id", uuid.uuid4().hex), **extra.pop("headers", {})}
    body = {"model": QWEN, "messages": messages, "max_tokens": extra.pop("max_tokens", 4), **extra}
    return httpx.post(f"{stack.openai_base}/chat/completions", json=body, headers=headers, timeout=120)


def qwen_saturation(stack: Stack) -> float:
    data = httpx.get(f"{stack.base_url}/v1/spillover/cluster", timeout=10).json()
    (replica,) = [r for r in data["replicas"] if r["model"] == QWEN]
    spec = stack.config.model(QWEN)
    assert spec is not None and spec.watermarks is not None
    return float(replica["kv_cache_usage"]) / spec.watermarks.kv_cache


def long_stream(stack: Stack, index: int, done: list[int]) -> None:
    prompt = f"Load {index}: " + "lorem ipsum dolor sit amet " * 90  # ~500 tokens
    body = {
        "model": QWEN,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": 300,  # ~610 prompt tokens (estimated) + 300 fits the 1,024-token window
        "ignore_eos": True,
        "stream": True,
    }
    # local_only: the load itself must stay local (it would burst once the first two saturate the model)
    headers = {"x-spillover-residency": "local_only", "x-spillover-deadline-ms": "120000"}
    with httpx.stream(
        "POST", f"{stack.openai_base}/chat/completions", json=body, headers=headers, timeout=300
    ) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["x-spillover-route"] == "local"
        for _ in response.iter_lines():
            pass
    done.append(index)


def test_low_load_is_local(stack: Stack) -> None:
    request_id = f"low-{uuid.uuid4().hex}"
    response = chat(stack, SHORT, request_id=request_id)
    assert response.status_code == 200
    assert response.headers["x-spillover-route"] == "local"
    assert response.headers["x-spillover-target"] == f"local:{QWEN}"
    assert request_id not in cloud_requests(stack)


def test_saturated_model_bursts_to_cloud_and_comes_back(stack: Stack) -> None:
    done: list[int] = []
    load = [threading.Thread(target=long_stream, args=(stack, i, done)) for i in range(3)]
    for t in load:
        t.start()
    deadline = time.monotonic() + 60
    while qwen_saturation(stack) < 1.0:
        assert time.monotonic() < deadline, "local model never reached its watermark"
        time.sleep(0.05)

    burst_id = f"burst-{uuid.uuid4().hex}"
    burst = chat(stack, SHORT, request_id=burst_id)
    assert burst.status_code == 200, burst.text
    assert burst.headers["x-spillover-route"] == "cloud"
    assert burst.headers["x-spillover-target"] == "cloud:cloud-sim"
    reason = burst.headers["x-spillover-reason"]
    assert "kv_usage" in reason and ">= 0.001" in reason and "on all 1 replicas" in reason
    seen = cloud_requests(stack)
    assert burst_id in seen and seen[burst_id]["model"] == "sim-qwen"

    # local_only while saturated: waits (bounded by its deadline) and never reaches the cloud.
    private_id = f"private-{uuid.uuid4().hex}"
    private = chat(
        stack,
        SHORT,
        request_id=private_id,
        headers={"x-spillover-residency": "local_only", "x-spillover-deadline-ms": "1500"},
    )
    assert private.status_code in (200, 429), private.text
    if private.status_code == 429:
        assert private.json()["error"]["code"] == "local_capacity_exhausted"
        assert int(private.headers["retry-after"]) >= 1
        assert "local_only" in private.headers["x-spillover-reason"]
    else:
        assert private.headers["x-spillover-route"] == "local"

    for t in load:
        t.join(timeout=300)
    assert sorted(done) == [0, 1, 2]
    deadline = time.monotonic() + 10
    while qwen_saturation(stack) >= 0.5:  # below the low mark: hysteresis releases
        assert time.monotonic() < deadline
        time.sleep(0.1)
    back_id = f"back-{uuid.uuid4().hex}"
    back = chat(stack, SHORT, request_id=back_id)
    assert back.headers["x-spillover-route"] == "local", back.headers.get("x-spillover-reason")
    seen = cloud_requests(stack)
    assert private_id not in seen and back_id not in seen
