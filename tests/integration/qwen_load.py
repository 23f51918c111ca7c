"""Requests to `qwen2-tiny-random` and the load that saturates it, shared by the integration tests
that need local pressure (burst, the dashboard's metrics, fail-over).

`qwen2-tiny-random` has a deliberately tiny KV watermark in the test config (conftest), so a few
concurrent long requests saturate it on 2 CPU cores. `saturated_qwen` puts that load on and, when
it leaves, waits until it is gone, the hysteresis released and the models' health green again, so
the next test finds the models as they were.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import httpx

from tests.integration.conftest import Stack, wait_until_local_models_green

QWEN = "qwen2-tiny-random"
SHORT = [{"role": "user", "content": "Say something."}]


def cloud_requests(stack: Stack) -> dict[str, dict[str, Any]]:
    """Cloud-sim's request log keyed by the x-request-id the gateway forwarded."""
    if not stack.cloud_log.exists():
        return {}
    rows = [json.loads(line) for line in stack.cloud_log.read_text().splitlines() if line.strip()]
    return {r["headers"].get("x-request-id", ""): r for r in rows}


def cloud_messages(stack: Stack, request_id: str) -> list[dict[str, Any]]:
    """The messages cloud-sim received for the gateway's request `request_id` (its logged body)."""
    return list(json.loads(cloud_requests(stack)[request_id]["body"])["messages"])


def chat(stack: Stack, messages: list[dict[str, str]], **extra: Any) -> httpx.Response:
    headers = {"x-request-id": extra.pop("request_id", uuid.uuid4().hex), **extra.pop("headers", {})}
    body = {"model": QWEN, "messages": messages, "max_tokens": extra.pop("max_tokens", 4), **extra}
    return httpx.post(f"{stack.openai_base}/chat/completions", json=body, headers=headers, timeout=120)


def numerics_check_window_s(stack: Stack) -> float:
    """How long qwen2-tiny-random can read saturated from its own numerics check alone: one check interval
    and a few telemetry pushes (a wait for a reading with room is bounded by this)."""
    spec = stack.config.model(QWEN)
    assert spec is not None and spec.numerics is not None
    return spec.numerics.interval_s + 4 * stack.config.telemetry.max_age_s + 5


def burst_on_kv(headers: Mapping[str, str]) -> bool:
    """The answer came from the cloud because the local model's KV reading was saturated."""
    return headers.get("x-spillover-route") == "cloud" and "kv_usage" in headers.get("x-spillover-reason", "")


def chat_until_local(stack: Stack, messages: list[dict[str, str]], prefix: str) -> tuple[httpx.Response, str]:
    """A chat expected to stay local once the load is gone, and its request id. The replica's own numerics
    check (every `models[].numerics.interval_s`, off the request path) holds a few KV blocks while it runs, and
    on qwen2-tiny-random's 0.001 watermark that alone reads saturated: a request arriving then bursts, as it
    should. So a burst naming the KV reading is sent again, for at most one check interval and a few pushes."""
    deadline = time.monotonic() + numerics_check_window_s(stack)
    while True:
        request_id = f"{prefix}-{uuid.uuid4().hex}"
        response = chat(stack, messages, request_id=request_id)
        if not burst_on_kv(response.headers) or time.monotonic() > deadline:
            return response, request_id
        time.sleep(0.5)


def qwen_replicas(stack: Stack) -> list[dict[str, Any]]:
    data = httpx.get(f"{stack.base_url}/v1/spillover/cluster", timeout=10).json()
    return [r for r in data["replicas"] if r["model"] == QWEN]


def qwen_saturation(stack: Stack) -> float:
    (replica,) = qwen_replicas(stack)
    spec = stack.config.model(QWEN)
    assert spec is not None and spec.watermarks is not None
    return float(replica["kv_cache_usage"]) / spec.watermarks.kv_cache


def long_stream(stack: Stack, index: int, stop: threading.Event, done: list[int]) -> None:
    """Long local streams, one after the other, until `stop` is set (at least one): a single ~300-token
    stream of this tiny model can end within a second on a fast CPU, before the request that should find
    the model saturated is planned, so the load is held for as long as the caller needs it."""
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
    while True:
        with httpx.stream(
            "POST", f"{stack.openai_base}/chat/completions", json=body, headers=headers, timeout=300
        ) as response:
            assert response.status_code == 200, response.read()
            assert response.headers["x-spillover-route"] == "local"
            for _ in response.iter_lines():
                pass
        if stop.is_set():
            break
    done.append(index)


@contextmanager
def saturated_qwen(stack: Stack) -> Iterator[list[int]]:
    """Three long local streams, each started again as it ends, until the model passes its watermark and
    for as long as the block runs; on leaving, the streams end and the saturation falls below the low mark
    (hysteresis released). Yields the indexes of the loaders that completed (all three once the block is
    left)."""
    done: list[int] = []
    stop = threading.Event()
    load = [threading.Thread(target=long_stream, args=(stack, i, stop, done)) for i in range(3)]
    for t in load:
        t.start()
    try:
        deadline = time.monotonic() + 60
        while qwen_saturation(stack) < 1.0:
            assert time.monotonic() < deadline, "local model never reached its watermark"
            time.sleep(0.05)
        yield done
    finally:
        stop.set()
        for t in load:
            t.join(timeout=300)
        deadline = time.monotonic() + 10
        while qwen_saturation(stack) >= 0.5:  # below the low mark: hysteresis releases
            assert time.monotonic() < deadline
            time.sleep(0.1)
        wait_until_local_models_green(stack)  # the load may have slowed the probes of either model
