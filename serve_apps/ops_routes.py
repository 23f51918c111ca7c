"""Operator routes for the resilience state of one gateway replica.

    GET  /v1/spillover/resilience        health per local model / cloud provider (state, share,
                                         ramp, recent transitions), breakers, retry budget, quotas
    POST /v1/spillover/resilience/reset  body `{"target": "cloud:<provider>" | "local:<alias>"}` or
                                         empty (everything): health back to green, breakers closed.
                                         Black (a refused key) stays black until this or
                                         `black_retry_s`; with gateway auth only an `admin` tenant
                                         may call it (403 otherwise)

Both are per gateway replica: with several replicas, call each (README, "Several gateway replicas").
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from router.auth import TenantPolicy
from router.errors import Forbidden, InvalidRequest, RequestError
from serve_apps.resilience import Resilience

Authorize = Callable[[Request], TenantPolicy | None]
HeadersFor = Callable[[Request], dict[str, str]]


class OpsRoutes:
    def __init__(self, resilience: Resilience) -> None:
        self._resilience = resilience

    def routes(self, authorize: Authorize, headers_for: HeadersFor) -> list[Route]:
        async def view(request: Request) -> Response:
            try:
                authorize(request)
            except RequestError as exc:
                return JSONResponse(exc.to_openai(), exc.status_code, headers=headers_for(request))
            return JSONResponse(self._resilience.view(), headers=headers_for(request))

        async def reset(request: Request) -> Response:
            try:
                tenant = authorize(request)
                if tenant is not None and not tenant.admin:
                    raise Forbidden(f"tenant {tenant.name!r} is not an admin (tenants[].admin) and may not reset")
                target = _target(await request.body())
            except RequestError as exc:
                return JSONResponse(exc.to_openai(), exc.status_code, headers=headers_for(request))
            return JSONResponse({"reset": self._resilience.reset(target)}, headers=headers_for(request))

        return [
            Route("/v1/spillover/resilience", view, methods=["GET"]),
            Route("/v1/spillover/resilience/reset", reset, methods=["POST"]),
        ]


def _target(raw: bytes) -> str | None:
    if not raw.strip():
        return None
    try:
        body: Any = json.loads(raw)
    except ValueError:
        raise InvalidRequest('the body must be JSON: {} or {"target": "cloud:<provider>"}') from None
    if not isinstance(body, dict) or set(body) - {"target"}:
        raise InvalidRequest('the body may only hold "target"', param="target")
    target = body.get("target")
    if target is not None and (not isinstance(target, str) or not target.startswith(("local:", "cloud:"))):
        raise InvalidRequest('"target" must be "local:<alias>" or "cloud:<provider>"', param="target")
    return target
