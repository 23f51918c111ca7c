"""Per-tenant request rate, concurrency limit and monthly spend budget, enforced at the gateway's HTTP edge.

`await TenantLimits.admit(tenant)` runs right after the tenant is authenticated (and its request counted
against its rate, `TenantRates`), before the body is read:

* `tenants[].monthly_budget_usd`: once the tenant's cloud spend this UTC calendar month (the spend
  ledger's rows of its requests, serve_apps/limits/spend_ledger.py) reached the budget, every generation
  request is refused with `402 tenant_budget_exceeded` until the month ends or the budget is raised.
  402 and not 429 because waiting a few seconds cannot help, and OpenAI clients retry a 429 on their
  own (a 402 they do not). The month's spend is the ledger's last reading (at most
  `SpendLedger.month_refresh_s` old, read off the event loop), so requests already running and those
  admitted within that time may take the spend past the budget by what they cost.
* `tenants[].requests_per_minute` (`TenantRates`, on every authenticated route): a fixed one-minute window
  in the shared store (`window_add` with the limit: one atomic store operation), counted by every gateway
  replica together; one more is refused with `429 tenant_rate_limited` and a retry-after of the time
  until the window rolls over. A fixed window, unlike the token bucket it replaces, lets a tenant send
  its minute's worth at the end of one window and again at the start of the next.
* `tenants[].max_concurrent`: at most that many of the tenant's generation requests are in flight at
  once on all gateway replicas together: each holds a lease in the shared store (serve_apps/limits/leases.py:
  renewed in one batch per replica, dropped on release, expired within seconds when a replica dies); one
  more is refused with `429 tenant_concurrency_exceeded` and `retry-after: 1`. A request holds its slot
  until its response is sent — a stream until it ends or the client goes away — and a deferred request
  until its ticket is finished (`keep`).

One code path: the limits always run over a SharedStore — Redis shared by the replicas with `state.url`,
the replica's own MemoryStore without it (one replica), the fallback's MemoryStore while Redis does not
answer (serve_apps/state/fallback.py: each replica then enforces the limits on its own, never a 5xx).
The pure per-replica token bucket (router/limits/rate_limit.py) is no longer used for tenants.

The returned `Slot` is released exactly once: `held(response)` wraps the response so the slot is
given back when it has been sent (or failed); `release()` gives it back at once (a request that
ended before it had a response).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from router.errors import TenantBudgetExceeded, TenantConcurrencyExceeded, TenantRateLimited
from router.request.auth import TenantPolicy
from serve_apps.limits.leases import UNCHECKED, Leases
from serve_apps.state.memory import MemoryStore
from serve_apps.state.store import SharedStore

CONCURRENCY_RETRY_AFTER_S = 1.0  # a slot frees when some request of the tenant ends: no better guess
RATE_WINDOW_S = 60.0  # requests_per_minute: one minute's fixed window


class Slot:
    def __init__(self, release: Callable[[], None] | None = None) -> None:
        self._release = release

    def release(self) -> None:
        release, self._release = self._release, None
        if release is not None:
            release()

    def held(self, response: Response) -> Response:
        """`response`, giving the slot back once it has been sent (or has failed)."""
        return response if self._release is None else _Releasing(response, self.release)


class TenantRates:
    """`tenants[].requests_per_minute` over the shared store: counted by the HTTP edge on every route that
    authenticates (serve_apps/http/edge.py `tenant`), one `window_add` per request."""

    def __init__(self, store: SharedStore | None = None) -> None:
        self._store = store if store is not None else MemoryStore(clock=time.monotonic)

    async def check(self, tenant: TenantPolicy) -> None:
        """Count one request of `tenant`; raises `TenantRateLimited` past its rate."""
        rate = tenant.requests_per_minute
        if not rate:
            return
        counted = await self._store.window_add(f"tenant-rpm:{tenant.name}", 1, rate, RATE_WINDOW_S)
        if not counted.allowed:
            raise TenantRateLimited(
                f"tenant {tenant.name!r} is over its {rate:g} requests per minute",
                retry_after_s=counted.retry_in_s,
            )


class TenantLimits:
    """`spend` answers each tenant's cloud spend this month without blocking (tenant -> USD); `store`
    is where the windows and leases live (None: a MemoryStore of this replica's own)."""

    def __init__(
        self,
        spend: Callable[[], Mapping[str, float]] | None = None,
        *,
        store: SharedStore | None = None,
        leases: Leases | None = None,
    ) -> None:
        self._spend = spend
        self._store = store if store is not None else MemoryStore(clock=time.monotonic)
        self.leases = leases if leases is not None else Leases(self._store)
        self.rates = TenantRates(self._store)

    def inflight(self, tenant: str) -> int:
        """The tenant's requests in flight on this replica (all replicas: `shared_inflight`)."""
        return self.leases.held(_slots_key(tenant))

    async def shared_inflight(self, tenant: str) -> int:
        return await self._store.lease_count(_slots_key(tenant))

    async def admit(self, tenant: TenantPolicy | None) -> Slot:
        """A slot for one generation request of `tenant` (None: auth off, no limits); raises
        `TenantBudgetExceeded` or `TenantConcurrencyExceeded`."""
        if tenant is None:
            return Slot()
        budget = tenant.monthly_budget_usd
        if budget is not None and self._spend is not None:
            spent = self._spend().get(tenant.name, 0.0)
            if spent >= budget:
                raise TenantBudgetExceeded(
                    f"tenant {tenant.name!r} reached its monthly budget of ${budget:,.2f} (${spent:,.2f} spent on "
                    "cloud providers this UTC month): requests are refused until the month ends or "
                    "tenants[].monthly_budget_usd is raised"
                )
        limit = tenant.max_concurrent
        if limit is None:
            return Slot()
        key = _slots_key(tenant.name)
        holder = await self.leases.take(key, limit)
        if holder is None:
            raise TenantConcurrencyExceeded(
                f"tenant {tenant.name!r} already has {limit} requests in flight (tenants[].max_concurrent); "
                "retry when one has finished",
                retry_after_s=CONCURRENCY_RETRY_AFTER_S,
            )
        return Slot(lambda: self.leases.drop(key, holder))

    async def keep(self, name: str) -> Slot:
        """One more request of tenant `name` in flight, without a check: a request already admitted
        that goes on after its answer was sent (a deferred request's ticket, serve_apps/traffic/deferral.py)
        keeps counting against `max_concurrent` until `release`."""
        if not name:
            return Slot()  # auth off: no tenant, no limits
        key = _slots_key(name)
        holder = await self.leases.take(key, UNCHECKED)
        return Slot() if holder is None else Slot(lambda: self.leases.drop(key, holder))

    async def run(self) -> None:
        """Renews this replica's leases (a background loop of the gateway)."""
        await self.leases.run()


def _slots_key(tenant: str) -> str:
    return f"tenant-slots:{tenant}"


class _Releasing(Response):
    """Sends `inner` (a JSON answer or a whole SSE stream), then releases, however it ended."""

    def __init__(self, inner: Response, release: Callable[[], None]) -> None:
        self._inner = inner
        self._release = release
        self.status_code = inner.status_code
        self.background = None
        self.raw_headers = inner.raw_headers

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await self._inner(scope, receive, send)
        finally:
            self._release()
