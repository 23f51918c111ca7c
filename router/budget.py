"""The soft monthly budget: what the month's cloud spend does to the cost scorer's weight.

Pure. The spend itself is recorded by the ledger (serve_apps/spend_ledger.py).
"""

from __future__ import annotations


def cost_weight(
    month_total: float,
    monthly_budget_usd: float | None,
    *,
    base_weight: float,
    max_factor: float = 4.0,
) -> float:
    """The cost scorer's weight under a soft monthly budget.

    Spending is not refused when the budget runs out (a refusal would turn a bookkeeping limit
    into an outage); instead cost counts more and more in the ranking, so cheaper targets win
    sooner. Up to 50% of the budget: `base_weight`; 50% → 100%: linear up to
    `base_weight × max_factor`; beyond: stays there. No budget (None or <= 0): `base_weight`.
    """
    if monthly_budget_usd is None or monthly_budget_usd <= 0:
        return base_weight
    used = month_total / monthly_budget_usd
    if used <= 0.5:
        return base_weight
    ramp = min(1.0, (used - 0.5) / 0.5)
    return base_weight * (1.0 + (max_factor - 1.0) * ramp)
