"""The one place the gateway's HTTP surface turns errors into answers and checks who may call.

Routes raise the project's errors (router/errors.py) and never build an error response themselves:

`HttpEdge.error`     renders a `RequestError`: its status, the OpenAI shape with the text scrubbed for
                     clients (serve_apps/http/guards.py `ClientText`), `x-request-id`, `x-spillover-degraded`
                     when the error comes from a degraded mode, and, when the error says when to come back
                     (`retry_after_s`: a tenant's rate or concurrency limit, no local room, a provider's
                     429), `Retry-After` in whole seconds (at least 1) with the reason in
                     `x-spillover-reason`. A generation request's error is counted in the metrics.
`HttpEdge.endpoint`  wraps a route's handler: a `RequestError` it raises is rendered by `error`.
`HttpEdge.tenant`    the caller's tenant with auth on (Unauthorized, TenantRateLimited), else None;
`HttpEdge.admin`     the same, and Forbidden unless that tenant is an admin: the one operator guard.
The Starlette app's exception handlers (`on_request_error`, `on_http_exception`, `on_unexpected`) render
what escapes a route the same way: 404/405 of unknown paths, and 500 with no traceback.
"""

from __future__ import annotations

import logging
import math
import uuid
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from router import headers as hdr
from router.error_codes import ErrorCode
from router.errors import Forbidden, InternalError, RequestError, RouteNotFound
from router.request.auth import Authenticator, TenantPolicy
from serve_apps.http.guards import ClientText, request_id_of
from serve_apps.limits.tenants import TenantRates

log = logging.getLogger("spillover.gateway")

Handler = Callable[[Request], Awaitable[Response]]
Counted = Callable[[RequestError, bytes], None]  # the metrics of a failed generation request


def header_text(text: str) -> str:
    """A reason as an HTTP header value: printable ASCII, one line, bounded."""
    if text.isascii() and text.isprintable():  # most reasons: no character to replace
        return text[:300]
    return "".join(c if 32 <= ord(c) < 127 else "?" for c in text)[:300]


class HttpEdge:
    def __init__(
        self,
        authenticator: Authenticator | None = None,
        client_text: ClientText | None = None,
        *,
        new_id: Callable[[], str] = lambda: uuid.uuid4().hex,
        set_request_id: bool = True,
        counted: Counted | None = None,
        rates: TenantRates | None = None,
    ) -> None:
        """`set_request_id`: False behind Serve's proxy, which sets `x-request-id` itself; `rates` counts
        `tenants[].requests_per_minute` (None: in a store of this edge's own)."""
        self._auth = authenticator
        self._rates = rates if rates is not None else TenantRates()
        self.client_text = client_text or ClientText(())
        self._new_id = new_id
        self._set_request_id = set_request_id
        self._counted = counted

    @property
    def auth_on(self) -> bool:
        return self._auth is not None

    def request_id(self, request: Request) -> str:
        return request_id_of(request.headers.get(hdr.REQUEST_ID)) or self._new_id()

    def headers(self, request_id: str, **extra: str) -> dict[str, str]:
        base = {hdr.REQUEST_ID: request_id} if self._set_request_id else {}
        return {**base, **extra}

    def headers_for(self, request: Request) -> dict[str, str]:
        return self.headers(self.request_id(request))

    def public(self, exc: RequestError) -> dict[str, Any]:
        """The error body a client may see (scrubbed of hosts, URLs, account ids, configured names)."""
        body: dict[str, Any] = self.client_text.body(exc.to_openai())
        return body

    async def tenant(self, request: Request) -> TenantPolicy | None:
        """The caller's tenant when auth is on (raises Unauthorized / TenantRateLimited), else None."""
        if self._auth is None:
            return None
        tenant = self._auth.authenticate(request.headers.get("authorization"))
        await self._rates.check(tenant)  # one store operation (serve_apps/limits/tenants.py)
        return tenant

    async def admin(self, request: Request, what: str | None = None) -> TenantPolicy | None:
        """`tenant`, and Forbidden unless it is an admin (`what` the caller wanted to do, for the message)."""
        tenant = await self.tenant(request)
        if tenant is not None and not tenant.admin:
            wanted = f" and may not {what}" if what else ": operator route"
            raise Forbidden(f"tenant {tenant.name!r} is not an admin (tenants[].admin){wanted}")
        return tenant

    def error(
        self,
        exc: RequestError,
        request_id: str,
        *,
        raw: bytes | None = None,
        status: int | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> JSONResponse:
        """The answer for `exc`; `raw`: the body of a generation request (counted in the metrics);
        `status` / `headers`: a stored answer's (a deferred request's ticket)."""
        log.info("rejected: %s", exc.message[:200], extra={"request_id": request_id, "status": exc.status_code,
                                                           "code": exc.code})  # fmt: skip
        if raw is not None and self._counted is not None:
            self._counted(exc, raw)
        out = self.headers(request_id, **({hdr.DEGRADED: exc.degraded} if exc.degraded else {}))
        retry_after = getattr(exc, "retry_after_s", None)
        if retry_after is not None:
            out["retry-after"] = str(max(1, math.ceil(retry_after)))
            out[hdr.REASON] = header_text(self.client_text.text(exc.message))
        out.update(headers or {})
        return JSONResponse(self.public(exc), status_code=status or exc.status_code, headers=out)

    def endpoint(self, handler: Handler) -> Handler:
        """`handler` with the errors it raises rendered by `error`."""

        async def run(request: Request) -> Response:
            try:
                return await handler(request)
            except RequestError as exc:
                return self.error(exc, self.request_id(request))

        return run

    async def on_request_error(self, request: Request, exc: Exception) -> Response:
        """A RequestError that escaped a route (e.g. BodyLimit's 413 while an operator route read)."""
        assert isinstance(exc, RequestError)
        return self.error(exc, self.request_id(request), raw=b"")

    async def on_http_exception(self, request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        codes = {404: ErrorCode.NOT_FOUND, 405: ErrorCode.METHOD_NOT_ALLOWED}
        message = f"{request.method} {request.url.path}: {exc.detail}"
        error = RouteNotFound(message, status=exc.status_code, code=codes.get(exc.status_code, ErrorCode.HTTP_ERROR))
        return self.error(error, self.request_id(request))

    async def on_unexpected(self, request: Request, exc: Exception) -> Response:
        request_id = self.request_id(request)
        log.error("request %s: internal error", request_id, exc_info=exc)
        return self.error(InternalError(f"internal gateway error (request id {request_id})"), request_id)
