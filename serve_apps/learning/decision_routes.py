"""Decision records over HTTP, and whose they are.

    GET /v1/spillover/decisions/{request_id}   the caller's own decision record (404 otherwise)

A record belongs to the tenant whose request made it ("" without auth). Before a request is
dispatched its id is claimed for its tenant in the `DecisionStore` (router/learning/decision.py); a
client-chosen `x-request-id` that another tenant holds (a stored record, or a request in flight)
is replaced by a new id, so it can never overwrite that tenant's record, and a tenant asking for
another tenant's id gets the same 404 as for an unknown one. A record this replica does not hold is
looked up in the shared store, under the asking tenant's name (serve_apps/learning/shared_records.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from router.errors import NotFound
from router.learning.decision import DecisionStore
from router.request.auth import TenantPolicy
from serve_apps.http.edge import HttpEdge
from serve_apps.learning.shared_records import find_record

log = logging.getLogger("spillover.gateway")


def owner_of(tenant: TenantPolicy | None) -> str:
    return tenant.name if tenant is not None else ""


class OwnedDecisions:
    def __init__(self, store: DecisionStore | None, new_id: Callable[[], str]) -> None:
        self._store = store
        self._new_id = new_id

    def claim(self, request_id: str, owner: str) -> str:
        """The id the request's record is kept under: the client's, unless another tenant holds it."""
        if self._store is None or self._store.claim(request_id, owner):
            return request_id
        fresh = self._new_id()
        log.info("request id held by another tenant: using a new one", extra={"request_id": fresh})
        self._store.claim(fresh, owner)
        return fresh

    def release(self, request_id: str, owner: str) -> None:
        if self._store is not None:
            self._store.release(request_id, owner)

    def route(self, edge: HttpEdge, scrub: Callable[[Any], Any]) -> Route:
        """`scrub` cleans the record's texts (a failed attempt's reason may quote a provider) like errors."""

        async def decision(request: Request) -> Response:
            tenant = await edge.tenant(request)
            wanted = request.path_params["request_id"]
            record = await find_record(self._store, wanted, owner_of(tenant))
            if record is None:
                shown = wanted[:128].encode("ascii", "replace").decode()
                raise NotFound(f"no decision record for request {shown!r} (kept: your recent ones)")
            return JSONResponse(scrub(record.to_dict()), headers=edge.headers_for(request))

        return Route("/v1/spillover/decisions/{request_id}", edge.endpoint(decision), methods=["GET"])
