"""Cloud burst on the real stack: local at low load, cloud-sim when the local model passes its
KV watermark (saying why), back to local after; local_only never reaches the cloud. The load that
saturates the model is tests/integration/qwen_load.py's.
"""

from __future__ import annotations

import uuid

import pytest

from tests.integration.conftest import Stack
from tests.integration.qwen_load import QWEN, SHORT, chat, chat_until_local, cloud_requests, saturated_qwen

pytestmark = pytest.mark.integration


def test_low_load_is_local(stack: Stack) -> None:
    response, request_id = chat_until_local(stack, SHORT, "low")
    assert response.status_code == 200
    assert response.headers["x-spillover-route"] == "local"
    assert response.headers["x-spillover-target"] == f"local:{QWEN}"
    assert request_id not in cloud_requests(stack)


def test_saturated_model_bursts_to_cloud_and_comes_back(stack: Stack) -> None:
    with saturated_qwen(stack) as done:
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

    assert sorted(done) == [0, 1, 2]  # the load ended and the hysteresis released
    back, back_id = chat_until_local(stack, SHORT, "back")
    assert back.headers["x-spillover-route"] == "local", back.headers.get("x-spillover-reason")
    seen = cloud_requests(stack)
    assert private_id not in seen and back_id not in seen
