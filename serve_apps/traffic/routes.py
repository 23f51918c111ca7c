"""Operator traffic routes and deferred requests' tickets.

    GET  /v1/spillover/traffic           the shared operator document (drains, pins, switches, history)
                                         and this replica's graded switches (step, share, gates, events);
                                         admin
    POST /v1/spillover/traffic           one command (router/traffic/traffic.py): drain / undrain a target,
                                         pin / unpin a model or scenario, switch (after the standby's
                                         dry-run, serve_apps/traffic/dry_run.py; 409 dry_run_failed refuses it),
                                         rollback, clear; admin; 400 invalid_traffic_command otherwise
    GET  /v1/spillover/tickets/{id}      a deferred request's answer (serve_apps/traffic/deferral.py): 202 while
                                         pending, then the answer (200) or its error; only its tenant;
                                         through any replica (serve_apps/traffic/shared_tickets.py)

The command is written to the shared board, so every gateway replica follows it within
`traffic.sync_period_s`; the replica that took it follows at once.
"""

from __future__ import annotations

import logging
import uuid

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from router.error_codes import ErrorCode
from router.errors import DryRunFailed, InvalidRequest, RequestError, TicketAnswerDropped, TicketNotFound
from router.headers import DEGRADED, TICKET
from router.traffic import traffic as doc_ops
from router.traffic.tickets import TicketStore
from serve_apps.http.edge import HttpEdge
from serve_apps.traffic.controls import Traffic
from serve_apps.traffic.deferral import TICKETS_PATH
from serve_apps.traffic.dry_run import DryRun
from serve_apps.traffic.metrics import TrafficMetrics
from serve_apps.traffic.shared_tickets import find_ticket

log = logging.getLogger("spillover.traffic")


class TrafficRoutes:
    def __init__(
        self,
        traffic: Traffic,
        dry_run: DryRun,
        *,
        models: list[str],
        targets: list[str],
        scenarios: list[str],
        tickets: TicketStore | None = None,
        metrics: TrafficMetrics | None = None,
    ) -> None:
        self._traffic = traffic
        self._dry_run = dry_run
        self._models, self._targets, self._scenarios = models, targets, scenarios
        self._tickets = tickets  # the tiered dispatch's (serve_apps/traffic/deferral.py); none: no ticket is ever found
        self._metrics = metrics

    def routes(self, edge: HttpEdge) -> list[Route]:
        async def view(request: Request) -> Response:
            await edge.admin(request, "read the traffic controls")
            return JSONResponse(self._traffic.view(), headers=edge.headers_for(request))

        async def command(request: Request) -> Response:
            await edge.admin(request, "change the traffic controls")
            raw = await request.body()  # after the key check; bounded by BodyLimit
            parsed = doc_ops.parse_command(raw, models=self._models, targets=self._targets, scenarios=self._scenarios)
            said = await self._apply(parsed)
            return JSONResponse({"result": said, "traffic": self._traffic.view()}, headers=edge.headers_for(request))

        async def ticket(request: Request) -> Response:
            tenant = await edge.tenant(request)
            wanted, owner = str(request.path_params["ticket"])[:128], tenant.name if tenant is not None else ""
            found = await find_ticket(self._tickets, wanted, owner)  # this replica's, else the shared store's
            if found is None:
                raise TicketNotFound("no such ticket (unknown, expired, or another tenant's)")
            request_id = edge.request_id(request)
            deferred = {TICKET: found.id, DEGRADED: "deferred"}
            if found.state == "pending":
                waited = {"object": "spillover.ticket", "id": found.id, "status": "pending", "model": found.model}
                return JSONResponse(waited, 202, headers=edge.headers(request_id, **deferred, **{"retry-after": "1"}))
            if isinstance(found.body, RequestError):
                return edge.error(found.body, request_id, status=found.status, headers=deferred)
            if found.body is None:
                return edge.error(TicketAnswerDropped("the answer was too large to keep"), request_id, headers=deferred)
            return JSONResponse(
                found.body, found.status, headers={**edge.headers(request_id, **deferred), **dict(found.headers)}
            )

        return [
            Route("/v1/spillover/traffic", edge.endpoint(view), methods=["GET"]),
            Route("/v1/spillover/traffic", edge.endpoint(command), methods=["POST"]),
            Route(TICKETS_PATH + "{ticket}", edge.endpoint(ticket), methods=["GET"]),
        ]

    async def _apply(self, command: doc_ops.Command) -> str:
        if command.action != "switch":
            return await self._traffic.command(command)
        model, standby, primary = command.model or "", command.target or "", command.primary or ""
        for key, endpoint in (("primary", primary), ("standby", standby)):
            if self._dry_run.target(model, endpoint) is None:
                raise InvalidRequest(
                    f"{endpoint} does not serve {model}", param=key, code=ErrorCode.INVALID_TRAFFIC_COMMAND
                )
        try:
            answer = await self._dry_run.run(model, command.scenario, standby, command.dry_run)
        except DryRunFailed as exc:
            if self._metrics is not None:
                self._metrics.dry_run(standby, passed=False)
            said = f"switch {primary} -> {standby} refused: {exc.message}"[:300]
            log.warning("%s: %s", command.scope, said)
            await self._traffic.record("switch_refused", command.scope, said)
            raise
        if self._metrics is not None:
            self._metrics.dry_run(standby, passed=True)
        log.info("%s: dry-run of %s passed (%s)", command.scope, standby, answer[:80])
        return await self._traffic.command(command, uuid.uuid4().hex[:12])
