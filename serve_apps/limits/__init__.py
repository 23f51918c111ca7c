"""Spend and limits on the gateway: the spend ledger that survives restarts, the per-tenant limits held
against it, and the provider quotas — the rate and concurrency limits counted in the store every gateway
replica shares (serve_apps/state/), so N replicas together allow the limit, not N times it.

    spend_ledger.py     SpendLedger: cloud spend in SQLite, written off the event loop
    shared_spend.py     SharedSpend: the month's spend of every node, as durable sums in the shared store
    tenants.py          TenantLimits: `tenants[].max_concurrent` (leases) and `tenants[].monthly_budget_usd`;
                        TenantRates: `tenants[].requests_per_minute` (a shared window)
    leases.py           Leases: this replica's leases, renewed in one batch, dropped on release
    provider_quotas.py  SharedQuotas: `cloud.providers[].rpm` / `.tpm` (shared windows)
"""

# The modules of this wing the rest of serve_apps/ may import: its doors (tests/unit/test_wing_doors.py).
DOORS: tuple[str, ...] = ("spend_ledger", "shared_spend", "tenants", "provider_quotas")
