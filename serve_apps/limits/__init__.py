"""Spend and per-tenant limits on the gateway: the spend ledger that survives restarts and the per-tenant
concurrency limit and monthly budget held against it.

    spend_ledger.py  SpendLedger: cloud spend in SQLite, written off the event loop
    tenants.py       TenantLimits: `tenants[].max_concurrent` and `tenants[].monthly_budget_usd`
    shared_spend.py  SharedSpend: the month's spend of every node, as durable sums in the shared store
"""

# The modules of this wing the rest of serve_apps/ may import: its doors (tests/unit/test_wing_doors.py).
DOORS: tuple[str, ...] = ("spend_ledger", "tenants", "shared_spend")
