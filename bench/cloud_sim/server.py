"""The cloud simulator's HTTP app: a real OpenAI-compatible (or, with `api: anthropic`, Anthropic
Messages API) server with injectable faults.

Routes
    POST /v1/chat/completions   JSON or SSE (`"stream": true`), see `replies` (api openai)
    POST /v1/completions        the legacy completions API, see `completions_api` (api openai)
    POST /v1/messages           the same in the Messages API's shapes, see `anthropic_api` (api anthropic)
    GET  /v1/models             the configured model names
    GET  /healthz               liveness (no key needed)
    *    /control/*             need the key the simulator started with, if any (as /v1 takes it)
    GET  /control/faults        the current settings (never the key itself)
    POST /control/faults        merge a JSON object into the settings (400 on a bad value)
    POST /control/reset         back to the settings the app was built with
    GET  /control/stats         in-flight and total request counts
    GET  /control/log           the last 10,000 request records (`?x_request_id=` filters by the
                                id the caller forwarded), as written to `--log`

What differs between the two protocols is in `wire`. A chat request goes: `outage` (503, also for
`/v1/models`) → API key check (401; the Messages API also needs `anthropic-version`, 400) → body check
(400/404; the context window and an assistant prefill, see `provider.prefill`) → `content_filter` (400
`content_filter` when a message matches, the shape providers use for a content policy) → capacity check
(429 with Retry-After when `max_concurrency` requests are in flight) → one fault draw → the answer.
Latency: the first token after `ttft_s`, then one token every `1 / tokens_per_s` seconds;
a non-streamed reply is sent whole after the same total time. A request holds its
concurrency slot until its response is finished or the client has gone.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from bench.cloud_sim.completions_api import CompletionsWire
from bench.cloud_sim.faults import Fault, SimulatedCut, decide_fault
from bench.cloud_sim.provider.account_limits import AccountLimits
from bench.cloud_sim.provider.prefill import checked_plan
from bench.cloud_sim.replies import (
    BadChatRequest,
    ReplyPlan,
    content_filter,
    request_model,
    with_wrong_tool_arguments,
)
from bench.cloud_sim.request_log import RequestLog, logged_headers, prompt_shape
from bench.cloud_sim.responses import AbortableStarlette, Delayed, Releasing, Reset
from bench.cloud_sim.settings import InvalidSettings, SimSettings
from bench.cloud_sim.stream_faults import faulty_stream
from bench.cloud_sim.wire import Wire, wire_for

Clock = Callable[[], float]
Sleep = Callable[[float], Awaitable[None]]
_NOT_JSON = object()


def build_app(
    settings: SimSettings,
    *,
    rng: random.Random,
    clock: Clock = time.time,
    sleep: Sleep = asyncio.sleep,
    log_path: str | Path | None = None,
    log_bodies: bool = False,
) -> Starlette:
    """The ASGI app; `app.state.cloud_sim` is the `CloudSim` behind it."""
    return CloudSim(settings, rng=rng, clock=clock, sleep=sleep, log_path=log_path, log_bodies=log_bodies).app


def error_body(message: str, err_type: str, code: str | None, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": err_type, "param": param, "code": code}}


class CloudSim:
    def __init__(
        self,
        settings: SimSettings,
        *,
        rng: random.Random,
        clock: Clock,
        sleep: Sleep,
        log_path: str | Path | None,
        log_bodies: bool = False,
    ) -> None:
        self.initial_settings = settings
        self.settings = settings
        self.inflight = 0
        self._rng = rng
        self._clock = clock
        self._sleep = sleep
        self._log = RequestLog(log_path, bodies=log_bodies)
        self._counter = itertools.count(1)
        self.requests_total = 0
        self._wire = wire_for(settings.api)
        self._account = AccountLimits(clock)  # rpm_limit / tpm_limit: x-ratelimit-* headers, 429 past them
        completions = CompletionsWire()  # an OpenAI-compatible simulator serves the legacy API beside chat
        legacy = [Route(completions.path, partial(self._chat, completions), methods=["POST"])]
        legacy = legacy if settings.api == "openai" else []
        self.app = AbortableStarlette(
            routes=[
                Route(self._wire.path, partial(self._chat, self._wire), methods=["POST"]),
                *legacy,
                Route("/v1/models", self._models, methods=["GET"]),
                Route("/healthz", self._healthz, methods=["GET"]),
                Route("/control/faults", partial(self._keyed, self._get_faults), methods=["GET"]),
                Route("/control/faults", partial(self._keyed, self._set_faults), methods=["POST"]),
                Route("/control/reset", partial(self._keyed, self._reset), methods=["POST"]),
                Route("/control/stats", partial(self._keyed, self._stats), methods=["GET"]),
                Route("/control/log", partial(self._keyed, self._log_rows), methods=["GET"]),
            ],
            exception_handlers={HTTPException: self._http_exception},
        )
        self.app.state.cloud_sim = self

    # -- /v1 ---------------------------------------------------------------------------

    async def _chat(self, wire: Wire, request: Request) -> Response:
        settings = self.settings
        sim_id = self._new_id()
        raw = await request.body()
        try:
            body: Any = json.loads(raw)
        except ValueError:
            body = _NOT_JSON
        stream = isinstance(body, dict) and body.get("stream") is True
        record = {**self._record(request, sim_id, model=request_model(body), stream=stream), **prompt_shape(body)}
        record.update(self._log.body_fields(raw))
        if settings.outage:
            return self._answer(record, self._outage(sim_id), "outage")
        denied = self._check_key(request, settings, sim_id)
        if denied is not None:
            return self._answer(record, *denied)
        try:
            wire.check_headers(request.headers)
            if body is _NOT_JSON:
                raise BadChatRequest("request body is not valid JSON")
            plan = checked_plan(wire.plan(body, settings.models, f"call_{sim_id}"), body, settings)
            content_filter(settings.content_filter, body)
        except BadChatRequest as exc:
            payload = self._wire.error(exc.status, exc.message, "invalid_request_error", exc.code, exc.param)
            return self._answer(record, JSONResponse(payload, exc.status, self._headers(sim_id)), exc.code)
        limit = body.get("max_completion_tokens", body.get("max_tokens"))
        estimate = plan.prompt_tokens + (limit if isinstance(limit, int) else plan.completion_tokens)
        account = self._account.admit(settings.rpm_limit, settings.tpm_limit, estimate, settings.limit_window_s)
        if not account.allowed:
            message = "Rate limit reached for requests or tokens per min (simulated account limit)"
            limited = self._rate_limited(settings, sim_id, message, "rate_limit_exceeded", account.retry_after_s)
            limited.headers.update(account.headers)
            return self._answer(record, limited, "rate_limit_exceeded")
        if settings.max_concurrency and self.inflight >= settings.max_concurrency:
            message = f"cloud-sim is at capacity ({settings.max_concurrency} requests in flight); retry later"
            code = "capacity_exceeded"
            return self._answer(record, self._rate_limited(settings, sim_id, message, code), code)
        self.inflight += 1
        try:
            fault = decide_fault(settings, self._rng)
            response = self._respond(wire, fault, plan, settings, sim_id, stream, account.headers)
            return self._answer(record, Releasing(response, self._release), fault=fault)
        except BaseException:
            self._release()
            raise

    def _respond(
        self,
        wire: Wire,
        fault: Fault,
        plan: ReplyPlan,
        settings: SimSettings,
        sim_id: str,
        stream: bool,
        extra: dict[str, str],
    ) -> Response:
        headers = {**self._headers(sim_id), **extra}  # the account's x-ratelimit-* headers
        if fault is Fault.ERROR_5XX:
            message = "The server had an error while processing your request. Sorry about that!"
            status = self._rng.choice(wire.server_error_statuses)
            return JSONResponse(wire.error(status, message, "server_error", None, None), status, headers)
        if fault is Fault.RATE_LIMIT:
            return self._rate_limited(settings, sim_id, "Rate limit reached (simulated)", "rate_limit_exceeded")
        if fault is Fault.TIMEOUT:
            message = f"cloud-sim held the request for {settings.hang_s:g} s (simulated timeout)"
            timeout = JSONResponse(wire.error(504, message, "server_error", "timeout", None), 504, headers)
            return Delayed(timeout, settings.hang_s, self._sleep)
        if fault is Fault.RESET:
            return Reset()
        if fault is Fault.SCHEMA_INVALID and plan.content is not None and plan.content.startswith("{"):
            wrong = '{"cloud_sim": "this object ignores the requested schema"}'
            plan = replace(plan, content=wrong, pieces=(wrong,))
        if fault is Fault.TOOL_ARGS_INVALID:
            plan = with_wrong_tool_arguments(plan)
        completion_id = f"{wire.id_prefix}{sim_id}"
        created = int(self._clock())
        n_tokens = len(plan.pieces)
        per_token = 1.0 / settings.tokens_per_s if settings.tokens_per_s > 0 else 0.0
        cut = fault is Fault.MIDSTREAM_CUT
        if stream:
            events = wire.events(plan, completion_id, created)
            first = wire.first_token_event
            delays = [0.0] * (first - 1) + [settings.ttft_s] + [per_token] * n_tokens
            delays += [0.0] * (len(events) - len(delays))
            malformed = wire.malformed_event(completion_id)
            events, delays = faulty_stream(
                fault, events, delays, first=first, n_tokens=n_tokens, malformed=malformed, settings=settings
            )
            headers["cache-control"] = "no-cache"
            return StreamingResponse(self._paced(events, delays, cut), media_type="text/event-stream", headers=headers)
        total_delay = settings.ttft_s + per_token * n_tokens
        text = json.dumps(wire.body(plan, completion_id, created))
        if fault is Fault.MALFORMED:
            text = text[: len(text) // 2]
        if cut:
            half = text[: len(text) // 2]
            paced = self._paced([half], [total_delay], True)
            return StreamingResponse(paced, media_type="application/json", headers=headers)
        return Delayed(Response(text, 200, headers, media_type="application/json"), total_delay, self._sleep)

    async def _paced(self, events: list[str], delays: list[float], cut: bool) -> AsyncIterator[str]:
        for event, delay in zip(events, delays, strict=True):
            if delay > 0:
                await self._sleep(delay)
            yield event
        if cut:
            raise SimulatedCut("cloud-sim dropped the connection (simulated mid-stream cut)")

    async def _models(self, request: Request) -> Response:
        settings = self.settings
        sim_id = self._new_id()
        record = self._record(request, sim_id, model=None, stream=False)
        if settings.outage:
            return self._answer(record, self._outage(sim_id), "outage")
        denied = self._check_key(request, settings, sim_id)
        if denied is not None:
            return self._answer(record, *denied)
        models = self._wire.models(settings.models, int(self._clock()))
        return self._answer(record, JSONResponse(models, headers=self._headers(sim_id)))

    async def _healthz(self, request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    # -- /control ------------------------------------------------------------------------

    async def _keyed(self, route: Callable[[Request], Awaitable[Response]], request: Request) -> Response:
        """`route` behind the key the simulator started with (one set later through /control/faults is /v1's)."""
        denied = self._check_key(request, self.initial_settings, "control")
        return denied[0] if denied is not None else await route(request)

    async def _get_faults(self, request: Request) -> Response:
        return JSONResponse(self.settings.public())

    async def _set_faults(self, request: Request) -> Response:
        try:
            updates = json.loads(await request.body())
            if not isinstance(updates, dict):
                raise InvalidSettings("the body must be a JSON object of settings")
            if updates.get("api", self.settings.api) != self.settings.api:
                raise InvalidSettings("api: the wire protocol is fixed when the simulator starts")
            self.settings = self.settings.merged(updates)
        except (ValueError, InvalidSettings) as exc:
            message = str(exc) if isinstance(exc, InvalidSettings) else "the body is not valid JSON"
            return JSONResponse(error_body(message, "invalid_request_error", "invalid_settings"), 400)
        return JSONResponse(self.settings.public())

    async def _reset(self, request: Request) -> Response:
        self.settings = self.initial_settings
        self._account.reset()
        return JSONResponse(self.settings.public())

    async def _log_rows(self, request: Request) -> Response:
        return JSONResponse({"rows": self._log.recent(request.query_params.get("x_request_id"))})

    async def _stats(self, request: Request) -> Response:
        return JSONResponse({"inflight": self.inflight, "requests_total": self.requests_total})

    async def _http_exception(self, request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        message = f"{request.method} {request.url.path}: {exc.detail}"
        return JSONResponse(error_body(message, "invalid_request_error", "not_found"), exc.status_code)

    # -- helpers -------------------------------------------------------------------------

    def _new_id(self) -> str:
        self.requests_total += 1
        return f"sim-{next(self._counter):06d}"

    def _release(self) -> None:
        self.inflight -= 1

    def _headers(self, sim_id: str) -> dict[str, str]:
        return {"x-request-id": sim_id}

    def _record(self, request: Request, sim_id: str, *, model: str | None, stream: bool) -> dict[str, Any]:
        return {
            "time": self._clock(),
            "request_id": sim_id,
            "method": request.method,
            "path": request.url.path,
            "model": model,
            "stream": stream,
            "headers": logged_headers(request.headers),
        }

    def _answer(
        self, record: dict[str, Any], response: Response, error: str | None = None, *, fault: Fault = Fault.NONE
    ) -> Response:
        """Log the request with what it will get, then hand the response over."""
        self._log.write({**record, "fault": str(fault), "error": error, "status": response.status_code})
        return response

    def _check_key(self, request: Request, settings: SimSettings, sim_id: str) -> tuple[Response, str] | None:
        if not settings.require_api_key:
            return None
        presented = self._wire.presented_key(request.headers)
        if settings.key_matches(presented):
            return None
        if not presented:
            message, code = "You didn't provide an API key.", "missing_api_key"
        else:
            message, code = "Incorrect API key provided.", "invalid_api_key"
        body = self._wire.error(401, message, "invalid_request_error", code, None)
        return JSONResponse(body, 401, self._headers(sim_id)), code

    def _outage(self, sim_id: str) -> Response:
        message = "The service is temporarily unavailable (simulated outage)."
        body = self._wire.error(503, message, "server_error", "service_unavailable", None)
        return JSONResponse(body, 503, self._headers(sim_id))

    def _rate_limited(
        self, settings: SimSettings, sim_id: str, message: str, code: str, after_s: float | None = None
    ) -> Response:
        after_s = settings.retry_after_s if after_s is None else after_s
        headers = {**self._headers(sim_id), "retry-after": str(math.ceil(after_s)),
                   "retry-after-ms": str(round(after_s * 1000))}  # fmt: skip
        return JSONResponse(self._wire.error(429, message, "requests", code, None), 429, headers)
