"""`/metrics` has data for every metric the Grafana dashboard queries, after the traffic the
dashboard charts (made here: a local answer, a burst to the cloud, a wait for local room); the
gateway's JSON log lines carry the route and reason and never the prompt."""

from __future__ import annotations

import json
import re

import httpx
import pytest

from tests.integration.conftest import REPO, Stack, ray_logs
from tests.integration.qwen_load import SHORT, chat, chat_until_local, saturated_qwen

pytestmark = pytest.mark.integration
METRIC = re.compile(r"\b(spillover_[a-z_]+)\b")


def test_every_dashboard_metric_has_data(stack: Stack) -> None:
    assert chat_until_local(stack, SHORT, "metrics")[0].headers["x-spillover-route"] == "local"
    with saturated_qwen(stack):
        assert chat(stack, SHORT).headers["x-spillover-route"] == "cloud"  # tokens and cost by a cloud target
        local_only = {"x-spillover-residency": "local_only", "x-spillover-deadline-ms": "1500"}
        assert chat(stack, SHORT, headers=local_only).status_code in (200, 429)  # waited for local room
    scrape = httpx.get(f"{stack.base_url}/metrics", timeout=10)
    assert scrape.status_code == 200 and scrape.headers["content-type"].startswith("text/plain")
    with_data = {line.split("{")[0].split(" ")[0] for line in scrape.text.splitlines() if not line.startswith("#")}
    dashboard = json.loads((REPO / "cluster/grafana-dashboard.json").read_text())
    queried = {m for panel in dashboard["panels"] for t in panel["targets"] for m in METRIC.findall(t["expr"])}
    gpu_only = {m for m in queried if m.startswith("spillover_replica_gpu_")}  # CPU replicas have no GPU series:
    # tests/gpu_sim checks those on simulated GPUs. A labelled counter has no series before its first event:
    # a session moved (tests/integration/test_sessions.py), a history compressed
    # (tests/unit/test_session_dispatch.py), a stream continued (tests/integration/test_stream_continuation.py)
    events = {
        "spillover_session_switches_total",
        "spillover_session_tokens_saved_total",
        "spillover_stream_repairs_total",
    }
    assert queried - gpu_only - events - with_data == set()
    assert 'route="cloud"' in scrape.text and 'route="local"' in scrape.text


def test_gateway_writes_json_log_lines_with_route_reason(stack: Stack) -> None:
    import glob
    import uuid

    request_id = f"log-{uuid.uuid4().hex}"
    body = {
        "model": "smollm2-135m-instruct",
        "messages": [{"role": "user", "content": "secret prompt"}],
        "max_tokens": 2,
    }
    response = httpx.post(
        f"{stack.openai_base}/chat/completions", json=body, headers={"x-request-id": request_id}, timeout=60
    )
    assert response.status_code == 200
    found, gateway_log = None, ""
    for path in glob.glob(str(ray_logs() / "worker-*.err")):
        for line in open(path, encoding="utf-8", errors="replace"):
            if request_id in line and line.startswith("{"):
                found, gateway_log = json.loads(line), path
                break
    assert found is not None, "no JSON log line with the request id in the gateway's worker log"
    assert found["message"] == "routed" and found["route"] == "local" and found["reason"]
    with open(gateway_log, errors="replace") as log:
        assert "secret prompt" not in log.read()  # the gateway never logs prompts
