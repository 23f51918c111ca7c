"""Per-tenant concurrency limit and monthly spend budget, enforced at the gateway's HTTP edge.

`TenantLimits.admit(tenant)` runs right after the tenant is authenticated, before the body is read:

* `tenants[].monthly_budget_usd`: once the tenant's cloud spend this UTC calendar month (the spend
  ledger's rows of its requests, serve_apps/limits/spend_ledger.py) reached the budget, every generation
  request is refused with `402 tenant_budget_exceeded` until the month ends or the budget is raised.
  402 and not 429 because waiting a few seconds cannot help, and OpenAI clients retry a 429 on their
  own (a 402 they do not). The month's spend is the ledger's last reading (at most
  `SpendLedger.month_refresh_s` old, read off the event loop), so requests already running and those
  admitted within that time may take the spend past the budget by what they cost.
* `tenants[].max_concurrent`: at most that many of the tenant's generation requests are in flight
  at once on this gateway replica; one more is refused with `429 tenant_concurrency_exceeded` and
  `retry-after: 1`. A request holds its slot until its response is sent — a stream until it ends or
  the client goes away — and a deferred request until its ticket is finished (`keep`).

The returned `Slot` is released exactly once: `held(response)` wraps the response so the slot is
given back when it has been sent (or failed); `release()` gives it back at once (a request that
ended before it had a response).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from router.errors import TenantBudgetExceeded, TenantConcurrencyExceeded
from router.request.auth import TenantPolicy

CONCURRENCY_RETRY_AFTER_S = 1.0  # a slot frees when some request of the tenant ends: no better guess


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


class TenantLimits:
    """`spend` answers each tenant's cloud spend this month without blocking (tenant -> USD)."""

    def __init__(self, spend: Callable[[], Mapping[str, float]] | None = None) -> None:
        self._spend = spend
        self._inflight: Counter[str] = Counter()

    def inflight(self, tenant: str) -> int:
        return self._inflight[tenant]

    def admit(self, tenant: TenantPolicy | None) -> Slot:
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
        if self._inflight[tenant.name] >= limit:
            raise TenantConcurrencyExceeded(
                f"tenant {tenant.name!r} already has {limit} requests in flight (tenants[].max_concurrent); "
                "retry when one has finished",
                retry_after_s=CONCURRENCY_RETRY_AFTER_S,
            )
        self._inflight[tenant.name] += 1
        return Slot(lambda: self._leave(tenant.name))

    def keep(self, name: str) -> Slot:
        """One more request of tenant `name` in flight, without a check: a request already admitted
        that goes on after its answer was sent (a deferred request's ticket, serve_apps/traffic/deferral.py)
        keeps counting against `max_concurrent` until `release`."""
        if not name:
            return Slot()  # auth off: no tenant, no limits
        self._inflight[name] += 1
        return Slot(lambda: self._leave(name))

    def _leave(self, name: str) -> None:
        self._inflight[name] -= 1
        if self._inflight[name] <= 0:
            del self._inflight[name]


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
