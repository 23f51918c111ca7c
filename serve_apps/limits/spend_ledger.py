"""Cloud spend: a ledger that survives restarts (SQLite), written off the event loop.

The monthly budget is only meaningful if the month's spend is remembered across gateway
restarts and shared by the gateway's replicas, hence SQLite (stdlib, one file, WAL so several
processes can read while one writes). The file is per node (`spend.ledger`, on the node's disk): the gateway
replicas of one node share it, those of other nodes keep their own; with a shared store (`state.url`) the
budgets read every node's totals from it instead (`shared`, serve_apps/limits/shared_spend.py), and the file
stays the node's row-by-row record. Every attempt gets a row, failed ones included: a
provider may bill a request that timed out on our side, and an operator reconciling the bill
wants to see them.

Spend bookkeeping must never fail a request: write (and read) failures are logged and
counted, not raised (the gateway shows them as `spillover_spend_ledger_failures_total`). Only
an unusable path at start-up is an error (`ConfigError`), because then the operator can fix it
before traffic arrives.

With `background=True` (the gateway) nothing touches SQLite on the caller's thread: `add`
stamps the row and queues it for one writer thread (serve_apps/off_loop/background_writer.py; a full queue
drops the row and counts a write failure), and `recent_month_total()` answers the month's spend
as last read by that thread, asking it to read again when the value is older than
`month_refresh_s`; a failed read keeps the month's last good totals, so a tenant's budget stays
enforced. A locked database (another process inside its busy timeout) or a slow disk therefore never
stalls the event loop that serves requests.

What the month's spend does to routing is pure and lives in router/limits/budget.py (a soft budget, never
a refusal); the hard per-request cap is the contract pipeline's `cost` filter. Rows carry the
tenant (null without auth): `recent_tenant_totals()` is each tenant's spend this month, which
serve_apps/limits/tenants.py holds against `tenants[].monthly_budget_usd` (a refusal). A ledger file
written before the column existed gets it on open.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from router.errors import ConfigError
from serve_apps.limits.shared_spend import SharedSpend
from serve_apps.off_loop.background_writer import BackgroundWriter

log = logging.getLogger("spillover.spend")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS spend (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    at REAL NOT NULL,
    request_id TEXT NOT NULL,
    target_id TEXT NOT NULL,
    provider TEXT NOT NULL,
    outcome TEXT NOT NULL,
    cost_usd REAL NOT NULL,
    tenant TEXT
);
CREATE INDEX IF NOT EXISTS spend_at ON spend (at);
"""
_TENANT_COLUMN = "ALTER TABLE spend ADD COLUMN tenant TEXT"  # ledgers from before per-tenant budgets

# How long a writer waits for another process's transaction before giving up (ms).
_BUSY_TIMEOUT_MS = 5000
_REFRESH = "refresh-month-total"  # a job for the writer thread: read the month's spend again
_Job = tuple[float, str, str, str, str, float, str | None] | str


def month_bounds(now: float) -> tuple[float, float]:
    """[start, end) of the UTC calendar month holding the POSIX time `now`."""
    day = datetime.fromtimestamp(now, UTC)
    start = day.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    end = start.replace(year=start.year + 1, month=1) if start.month == 12 else start.replace(month=start.month + 1)
    return start.timestamp(), end.timestamp()


