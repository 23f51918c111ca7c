"""Structured JSON log lines with the request id and the route reason, never the prompt."""

from __future__ import annotations

import io
import json
import logging

import httpx

from serve_apps.dispatch.interfaces import LocalDispatch
from serve_apps.http.surface import GatewayHTTP
from serve_apps.telemetry.logs import configure_json_logs
from tests.fakes import FakeEngine
from tests.unit.test_gateway_http import CHAT, MODELS


async def test_gateway_logs_json_lines_with_route_and_no_prompt() -> None:
    stream = io.StringIO()
    logger = logging.getLogger("spillover")
    saved = (logger.handlers[:], logger.propagate, logger.level)
    logger.handlers = []
    try:
        configure_json_logs(stream=stream)
        configure_json_logs(stream=stream)  # idempotent: one handler
        engine = FakeEngine()
        gateway = GatewayHTTP(engine, MODELS, LocalDispatch(engine), created=1)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=gateway.app), base_url="http://gw") as c:
            await c.post("/v1/chat/completions", json=CHAT, headers={"x-request-id": "req-1"})
            await c.post("/v1/chat/completions", json={"model": "nope", "messages": [{"role": "user"}]})
    finally:
        logger.handlers, logger.propagate, _ = saved
        logger.setLevel(saved[2])
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    routed = next(r for r in lines if r["message"] == "routed")
    assert routed["request_id"] == "req-1" and routed["route"] == "local" and routed["target"] == "local:small"
    assert routed["reason"] and routed["level"] == "INFO"
    rejected = next(r for r in lines if r["message"].startswith("rejected"))
    assert rejected["status"] == 404 and rejected["code"] == "model_not_found"
    assert "capital of France" not in stream.getvalue()  # the prompt is never logged
