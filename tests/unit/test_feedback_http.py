"""`POST /v1/spillover/feedback` and `GET /v1/spillover/quality` over the gateway's real HTTP layer
(real dispatcher, decision store, authenticator, learning state; FakeEngine as the local model):
tenant-scoped feedback, its hostile inputs, and the quality view and metrics it feeds."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import httpx
import pytest

from cluster.config.deployment import parse_config
from cluster.config.tenants import authenticator_for
from router.routing.snapshot import ClusterSnapshot, ReplicaStats
from serve_apps.clocks import Clocks
from serve_apps.dispatch.dispatcher import Dispatcher
from serve_apps.dispatch.parts import DispatchParts
from serve_apps.gateway_parts import EdgeSettings, GatewayParts
from serve_apps.http.surface import GatewayHTTP, ServedModel
from serve_apps.learning.routes import LearningRoutes
from serve_apps.learning.state import Learning, QualityCollector
from serve_apps.telemetry.metrics import GatewayMetrics
from tests.fakes import FakeEngine
from tests.unit.security_gateway import APPS, CHAT, KEYS, MODEL, OPS, OTHER, config

FEEDBACK = "/v1/spillover/feedback"


def build(min_samples: int = 2) -> tuple[httpx.AsyncClient, Learning]:
    raw = config().model_dump(mode="json")
    raw["learning"] = {"quality": {"min_samples": min_samples}}
    cfg = parse_config(raw, "test")
    replica = ReplicaStats(MODEL, "r1", "n1", 0.0, 0.1, 0, 0, 0, 0, 364, 128)
    snapshot = ClusterSnapshot(taken_at=0.0, replicas=(replica,), max_age_s=1e12)
    learning = Learning.from_config(cfg, clock=lambda: 1234.5)
    metrics = GatewayMetrics()
    assert learning.quality is not None
    metrics.registry.register(QualityCollector(learning.quality))
    local = FakeEngine(answer="ok")
    dispatcher = Dispatcher(
        cfg,
        local,
        {},
        lambda: snapshot,
        clocks=Clocks.of(lambda: 0.0),
        parts=DispatchParts(observer=learning.observer(metrics), quality=learning.quality),
    )
    http = GatewayHTTP(
        local,
        [ServedModel(MODEL, "llama", "cpu", 4096)],
        dispatcher,
        created=1,
        edge=EdgeSettings(authenticator=authenticator_for(cfg, KEYS)),
        parts=GatewayParts(
            policy=cfg.policy,
            decisions=dispatcher.decisions,
            metrics=metrics,
            learning=LearningRoutes(learning, dispatcher.decisions),
        ),
    )
    transport = httpx.ASGITransport(app=http.app, raise_app_exceptions=False)
    return httpx.AsyncClient(transport=transport, base_url="http://gw", timeout=20), learning


async def chat(client: httpx.AsyncClient, request_id: str, headers: dict[str, str] = APPS) -> None:
    reply = await client.post("/v1/chat/completions", json=CHAT, headers={**headers, "x-request-id": request_id})
    assert reply.status_code == 200


def test_feedback_on_own_request_is_stored_with_source_and_time_and_feeds_quality() -> None:
    async def go() -> None:
        client, learning = build()
        await chat(client, "req-1")
        body = {"request_id": "req-1", "outcome": "failure", "source": "qa-batch", "label": "default"}
        reply = await client.post(FEEDBACK, json=body, headers=APPS)
        assert reply.status_code == 200, reply.text
        assert reply.json() == {**body, "applied": {"quality": True, "typing": False}, "scope": "own"}
        (stored,) = learning.feedback.for_request("req-1", "apps")
        assert (stored.source, stored.outcome, stored.received_at) == ("qa-batch", "failure", 1234.5)
        view = (await client.get("/v1/spillover/quality", headers=OPS)).json()
        (stats,) = view["targets"][f"local:{MODEL}"].values()
        # what every tenant is routed by: the observed answer; the failure moves only apps' requests
        assert (stats["successes"], stats["failures"], stats["feedback"], stats["used"]) == (1, 0, 1, False)
        assert stats["feedback_by_tenant"] == {"apps": {"successes": 0, "failures": 1, "moves": "own"}}
        bucket = "task=default|lang=latin|len=short|tools=0|risk=L2"
        assert learning.quality is not None and learning.quality.estimate(f"local:{MODEL}", bucket, "apps") is not None
        metrics = (await client.get("/metrics")).text
        assert f'spillover_quality_samples{{bucket="{bucket}",target="local:{MODEL}"}} 1.0' in metrics

    asyncio.run(go())


def test_another_tenants_request_is_a_404_like_an_unknown_one() -> None:
    async def go() -> None:
        client, learning = build()
        await chat(client, "req-a")
        body = {"request_id": "req-a", "outcome": "success", "source": "thumbs"}
        theirs = await client.post(FEEDBACK, json=body, headers=OTHER)
        unknown = await client.post(FEEDBACK, json={**body, "request_id": "nope"}, headers=OTHER)
        assert theirs.status_code == unknown.status_code == 404
        assert theirs.json()["error"]["code"] == "not_found" and "req-a" in theirs.json()["error"]["message"]
        assert len(learning.feedback) == 0
        assert (await client.post(FEEDBACK, json=body)).status_code == 401  # no key

    asyncio.run(go())


def test_a_second_report_from_the_same_source_is_a_409() -> None:
    async def go() -> None:
        client, _ = build()
        await chat(client, "req-d")
        body = {"request_id": "req-d", "outcome": "success", "source": "thumbs"}
        assert (await client.post(FEEDBACK, json=body, headers=APPS)).status_code == 200
        again = await client.post(FEEDBACK, json={**body, "outcome": "failure"}, headers=APPS)
        assert again.status_code == 409 and again.json()["error"]["code"] == "feedback_exists"
        other_source = await client.post(FEEDBACK, json={**body, "source": "qa"}, headers=APPS)
        assert other_source.status_code == 200

    asyncio.run(go())


BAD_BODIES: list[tuple[Any, str | None]] = [
    (b"not json", None),
    (b"[1]", None),
    (b"\xff\xfe", None),
    ({"request_id": "req-h", "outcome": "success"}, "source"),
    ({"request_id": "req-h", "outcome": "maybe", "source": "s"}, "outcome"),
    ({"request_id": "", "outcome": "success", "source": "s"}, "request_id"),
    ({"request_id": "x" * 129, "outcome": "success", "source": "s"}, "request_id"),
    ({"request_id": "a\nb", "outcome": "success", "source": "s"}, "request_id"),
    ({"request_id": 7, "outcome": "success", "source": "s"}, "request_id"),
    ({"request_id": "req-h", "outcome": "success", "source": "<script>"}, "source"),
    ({"request_id": "req-h", "outcome": "success", "source": "s", "label": "x" * 65}, "label"),
    ({"request_id": "req-h", "outcome": "success", "source": "s", "label": 3}, "label"),
    ({"request_id": "req-h", "outcome": "success", "source": "s", "extra": 1}, "extra"),
    ({"request_id": "req-h", "outcome": "success", "source": "s", "label": "l", "pad": "x" * 5000}, None),
]


@pytest.mark.parametrize(("body", "param"), BAD_BODIES)
def test_hostile_bodies_get_a_clear_400_fast(body: Any, param: str | None) -> None:
    async def go() -> None:
        client, learning = build()
        await chat(client, "req-h")
        content = body if isinstance(body, bytes) else json.dumps(body).encode()
        started = time.monotonic()
        reply = await client.post(FEEDBACK, content=content, headers={**APPS, "content-type": "application/json"})
        assert time.monotonic() - started < 5
        assert reply.status_code == 400, reply.text
        error = reply.json()["error"]
        assert error["code"] == "invalid_feedback" and error["param"] == param
        assert "Traceback" not in reply.text and len(learning.feedback) == 0

    asyncio.run(go())


def test_quality_view_is_for_admins_only() -> None:
    async def go() -> None:
        client, _ = build()
        assert (await client.get("/v1/spillover/quality", headers=APPS)).status_code == 403
        assert (await client.get("/v1/spillover/quality")).status_code == 401
        assert (await client.get("/v1/spillover/quality", headers=OPS)).status_code == 200

    asyncio.run(go())
