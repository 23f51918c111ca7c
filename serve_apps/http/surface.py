"""The gateway's HTTP surface: an OpenAI-compatible Starlette app over a `ModelBackend`.

Routes
    POST /v1/chat/completions   JSON or SSE (`"stream": true`)
    POST /v1/completions        JSON or SSE
    GET  /v1/models             every configured model, then every route (`routes:`)
    GET  /healthz               the gateway process answers (liveness)
    GET  /readyz                every model deployment passes its health check and its start-up golden
                                check (serve_apps/resilience/golden_gate.py); 503 names each model's reason (with
                                auth on, to an admin tenant only: others get the bare status)
    GET  /metrics               Prometheus metrics (serve_apps/telemetry/metrics.py)
    GET  /openapi.json          this surface as OpenAPI 3.0 (serve_apps/http/openapi.py)
    GET  /v1/spillover/cluster    the latest ClusterSnapshot: engine stats, age, saturation per replica,
                                  and each model's golden check
    GET  /v1/spillover/resilience        health, breakers, retry budget, quotas (serve_apps/resilience/routes.py)
    POST /v1/spillover/resilience/reset  operator reset of health and breaker state
    POST /v1/spillover/feedback, GET /v1/spillover/quality   learning (serve_apps/learning/routes.py)

Where a request runs is decided by the injected dispatcher (serve_apps/dispatch/dispatcher.py: local replica,
cloud provider, or a bounded wait for local room); answers carry `x-spillover-route` (local|cloud),
`x-spillover-target` and `x-spillover-reason`. Clients may send `x-spillover-residency: local_only`
(never leaves the cluster), `x-spillover-deadline-ms` and the other contract headers
(router/request/contract_headers.py). `GET /v1/spillover/decisions/{request_id}` returns the decision record
of a recent request. A request with `Idempotency-Key` (streamed or not) is answered once and replayed for
repeats on any gateway replica (serve_apps/http/idempotent.py).

With an authenticator (`EdgeSettings`, serve_apps/gateway_parts.py), every /v1/* route needs
`Authorization: Bearer <tenant key>` (401 in the OpenAI shape otherwise), a tenant's generation
requests are held to its concurrency limit and monthly budget (serve_apps/limits/tenants.py), the
tenant's residency / providers narrow the contract, and the operator routes (`/v1/spillover/cluster`,
`/v1/spillover/resilience*`) need an `admin` tenant (403). The key is checked before the body is read;
a body is read only up to `max_body_bytes` (413); error texts are scrubbed of URLs, hosts, account ids
and `redact` names (serve_apps/http/guards.py); decision records are per tenant.

Every response carries `x-request-id` (the client's, or a new one). Behind the Ray Serve proxy the
proxy itself sets that header (and passes the same id in the request headers), so the deployment runs
with `EdgeSettings(set_request_id=False)` to avoid a duplicate header. Responses that a model produced
also carry `x-spillover-route` and `x-spillover-target`. Every error uses the OpenAI shape
`{"error": {"message", "type", "param", "code"}}`; no traceback ever reaches a client.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Awaitable, Iterable
from functools import partial
from typing import Any, TypeVar

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from router import headers as hdr
from router.error_codes import ErrorCode
from router.errors import InvalidRequest, NotFound, RequestError, RequestTimeout, UpstreamError
from router.request.auth import TenantPolicy, narrow_for_tenant
from router.request.openai_request import Kind, ModelLimits, decode_json, parse_body, resolve_model
from router.routing.policy import Policy
from router.routing.saturation import cluster_view
from serve_apps.backend import ModelBackend
from serve_apps.dispatch.interfaces import Dispatch
from serve_apps.gateway_parts import EdgeSettings, GatewayParts, OperatorParts
from serve_apps.http.edge import HttpEdge, header_text
from serve_apps.http.guards import ClientText, request_guards, within
from serve_apps.http.idempotent import KEY_HEADER
from serve_apps.http.model_card import ServedModel, ServedRoute
from serve_apps.http.openapi import openapi_document
from serve_apps.http.readiness import Readiness
from serve_apps.learning.decision_routes import OwnedDecisions, owner_of
from serve_apps.learning.state import plain_derive
from serve_apps.limits.tenants import TenantLimits
from serve_apps.off_loop.check_pool import RequestChecks
from serve_apps.state import timing as store_time
from serve_apps.telemetry.metrics import GatewayMetrics

log = logging.getLogger("spillover.gateway")

REQUEST_ID = hdr.REQUEST_ID
ROUTE = hdr.ROUTE
TARGET = hdr.TARGET
REASON = hdr.REASON
USED_ID = hdr.USED_REQUEST_ID
T = TypeVar("T")


class GatewayHTTP:
    """Holds the routes' state; `app` is the ASGI application. `dispatcher` decides where each generation
    request runs (serve_apps/dispatch/dispatcher.py; `LocalDispatch` for a bare local backend); the bundles of
    serve_apps/gateway_parts.py carry the edge's settings, the request path's parts and the operator's."""

    def __init__(
        self,
        backend: ModelBackend,
        models: list[ServedModel],
        dispatcher: Dispatch,
        *,
        created: int,
        routes: Iterable[ServedRoute] = (),
        edge: EdgeSettings | None = None,
        parts: GatewayParts | None = None,
        operator: OperatorParts | None = None,
    ) -> None:
        edge, parts, operator = edge or EdgeSettings(), parts or GatewayParts(), operator or OperatorParts()
        self._tenant_limits = parts.tenant_limits or TenantLimits()
        self._edge = HttpEdge(  # the one error renderer and operator guard (serve_apps/http/edge.py)
            edge.authenticator,
            ClientText(edge.redact),
            new_id=edge.new_id,
            set_request_id=edge.set_request_id,
            counted=self._counted,
            rates=self._tenant_limits.rates,  # requests_per_minute, in the tenant limits' store
        )
        self._checks = parts.checks or RequestChecks()
        self._golden = operator.golden
        learning = parts.learning
        self._derive = learning.derive if learning is not None else plain_derive  # typing: serve_apps/learning/state.py
        self._client_text = self._edge.client_text
        self._request_timeout_s = edge.request_timeout_s
        self._idempotent = parts.idempotent
        self._metrics = parts.metrics or GatewayMetrics()
        self._metrics_body = parts.metrics_page
        self._policy = parts.policy or Policy()
        self._owned = OwnedDecisions(parts.decisions, edge.new_id)
        self._dispatcher = dispatcher
        self._default_deadline_s = edge.default_deadline_s
        self._models = {m.alias: m for m in models}
        self._routes = {r.alias: r for r in routes}
        self._limits = {m.alias: ModelLimits(m.alias, m.max_model_len) for m in models}
        self._limits |= {r.alias: ModelLimits(r.alias, None) for r in self._routes.values()}
        self._created = created
        self._snapshot = operator.snapshot
        self._clock = operator.clock
        self._readiness = Readiness(
            backend,
            list(self._models),
            health_timeout_s=operator.health_timeout_s,
            snapshot=operator.snapshot,
            clock=operator.clock,
            health=operator.ops,
            golden=operator.golden,
            store=operator.store,
        )
        ops, traffic = operator.ops, operator.traffic
        self.app = Starlette(
            routes=[
                Route("/v1/chat/completions", self._chat, methods=["POST"]),
                Route("/v1/completions", self._completions, methods=["POST"]),
                Route("/v1/models", self._edge.endpoint(self._list_models), methods=["GET"]),
                Route("/healthz", self._healthz, methods=["GET"]),
                Route("/readyz", self._readyz, methods=["GET"]),
                Route("/v1/spillover/cluster", self._edge.endpoint(self._cluster), methods=["GET"]),
                self._owned.route(self._edge, self._client_text.body),
                Route("/metrics", self._metrics_page, methods=["GET"]),
                Route("/openapi.json", self._openapi, methods=["GET"]),
                *(ops.routes(self._edge) if ops is not None else []),
                *(traffic.routes(self._edge) if traffic is not None else []),
                *(learning.routes(self._edge) if learning is not None else []),
            ],
            middleware=request_guards(edge.max_body_bytes, edge.http_limits),
            exception_handlers={
                HTTPException: self._edge.on_http_exception,
                RequestError: self._edge.on_request_error,
                Exception: self._edge.on_unexpected,
            },
        )

    def _headers(self, request_id: str, **extra: str) -> dict[str, str]:
        return self._edge.headers(request_id, **extra)

    def _request_id(self, request: Request) -> str:
        return self._edge.request_id(request)

    def _counted(self, exc: RequestError, raw: bytes) -> None:
        self._metrics.answered(self._model_label(raw), "", "", exc.code or "error")

    async def _chat(self, request: Request) -> Response:
        return await self._generate(request, "chat")

    async def _completions(self, request: Request) -> Response:
        return await self._generate(request, "completions")

    async def _generate(self, request: Request, kind: Kind) -> Response:
        spent, token = store_time.begin()  # what the shared store adds to this request (Server-Timing)
        try:
            response = await self._generate_in(request, kind)
        finally:
            store_time.CURRENT.reset(token)
        response.headers[store_time.HEADER] = spent.header()
        return response

    async def _generate_in(self, request: Request, kind: Kind) -> Response:
        request_id = self._request_id(request)
        slot = None
        try:
            tenant = await self._edge.tenant(request)  # before a single body byte is read
            slot = await self._tenant_limits.admit(tenant)  # budget, concurrency (serve_apps/limits/tenants.py)
            raw = await request.body()  # bounded by BodyLimit
        except RequestError as exc:
            if slot is not None:
                slot.release()
            return self._rejected(exc, request_id, b"")
        owner = owner_of(tenant)
        request_id = self._owned.claim(request_id, owner)
        try:
            response = await self._run(kind, request, request_id, raw, tenant)
        except BaseException:
            slot.release()
            raise
        finally:
            self._owned.release(request_id, owner)
        given = request.headers.get(REQUEST_ID)
        if given is not None and given != request_id:  # behind Serve's proxy, x-request-id stays the client's
            response.headers[USED_ID] = request_id
        return slot.held(response)  # the tenant's slot is held until the answer (a whole stream) is sent

    async def _run(
        self, kind: Kind, request: Request, request_id: str, raw: bytes, tenant: TenantPolicy | None
    ) -> Response:
        key = request.headers.get(KEY_HEADER)
        try:
            if key is None or self._idempotent is None:
                return await self._answer(kind, request, request_id, raw, tenant)
            produce = partial(self._answer, kind, request, request_id, raw, tenant)
            response, replayed = await self._idempotent.answer(key, owner_of(tenant), raw, produce, request.headers)
        except RequestError as exc:
            return self._rejected(exc, request_id, raw)
        if replayed:
            response.headers.update(self._headers(request_id))
            log.info("replayed", extra={"request_id": request_id, "status": response.status_code})
        return response

    async def _answer(
        self, kind: Kind, request: Request, request_id: str, raw: bytes, tenant: TenantPolicy | None
    ) -> Response:
        try:
            parsed = parse_body(raw, kind)
            resolve_model(parsed, self._limits)
            # off the event loop, in the tenant's turn (a small body without schemas: on it): a client's JSON Schema
            # is checked here, up to ~2 s
            derive = partial(self._derive, parsed.body, request.headers, self._policy, tenant, request_id)
            contract = await self._timed(self._checks.derive(owner_of(tenant), parsed.body, derive, size=len(raw)))
            if tenant is not None:
                contract = narrow_for_tenant(contract, tenant)
            if parsed.stream and contract.level == "L1" and (contract.needs_json_schema or contract.needs_json_mode):
                raise InvalidRequest(  # streamed L1 tool calls are checked (serve_apps/streams/contract.py)
                    "L1 requests with a json_schema or json_object response_format cannot be streamed: the "
                    "gateway validates the whole answer before sending it (send stream: false, or lower the level)",
                    param="stream",
                )
            deadline_s = contract.deadline_ms / 1000 if contract.deadline_ms else self._default_deadline_s
            done = await self._timed(
                self._dispatcher.dispatch(kind, parsed.body, request_id, contract=contract, deadline_s=deadline_s)
            )
        except RequestError as exc:
            return self._rejected(exc, request_id, raw)
        fields = {"request_id": request_id, "model": contract.model, "route": done.route, "target": done.target}
        log.info("routed", extra={**fields, "reason": done.reason, "waited_s": round(done.waited_s, 3)})
        self._metrics.answered(contract.model, done.route, done.target, "ok")
        reply = done.reply
        headers = self._headers(
            request_id,
            **{ROUTE: done.route, TARGET: done.target, REASON: header_text(self._client_text.text(done.reason))},
            **{k: header_text(self._client_text.text(v)) for k, v in done.headers.items()},
        )
        if reply.chunks is not None:
            headers["cache-control"] = "no-cache"
            return StreamingResponse(
                self._guard_stream(reply.chunks, request_id), media_type="text/event-stream", headers=headers
            )
        return JSONResponse(reply.body, status_code=done.status, headers=headers)

    async def _timed(self, step: Awaitable[T]) -> T:
        """`step` within gateway.request_timeout_s, else RequestTimeout (504)."""
        try:  # cancelled with `request_timeout` and unwound first: records, quota and spend are booked
            return await within(step, self._request_timeout_s)
        except TimeoutError:
            raise RequestTimeout(f"no answer within gateway.request_timeout_s = {self._request_timeout_s:g}s") from None

    def _rejected(self, exc: RequestError, request_id: str, raw: bytes) -> Response:
        return self._edge.error(exc, request_id, raw=raw)

    async def _guard_stream(self, chunks: AsyncIterator[str], request_id: str) -> AsyncIterator[str]:
        """Pass SSE events through; a failure after the first byte ends the stream with an
        error event and `[DONE]` (the request is never re-sent)."""
        try:
            async for chunk in chunks:
                yield self._client_text.events(chunk)  # an engine's error event names no host either
        except RequestError as exc:
            log.warning("request %s failed mid-stream: %s", request_id, exc.message)
            yield f"data: {_json(self._edge.public(exc))}\n\ndata: [DONE]\n\n"
        except Exception:
            log.exception("request %s failed mid-stream", request_id)
            error = self._edge.public(UpstreamError("the model failed while streaming"))
            yield f"data: {_json(error)}\n\ndata: [DONE]\n\n"

    async def _list_models(self, request: Request) -> Response:
        await self._edge.tenant(request)
        cards = [m.card(self._created) for m in self._models.values()]
        cards += [r.card(self._created) for r in self._routes.values()]
        return JSONResponse({"object": "list", "data": cards}, headers=self._headers(self._request_id(request)))

    async def _healthz(self, request: Request) -> Response:
        return JSONResponse({"status": "ok"}, headers=self._headers(self._request_id(request)))

    async def _readyz(self, request: Request) -> Response:
        ready, body = await self._readiness.check()  # serve_apps/http/readiness.py
        if self._edge.auth_on:
            try:
                await self._edge.admin(request)
            except RequestError:  # with auth on, the per-model reasons are an admin's to read
                body = {"status": body["status"]}
        return JSONResponse(body, status_code=200 if ready else 503, headers=self._headers(self._request_id(request)))

    async def _cluster(self, request: Request) -> Response:
        await self._edge.admin(request)
        headers = self._headers(self._request_id(request))
        if self._snapshot is None:
            raise NotFound("this gateway has no telemetry source", code=ErrorCode.NO_TELEMETRY)
        now = self._clock()
        body = {"now": now, "models": list(self._models), **cluster_view(self._snapshot(), now)}
        body["golden"] = self._golden.view() if self._golden is not None else {}
        return JSONResponse(body, headers=headers)

    async def _openapi(self, request: Request) -> Response:
        return JSONResponse(openapi_document())

    async def _metrics_page(self, request: Request) -> Response:
        body = await self._metrics_body() if self._metrics_body is not None else self._metrics.render()
        return Response(body, media_type=self._metrics.content_type)

    def _model_label(self, raw: bytes) -> str:
        """The model a failed request named, if it is a configured one (bounded label values)."""
        try:
            model = decode_json(raw or b"{}").get("model")
        except (RequestError, AttributeError):
            model = None
        return model if isinstance(model, str) and model in self._limits else "unknown"


def _json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))