class SpendLedger:
    """One row per cloud attempt: when, which request, target, provider, outcome, cost.

    `clock` must return POSIX wall time (`time.time`), not a monotonic clock: rows are
    grouped by calendar month and must mean the same after a restart.

    Each write is one short autocommitted statement, so several processes (gateway replicas)
    can share the file; a lock serialises this object's use of its one connection across
    threads.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        clock: Callable[[], float],
        background: bool = False,
        month_refresh_s: float = 10.0,
        shared: SharedSpend | None = None,
    ) -> None:
        self.path = str(path)
        self._clock = clock
        self._lock = threading.Lock()
        self._write_failures = 0
        self.read_failures = 0
        self._closed = False
        self._month_refresh_s = month_refresh_s
        self._shared = shared  # every node's totals, with a shared store (serve_apps/limits/shared_spend.py)
        self._month: tuple[float, float] | None = None  # (read at, total) as last read by the writer
        self._tenants: dict[str, float] = {}  # tenant -> this month's spend, read with _month
        self._month_asked = False
        try:
            if self.path != ":memory:":
                Path(self.path).parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(
                self.path,
                timeout=_BUSY_TIMEOUT_MS / 1000,
                check_same_thread=False,
                isolation_level=None,  # autocommit: each statement is its own short transaction
            )
        except (OSError, sqlite3.Error) as e:
            raise ConfigError(self.path, [("spend ledger", f"cannot open: {e}")]) from e
        try:
            conn.execute(f"PRAGMA busy_timeout = {_BUSY_TIMEOUT_MS}")
            if self.path != ":memory:":
                conn.execute("PRAGMA journal_mode = WAL")
            conn.executescript(_SCHEMA)
            if "tenant" not in {row[1] for row in conn.execute("PRAGMA table_info(spend)")}:
                conn.execute(_TENANT_COLUMN)
        except sqlite3.Error as e:
            conn.close()
            raise ConfigError(self.path, [("spend ledger", f"cannot initialise: {e}")]) from e
        self._conn = conn
        self._writer: BackgroundWriter[_Job] | None = (
            BackgroundWriter(self._run_job, name="spend-ledger") if background else None
        )

    @property
    def write_failures(self) -> int:
        """Rows that could not be written: failed inserts, and rows dropped by a full queue."""
        return self._write_failures + (self._writer.dropped if self._writer is not None else 0)

    def add(
        self, request_id: str, target_id: str, provider: str, outcome: str, cost_usd: float, tenant: str | None = None
    ) -> None:
        """Record one attempt. Never raises: a failed write is logged and counted."""
        row = (self._clock(), request_id, target_id, provider, outcome, cost_usd, tenant)
        if self._shared is not None:
            self._shared.booked(cost_usd, tenant, row[0])
        if self._writer is not None:
            self._writer.submit(row)
        else:
            self._insert(row)

    def recent_month_total(self) -> float:
        """The month's spend without waiting on SQLite in background mode: the writer thread's
        last good reading (0.0 before the first), refreshed when older than `month_refresh_s`; a failed
        read keeps the last good one of the same month. With a shared store: every node's (shared_spend.py)."""
        if self._shared is not None:
            return self._shared.totals()[0]
        if self._writer is None:
            return self.month_total()
        now = self._clock()
        if (self._month is None or now - self._month[0] >= self._month_refresh_s) and not self._month_asked:
            self._month_asked = True
            self._writer.submit(_REFRESH)
        return self._month[1] if self._month is not None else 0.0

    def recent_tenant_totals(self) -> dict[str, float]:
        """Each tenant's spend this month, read like `recent_month_total` (never waits on SQLite in
        background mode; tenants without spend are absent). With a shared store: every node's."""
        if self._shared is not None:
            return self._shared.totals()[1]
        if self._writer is None:
            return self.month_tenant_totals()
        self.recent_month_total()  # asks the writer for a fresh reading of both when stale
        return dict(self._tenants)

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Background mode: wait until every queued row is written. True at once otherwise."""
        return self._writer.flush(timeout_s) if self._writer is not None else True

    def _run_job(self, job: _Job) -> None:
        if job is _REFRESH:
            now, failures = self._clock(), self.read_failures
            tenants, total = self.month_tenant_totals(now), self.month_total(now)
            if self.read_failures == failures:
                self._tenants, self._month = tenants, (now, total)
            elif self._month is not None and month_bounds(self._month[0]) == month_bounds(now):
                # a failed read keeps the month's last good totals (tenant budgets stay enforced) and is
                # tried again after month_refresh_s, like a good one
                self._month = (now, self._month[1])
            else:
                self._tenants, self._month = {}, (now, 0.0)  # nothing good known of this month yet
            self._month_asked = False
        else:
            self._insert(job)  # type: ignore[arg-type]

    def _insert(self, row: tuple[float, str, str, str, str, float, str | None]) -> None:
        at, request_id, target_id, provider, outcome, cost_usd, tenant = row
        with self._lock:
            try:
                self._conn.execute(
                    "INSERT INTO spend (at, request_id, target_id, provider, outcome, cost_usd, tenant) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (at, request_id, target_id, provider, outcome, float(cost_usd), tenant),
                )
                return
            except (sqlite3.Error, ValueError, TypeError) as e:
                self._write_failures += 1
                error = e
        log.warning(
            "spend ledger %s: could not record request %s on %s (%s USD): %s",
            self.path,
            request_id,
            target_id,
            cost_usd,
            error,
        )

    def month_total(self, now: float | None = None) -> float:
        """Spend in the UTC calendar month of `now` (default: the clock). 0.0 when unreadable."""
        start, end = month_bounds(self._clock() if now is None else now)
        row = self._read_one("SELECT COALESCE(SUM(cost_usd), 0.0) FROM spend WHERE at >= ? AND at < ?", (start, end))
        return float(row[0]) if row else 0.0  # type: ignore[arg-type]  # SUM(REAL) is a float

    def month_tenant_totals(self, now: float | None = None) -> dict[str, float]:
        """Spend per tenant in the UTC calendar month of `now`. Empty when unreadable."""
        start, end = month_bounds(self._clock() if now is None else now)
        sql = "SELECT tenant, SUM(cost_usd) FROM spend WHERE at >= ? AND at < ? AND tenant IS NOT NULL GROUP BY tenant"
        return {str(tenant): float(total) for tenant, total in self._read_all(sql, (start, end))}  # type: ignore[arg-type]

    def _read_all(self, sql: str, args: tuple[float, ...]) -> list[tuple[object, ...]]:
        """Run a read; failures are logged and counted: the budget is soft, a request must go on."""
        with self._lock:
            try:
                return self._conn.execute(sql, args).fetchall()
            except sqlite3.Error as e:
                self.read_failures += 1
                error = e
        log.warning("spend ledger %s: read failed: %s", self.path, error)
        return []

    def _read_one(self, sql: str, args: tuple[float, ...]) -> tuple[object, ...] | None:
        rows = self._read_all(sql, args)
        return rows[0] if rows else None

    def close(self) -> None:
        """Close the connection (after the queued rows); later writes count as failures. Safe to
        call twice."""
        if self._writer is not None:
            self._writer.close()
        with self._lock:
            if not self._closed:
                self._closed = True
                self._conn.close()
