"""Last in the session (it kills a replica): when the local model's replica dies, requests
burst to the cloud as soon as its stats go stale; local_only requests still never do.

The health signal is the replica's telemetry going stale (`telemetry.max_age_s` after its last
push); the test measures from the kill to the first cloud answer and reports it.
"""

from __future__ import annotations

import time
import uuid

import httpx
import pytest
import ray

from tests.integration.conftest import Stack
from tests.integration.test_burst import QWEN, SHORT, chat, cloud_requests

pytestmark = pytest.mark.integration


def _replica_actor() -> tuple[str, str]:
    for actor in ray.util.list_named_actors(all_namespaces=True):
        if f"SpilloverLLMServer:{QWEN}" in actor["name"] or f"LLMServer:{QWEN}" in actor["name"]:
            return actor["name"], actor["namespace"]
    raise AssertionError("no replica actor found for the qwen deployment")


def test_dead_replica_bursts_within_a_second_of_going_stale(stack: Stack) -> None:
    assert chat(stack, SHORT).headers["x-spillover-route"] == "local"
    name, namespace = _replica_actor()
    ray.kill(ray.get_actor(name, namespace=namespace))
    killed_at = time.monotonic()

    first_cloud = None
    private_ids = []
    while time.monotonic() - killed_at < 20:
        response = chat(stack, SHORT)
        if response.status_code == 200 and response.headers["x-spillover-route"] == "cloud":
            first_cloud = time.monotonic() - killed_at
            reason = response.headers["x-spillover-reason"]
            break
        time.sleep(0.05)
    assert first_cloud is not None, "requests never burst after the replica died"
    max_age = stack.config.telemetry.max_age_s
    print(
        f"\nfailover: first cloud answer {first_cloud:.2f}s after the kill "
        f"({first_cloud - max_age:+.2f}s after the stats went stale at {max_age:g}s); reason: {reason}"
    )
    assert first_cloud <= max_age + 1.0
    assert "stale" in reason or "failed before the first byte" in reason or "no replica" in reason

    private_id = f"private-down-{uuid.uuid4().hex}"
    private_ids.append(private_id)
    private = chat(
        stack,
        SHORT,
        request_id=private_id,
        headers={"x-spillover-residency": "local_only", "x-spillover-deadline-ms": "1000"},
    )
    assert private.status_code in (200, 429, 502, 503), private.text
    assert all(pid not in cloud_requests(stack) for pid in private_ids)
    # Serve restarts the replica; wait (bounded) so the session ends with a healthy app.
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if httpx.get(f"{stack.base_url}/readyz", timeout=10).status_code == 200:
            break
        time.sleep(1)
