"""The gateway's one error renderer and operator guard (serve_apps/http/edge.py) on its real HTTP layer:
every authenticated route tells a rate-limited tenant when to come back, routes raise instead of building
error answers, and no module of the HTTP surface builds one by hand."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from router.errors import LocalCapacityExhausted, NotFound
from router.request.auth import Authenticator, TenantPolicy
from serve_apps.clocks import Clocks
from serve_apps.dispatch.dispatcher import Dispatcher
from serve_apps.dispatch.parts import DispatchParts
from serve_apps.gateway_parts import EdgeSettings, GatewayParts, OperatorParts
from serve_apps.http.edge import HttpEdge
from serve_apps.http.guards import ClientText
from serve_apps.http.model_card import ServedModel
from serve_apps.http.surface import GatewayHTTP
from serve_apps.learning.routes import LearningRoutes
from serve_apps.learning.state import Learning
from serve_apps.resilience.routes import OpsRoutes
from serve_apps.resilience.state import Resilience
from serve_apps.telemetry.metrics import GatewayMetrics
from serve_apps.traffic.board import LocalBoard
from serve_apps.traffic.wiring import traffic_parts
from tests.unit.traffic_fixture import TrafficWorld, traffic_config

REPO = Path(__file__).resolve().parents[2]
BUSY = {"authorization": "Bearer sk-busy"}
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}

# Every route that checks the caller's key: (method, path, body).
AUTHENTICATED = [
    ("POST", "/v1/chat/completions", CHAT),
    ("POST", "/v1/completions", {"model": "m", "prompt": "hi"}),
    ("GET", "/v1/models", None),
    ("GET", "/v1/spillover/cluster", None),
    ("GET", "/v1/spillover/decisions/some-id", None),
    ("GET", "/v1/spillover/resilience", None),
    ("POST", "/v1/spillover/resilience/reset", {}),
    ("GET", "/v1/spillover/traffic", None),
    ("POST", "/v1/spillover/traffic", {"action": "pin", "model": "m", "target": "local:m"}),
    ("GET", "/v1/spillover/tickets/some-ticket", None),
    ("POST", "/v1/spillover/feedback", {"request_id": "x", "outcome": "good"}),
    ("GET", "/v1/spillover/quality", None),
]


def rate_limited_gateway() -> Starlette:
    """TrafficWorld's gateway (the real dispatcher, tiered dispatch and traffic routes) with the operator and
    learning routes too, and an admin tenant `busy` allowed one request a minute (its window does not roll
    over within the test)."""
    world = TrafficWorld(traffic_config())
    policies = [TenantPolicy("busy", admin=True, requests_per_minute=1)]
    auth = Authenticator(policies, {"busy": "sk-busy"})
    metrics = GatewayMetrics()
    parts = traffic_parts(world.config, world.local, {"sim": world.sim}, metrics, "r-a", LocalBoard(world.board),
                          clock=world.clock, sleep=world.ticket_sleep)  # fmt: skip
    resilience = Resilience(world.config, clock=world.clock)
    dispatcher = Dispatcher(
        world.config,
        world.local,
        {"sim": world.sim},
        world.snapshot,
        clocks=Clocks.of(world.clock, sleep=world.sleep),
        parts=DispatchParts(resilience=resilience, traffic=parts.traffic),
    )
    http = GatewayHTTP(
        world.local,
        [ServedModel("m", "llama", "cpu", 4096)],
        parts.tiered(dispatcher, world.limits),
        created=1,
        edge=EdgeSettings(authenticator=auth),
        parts=GatewayParts(
            decisions=dispatcher.decisions,
            metrics=metrics,
            tenant_limits=world.limits,
            learning=LearningRoutes(Learning.from_config(world.config), dispatcher.decisions),
        ),
        operator=OperatorParts(snapshot=world.snapshot, ops=OpsRoutes(resilience), traffic=parts.routes),
    )
    return http.app


async def test_every_route_tells_a_rate_limited_tenant_when_to_retry() -> None:
    app = rate_limited_gateway()
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as client:
        first = await client.get("/v1/models", headers=BUSY)  # the minute's one request
        assert first.status_code == 200, first.text
        for method, path, body in AUTHENTICATED:
            answer = await client.request(method, path, json=body, headers=BUSY)
            assert answer.status_code == 429, (method, path, answer.status_code, answer.text)
            assert answer.json()["error"]["code"] == "tenant_rate_limited", (path, answer.text)
            assert int(answer.headers["retry-after"]) >= 1, (method, path, dict(answer.headers))
            reason = answer.headers["x-spillover-reason"]
            assert "over its 1 requests per minute" in reason, (path, dict(answer.headers))
            assert answer.headers["x-request-id"], path
        ready = await client.get("/readyz", headers=BUSY)  # public: the bare status, never a 429
    assert ready.status_code in (200, 503) and set(ready.json()) == {"status"}


async def test_a_route_raises_and_the_edge_renders_scrubbed_with_retry_after() -> None:
    edge = HttpEdge(client_text=ClientText(("SECRET_HOST",)))

    async def missing(request: Request) -> Response:
        raise NotFound("no record on SECRET_HOST", code="no_telemetry")

    async def full(request: Request) -> Response:
        raise LocalCapacityExhausted("no local room within 2.5 s", retry_after_s=2.2)

    app = Starlette(routes=[Route("/missing", edge.endpoint(missing)), Route("/full", edge.endpoint(full))])
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as client:
        gone = await client.get("/missing", headers={"x-request-id": "r-1"})
        busy = await client.get("/full")
    assert gone.status_code == 404 and gone.headers["x-request-id"] == "r-1"
    error = gone.json()["error"]
    assert error["code"] == "no_telemetry" and error["type"] == "invalid_request_error"
    assert "SECRET_HOST" not in gone.text and "retry-after" not in gone.headers
    assert busy.status_code == 429 and busy.headers["retry-after"] == "3"
    assert busy.headers["x-spillover-reason"] == "no local room within 2.5 s"


async def test_the_admin_guard_says_what_was_refused() -> None:
    auth = Authenticator([TenantPolicy("apps")], {"apps": "sk-apps"})
    edge = HttpEdge(auth)

    async def view(request: Request) -> Response:
        await edge.admin(request, "read the traffic controls")
        return Response("ok")

    app = Starlette(routes=[Route("/op", edge.endpoint(view))])
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as client:
        anonymous = await client.get("/op")
        tenant = await client.get("/op", headers={"authorization": "Bearer sk-apps"})
    assert anonymous.status_code == 401 and anonymous.json()["error"]["code"] == "invalid_api_key"
    assert tenant.status_code == 403
    assert tenant.json()["error"]["message"].endswith("is not an admin (tenants[].admin) and may not read the "
                                                      "traffic controls")  # fmt: skip


# Below the application, where no Starlette route runs, two answers are written by hand: the header limits
# at the ASGI entry (serve_apps/http/guards.py HeadLimit) and the slow-client cut on the socket
# (serve_apps/http/limits.py). An engine's error reply inside a local stream becomes an SSE error event
# (serve_apps/engine/replies.py), which the edge's stream guard passes through scrubbed. Every other error
# answer of the HTTP surface is the edge's.
NOT_AN_ANSWER = {"http/guards.py", "http/limits.py", "http/edge.py", "engine/replies.py"}
SERVE_APPS = REPO / "serve_apps"
HAND_BUILT = re.compile(r"error_body\(|\.to_openai\(\)|JSONResponse\(\{\"error\"")


def _in_package(path: Path) -> str:
    return path.relative_to(SERVE_APPS).as_posix()


@pytest.mark.parametrize("path", sorted(SERVE_APPS.rglob("*.py")), ids=_in_package)
def test_no_route_module_builds_an_error_answer_by_hand(path: Path) -> None:
    if _in_package(path) in NOT_AN_ANSWER:
        return
    found = [line.strip() for line in path.read_text().splitlines() if HAND_BUILT.search(line)]
    assert not found, (
        f"{_in_package(path)} builds an error answer itself (raise the error; serve_apps/http/edge.py renders)"
    )
