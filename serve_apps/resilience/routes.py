"""Operator routes for the resilience state of one gateway replica.

    GET  /v1/spillover/resilience        health per local model / cloud provider (state, share,
                                         ramp, recent transitions), breakers, retry budget, quotas;
                                         with gateway auth only an `admin` tenant (403 otherwise)
    POST /v1/spillover/resilience/reset  body `{"target": "cloud:<provider>" | "local:<alias>"}` or
                                         empty (everything): health back to green, breakers closed,
                                         live health scores and routing weights forgotten.
                                         Black (a refused key) stays black until this or
                                         `black_retry_s`; with gateway auth only an `admin` tenant
                                         may call it (403 otherwise)

The view is this replica's. A reset clears this replica and tells the breaker exchange what it reset, so
the other replicas drop the same breakers (that target's, or all) at their next exchange (their health
machines they keep: call each replica, or wait for their probes).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from router.errors import InvalidRequest
from router.request.openai_request import decode_json
from router.resilience.health import Health
from router.routing.capabilities import local_id
from serve_apps.http.edge import HttpEdge
from serve_apps.resilience.state import Resilience


class OpsRoutes:
    def __init__(
        self,
        resilience: Resilience,
        on_reset: Callable[[str | None], Awaitable[Any]] | None = None,
        forget: Callable[[str | None], list[str]] | None = None,
    ) -> None:
        """`on_reset(target)` tells the other gateway replicas what was reset (serve_apps.resilience.breaker_exchange);
        `forget` drops the live health scores and their routing weights (serve_apps/traffic/live_scores.py)."""
        self._resilience = resilience
        self._on_reset = on_reset
        self._forget = forget

    def local_down(self, alias: str) -> str | None:
        """Why the local model is out of routing by its health (red or black), for readiness."""
        machine = self._resilience.health.get(local_id(alias))
        if machine.state in (Health.RED, Health.BLACK):
            return f"health {machine.state.value}: {machine.reason}"
        return None

    def routes(self, edge: HttpEdge) -> list[Route]:
        async def view(request: Request) -> Response:
            await edge.admin(request, "read the resilience state")
            return JSONResponse(self._resilience.view(), headers=edge.headers_for(request))

        async def reset(request: Request) -> Response:
            await edge.admin(request, "reset")
            target = _target(await request.body())  # after the key check; bounded by BodyLimit
            reset = self._resilience.reset(target) + (self._forget(target) if self._forget is not None else [])
            if self._on_reset is not None:
                await self._on_reset(target)
            return JSONResponse({"reset": reset}, headers=edge.headers_for(request))

        return [
            Route("/v1/spillover/resilience", edge.endpoint(view), methods=["GET"]),
            Route("/v1/spillover/resilience/reset", edge.endpoint(reset), methods=["POST"]),
        ]


def _target(raw: bytes) -> str | None:
    if not raw.strip():
        return None
    try:
        body: Any = decode_json(raw)  # too deep, NaN or a lone surrogate: a 400, never a RecursionError's 500
    except InvalidRequest:
        raise InvalidRequest('the body must be JSON: {} or {"target": "cloud:<provider>"}') from None
    if not isinstance(body, dict) or set(body) - {"target"}:
        raise InvalidRequest('the body may only hold "target"', param="target")
    target = body.get("target")
    if target is not None and (not isinstance(target, str) or not target.startswith(("local:", "cloud:"))):
        raise InvalidRequest('"target" must be "local:<alias>" or "cloud:<provider>"', param="target")
    return target
