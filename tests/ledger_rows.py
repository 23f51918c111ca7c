"""Read a spend ledger's SQLite file the way an operator would (the gateway itself only needs monthly totals)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from serve_apps.limits.spend_ledger import SpendLedger


def spend_by_provider(ledger: SpendLedger, since: float) -> dict[str, float]:
    """Spend per provider from `since` (POSIX time) on, after the ledger's queued writes."""
    ledger.flush()
    with sqlite3.connect(Path(ledger.path)) as conn:
        rows = conn.execute("SELECT provider, SUM(cost_usd) FROM spend WHERE at >= ? GROUP BY provider", (since,))
        return {str(provider): float(total) for provider, total in rows}
