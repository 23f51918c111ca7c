"""Spend and per-tenant limits on the gateway: the spend ledger that survives restarts and the per-tenant
concurrency limit and monthly budget held against it.

    spend_ledger.py  SpendLedger: cloud spend in SQLite, written off the event loop
    tenants.py       TenantLimits: `tenants[].max_concurrent` and `tenants[].monthly_budget_usd`
"""
