"""The month's cloud spend summed across every node: the spend ledger's cluster-wide totals.

The SQLite ledger (serve_apps/limits/spend_ledger.py) stays each node's row-by-row record, for reconciling a
provider's bill. With a shared store (`state.url`) each booked cost is also added to durable sums in it — the
month's total and each tenant's, under `spend:<YYYY-MM>` (UTC), no TTL: Redis keeps them in its append-only
file — and the budgets read those sums, so the monthly budget and `tenants[].monthly_budget_usd` see the spend
of every node, not only their own node's.

Never on the request path: a booking adds to this replica's view at once and sends the sums off in a task; the
view is read again every `refresh_s`, in a task. While the store does not answer, the fallback store keeps the
sums and adds them when it is back (serve_apps/state/fallback.py), and this view keeps the last good totals
plus what this replica booked since, so a tenant's budget stays enforced through an outage.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime
from typing import Any

from serve_apps.state.store import SharedStore
from serve_apps.state.timing import off_path

log = logging.getLogger("spillover.spend")

TOTAL = "total"
TENANT = "tenant:"


def month_key(now: float) -> str:
    return "spend:" + datetime.fromtimestamp(now, UTC).strftime("%Y-%m")


class SharedSpend:
    def __init__(
        self,
        store: SharedStore,
        *,
        clock: Callable[[], float],
        refresh_s: float = 10.0,
        store_up: Callable[[], bool] = lambda: True,
    ) -> None:
        self._store = store
        self._clock = clock  # POSIX wall time: months are calendar months
        self._refresh_s = refresh_s
        self._store_up = store_up
        self._month = ""
        self._total = 0.0
        self._tenants: dict[str, float] = {}
        self._read_at: float | None = None
        self._reading = False
        self._tasks: set[asyncio.Task[None]] = set()

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        try:
            task = asyncio.get_running_loop().create_task(work, context=off_path())
        except RuntimeError:  # no event loop (a synchronous caller): the sums go unsent from here
            work.close()
            return
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _roll(self, now: float) -> None:
        month = month_key(now)
        if month != self._month:
            self._month, self._total, self._tenants, self._read_at = month, 0.0, {}, None

    def booked(self, cost_usd: float, tenant: str | None, at: float) -> None:
        """One attempt's cost: in this replica's view at once, in the shared sums soon."""
        if cost_usd <= 0:
            return
        self._roll(at)
        self._total += cost_usd
        amounts = {TOTAL: cost_usd}
        if tenant:
            self._tenants[tenant] = self._tenants.get(tenant, 0.0) + cost_usd
            amounts[TENANT + tenant] = cost_usd
        self._spawn(self._send(month_key(at), amounts))

    async def _send(self, key: str, amounts: dict[str, float]) -> None:
        try:
            await self._store.add_amounts(key, amounts)
        except Exception:  # the fallback store never raises for an outage: anything here is a bug, logged
            log.exception("spend not added to the shared sums (%s)", key)

    def totals(self) -> tuple[float, dict[str, float]]:
        """This month's total and per-tenant spend, every node's; read again in the background when stale."""
        now = self._clock()
        self._roll(now)
        stale = self._read_at is None or now - self._read_at >= self._refresh_s
        if stale and not self._reading and self._store_up():
            self._reading = True
            self._spawn(self._read(self._month))
        return self._total, dict(self._tenants)

    async def _read(self, month: str) -> None:
        try:
            sums = await self._store.amounts(month)
            if month == self._month and self._store_up():  # not a partial answer from the fallback's memory
                self._total = max(self._total, sums.get(TOTAL, 0.0))
                tenants = {k.removeprefix(TENANT): v for k, v in sums.items() if k.startswith(TENANT)}
                self._tenants = {t: max(v, self._tenants.get(t, 0.0)) for t, v in tenants.items()} | {
                    t: v for t, v in self._tenants.items() if t not in tenants
                }
                self._read_at = self._clock()
        except Exception:
            log.exception("shared spend sums not read (%s)", month)
        finally:
            self._reading = False
