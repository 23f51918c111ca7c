"""Degradation tiers at dispatch: core requests as before, non-core ones deferred or shed under shortage.

`TieredDispatch` wraps the `Dispatcher`. A request of a `priority: non_core` scenario
(router/resilience/tiers.py) is first planned: when every capable target is unavailable, or the local model is
saturated with nowhere to burst (the plan says `wait`), it does not take a seat in the waiting room;
when it is dispatched and every attempt fails for want of a target (503 / 502 / 504 / 429 wait
timeout), the same happens. Then:

* deferred (non-streamed, `traffic.tickets.enabled`, a free ticket slot in the tenant's share): `202`
  with a ticket (`x-spillover-degraded: deferred`, `x-spillover-ticket`, `location`); the gateway
  retries it in the background every `traffic.tickets.retry_s` for up to `traffic.tickets.max_wait_s`
  and stores the answer, or the last error, in the bounded `TicketStore` (router/traffic/tickets.py):
  `GET /v1/spillover/tickets/{id}` returns it. While it is pending the ticket is one of its tenant's
  requests in flight (`tenants[].max_concurrent`, serve_apps/limits/tenants.py), and it holds the
  request id for that tenant, so the background attempts' decision record is stored under it only;
* shed otherwise: `503 non_core_shed` with Retry-After.

Core requests fail exactly as without tiers (e.g. `503 target_unavailable` when every target is
down). A ticket's retries run on the gateway replica that gave it out; its state and answer are also kept in
the shared store, so any replica answers a poll (serve_apps/traffic/shared_tickets.py).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cluster.config.traffic import CacheSection, TicketSection
from router import headers as hdr
from router.errors import (
    ContractViolation,
    LocalCapacityExhausted,
    NonCoreShed,
    RequestError,
    TargetUnavailable,
    UpstreamError,
)
from router.request.contract import RequestContract
from router.request.openai_request import Kind
from router.resilience.response_cache import ResponseCache, cache_key, could_have_answered
from router.resilience.tiers import priority_of, under_shortage
from router.routing.policy import Policy
from router.traffic.tickets import TicketStore
from serve_apps.backend import BackendReply
from serve_apps.clocks import Clocks
from serve_apps.dispatch.dispatcher import Dispatcher
from serve_apps.dispatch.interfaces import Dispatched
from serve_apps.limits.tenants import Slot, TenantLimits
from serve_apps.traffic.metrics import TrafficMetrics

log = logging.getLogger("spillover.deferral")
TICKETS_PATH = "/v1/spillover/tickets/"


def kw(contract: RequestContract, deadline_s: float) -> dict[str, Any]:
    return {"contract": contract, "deadline_s": deadline_s}


def _short(exc: RequestError) -> bool:
    """An error that means 'no target right now' (not the request's fault, not its contract)."""
    if isinstance(exc, ContractViolation):
        return False
    return isinstance(exc, TargetUnavailable | LocalCapacityExhausted | UpstreamError)


def response_cache(section: CacheSection, clock: Callable[[], float]) -> ResponseCache | None:
    """The recent answers' cache of `traffic.cache`; None when it is off."""
    if not section.enabled:
        return None
    return ResponseCache(max_entries=section.max_entries, max_bytes=section.max_bytes, ttl_s=section.ttl_s, clock=clock)


@dataclass(frozen=True)
class Kept:
    """Where the tiered dispatch keeps answers: the deferred requests' tickets (router/traffic/tickets.py; the same
    store serve_apps/traffic/routes.py reads them from) and the recent answers' cache, if any."""

    tickets: TicketStore
    cache: ResponseCache | None = None


class TieredDispatch:
    def __init__(
        self,
        inner: Dispatcher,
        policy: Policy,
        settings: TicketSection,
        kept: Kept,
        *,
        metrics: TrafficMetrics | None = None,
        clocks: Clocks | None = None,  # the monotonic clock and the retries' sleep
        new_id: Callable[[], str] = lambda: uuid.uuid4().hex,
        limits: TenantLimits | None = None,
    ) -> None:
        clocks = clocks or Clocks()
        self._inner = inner
        self._policy = policy
        self._settings = settings
        self._metrics = metrics
        self._clock = clocks.clock
        self._sleep = clocks.sleep
        self._new_id = new_id
        self._limits = limits  # the HTTP edge's: a pending ticket is one of its tenant's requests in flight
        self.tickets = kept.tickets
        self._tasks: set[asyncio.Task[None]] = set()
        self.cache = kept.cache

    async def dispatch(
        self, kind: Kind, body: dict[str, Any], request_id: str, *, contract: RequestContract, deadline_s: float
    ) -> Dispatched:
        priority = priority_of(self._policy, contract)
        key = cache_key(contract, {**body, "kind": kind}) if self.cache is not None else None
        if priority == "core":
            try:
                return self._remember(
                    key, await self._inner.dispatch(kind, body, request_id, **kw(contract, deadline_s))
                )
            except RequestError as exc:
                if _short(exc) and (cached := self._cached(key, exc.message, contract)) is not None:
                    return cached
                raise
        try:
            plan = self._inner.plan(contract, kind, peek=True)  # planned for real once, by the dispatch
            why = "" if plan.route != "wait" else f"local capacity short and no burst: {plan.reason}"
        except TargetUnavailable as exc:
            why = exc.message
        if not why:
            try:
                return self._remember(
                    key, await self._inner.dispatch(kind, body, request_id, **kw(contract, deadline_s))
                )
            except RequestError as exc:
                if not _short(exc):
                    raise
                why = exc.message
        if (cached := self._cached(key, why, contract)) is not None:
            return cached
        outcome = under_shortage(priority, streamed=bool(body.get("stream")), can_defer=self._settings.enabled)
        owner = contract.tenant or ""
        ticket = self.tickets.open(self._new_id(), owner, contract.model) if outcome == "defer" else None
        self._count(contract.model, "deferred" if ticket is not None else "shed")
        if ticket is None:
            raise NonCoreShed(
                f"non-core request shed under shortage (scenario {contract.scenario!r}): {why}"[:400],
                retry_after_s=self._settings.retry_s,
            )
        # held until the ticket finishes: the gateway's claim on the id (still held now) ends with the 202
        self._inner.decisions.claim(request_id, owner)
        slot = await self._limits.keep(owner) if self._limits is not None else Slot()
        task = asyncio.get_running_loop().create_task(self._complete(ticket.id, kind, body, request_id, contract, slot))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        url = TICKETS_PATH + ticket.id
        reply = {
            "object": "spillover.ticket",
            "id": ticket.id,
            "status": "pending",
            "model": contract.model,
            "url": url,
        }
        reason = f"deferred under shortage (non-core scenario {contract.scenario!r}): {why}"[:300]
        headers = {hdr.DEGRADED: "deferred", hdr.TICKET: ticket.id, "location": url}
        return Dispatched(BackendReply(body=reply), "wait", "", reason, 0.0, headers, status=202)

    async def _complete(
        self,
        ticket_id: str,
        kind: Kind,
        body: dict[str, Any],
        request_id: str,
        contract: RequestContract,
        slot: Slot,
    ) -> None:
        """Retry until an answer or `max_wait_s`; the outcome goes into the ticket. The request id's
        claim (taken when the ticket opened) and the tenant's slot are held until then."""
        owner = contract.tenant or ""
        try:
            await self._retry(ticket_id, kind, body, request_id, contract)
        finally:
            self._inner.decisions.release(request_id, owner)
            slot.release()
            self._update_gauge()

    async def _retry(
        self, ticket_id: str, kind: Kind, body: dict[str, Any], request_id: str, contract: RequestContract
    ) -> None:
        deadline = self._clock() + self._settings.max_wait_s
        store = self.tickets
        while True:
            await self._sleep(self._settings.retry_s)
            remaining = deadline - self._clock()
            try:
                done = await self._inner.dispatch(
                    kind, body, request_id, contract=contract, deadline_s=max(0.1, min(remaining, 30.0))
                )
            except RequestError as exc:
                if _short(exc) and self._clock() + self._settings.retry_s < deadline:
                    continue
                store.finish(ticket_id, exc.status_code, exc)  # scrubbed when the client reads it
                return
            except Exception:  # never lost silently: the ticket says it failed
                log.exception("deferred request %s failed", request_id)
                store.finish(ticket_id, 502, UpstreamError("the deferred request failed inside the gateway"))
                return
            headers = {hdr.ROUTE: done.route, hdr.TARGET: done.target, hdr.DEGRADED: "deferred", **done.headers}
            store.finish(ticket_id, 200, done.reply.body, headers)
            return

    def _remember(self, key: str | None, done: Dispatched) -> Dispatched:
        if key is not None and self.cache is not None and done.status == 200 and done.reply.body is not None:
            self.cache.put(key, {"body": done.reply.body, "route": done.route, "target": done.target})
        return done

    def _cached(self, key: str | None, why: str, contract: RequestContract) -> Dispatched | None:
        """An identical earlier request's answer, while no target can answer (read-only mode), when
        the target that made it could have answered this request."""
        hit = self.cache.get(key) if key is not None and self.cache is not None else None
        if hit is None or not could_have_answered(contract, self._inner.behind(contract.model, hit["target"])):
            return None
        reason = f"served from the response cache (every target is down): {why}"[:300]
        return Dispatched(
            BackendReply(body=hit["body"]), hit["route"], hit["target"], reason, 0.0, {hdr.DEGRADED: "cached"}
        )

    def _count(self, model: str, mode: str) -> None:
        if self._metrics is not None:
            self._metrics.degrade(model, mode)
        self._update_gauge()

    def _update_gauge(self) -> None:
        if self._metrics is not None:
            self._metrics.ticket_counts(self.tickets.pending(), len(self.tickets))

    async def drain(self) -> None:
        """Wait for the background attempts (tests)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
