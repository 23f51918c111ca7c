"""Spend limits: the soft monthly budget (the cost scorer's weight) and the per-request cost ceiling.

Pure. The spend itself is recorded by the ledger (serve_apps/limits/spend_ledger.py).

The per-request ceiling (`x-spillover-max-cost-usd`, or the scenario's `max_cost_usd`) holds across
every attempt of a request:

    output limit   the client's max_tokens; without one, the target's output limit: its
                   max_output_tokens, else its context window less the prompt estimate
    estimate       prompt ~ x price_in + n x output limit x price_out (router/routing/capabilities.py)
    remaining      ceiling - what the request's earlier attempts cost (their reported usage)

A target whose estimate is above the remaining ceiling is not tried: the pipeline's `cost` filter
removes it before the first attempt (nothing spent yet), and the dispatcher skips a fall-over or a
retry once earlier attempts have spent part of it, with `ceiling_refusal`'s reason in the attempt's
record (and in the error when no candidate is left). A cloud request without max_tokens under a
ceiling carries the output limit its estimate used (`bounded_body`), so the estimate is a bound.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from router.request.contract import RequestContract
from router.routing.capabilities import Target, estimate_cost_usd


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


def usd(value: float) -> str:
    return f"${value:.4f}" if value >= 0.01 else f"${value:.6f}"


def output_limit(contract: RequestContract, target: Target) -> int:
    """Output tokens one choice of an attempt on `target` may produce (see the module docstring);
    the gateway's default max_tokens when the target's limit is unknown too."""
    if contract.max_tokens_given:
        return contract.max_output_tokens
    caps = target.caps
    if caps.max_output_tokens is not None:
        return caps.max_output_tokens
    if caps.context_window > contract.est_prompt_tokens:
        return caps.context_window - contract.est_prompt_tokens
    return contract.max_output_tokens


def attempt_estimate_usd(contract: RequestContract, target: Target) -> float | None:
    """The most one attempt on `target` may cost; None when a price is unknown."""
    return estimate_cost_usd(target.caps, contract.est_prompt_tokens, contract.n * output_limit(contract, target))


def spent_usd(costs: Iterable[float | None]) -> float:
    """What earlier attempts cost (an attempt of unknown cost counts 0)."""
    return sum(c for c in costs if c is not None and c > 0)


def ceiling_refusal(contract: RequestContract, target: Target, spent: float = 0.0) -> str | None:
    """Why `target` may not be tried under the request's cost ceiling after `spent` USD; None: it may."""
    ceiling = contract.max_cost_usd
    if ceiling is None:
        return None
    estimate = attempt_estimate_usd(contract, target)
    if estimate is None:
        return f"prices unknown: cannot check max cost {usd(ceiling)} (configure price_in/out_per_mtok)"
    remaining = ceiling - spent
    if estimate <= remaining:
        return None
    caps = target.caps
    limit = output_limit(contract, target)
    if spent > 0:
        return (
            f"estimated cost {usd(estimate)} > remaining {usd(max(remaining, 0.0))} of max {usd(ceiling)} "
            f"(earlier attempts spent {usd(spent)})"
        )
    choices = f"{contract.n} × " if contract.n > 1 else ""
    return (
        f"estimated cost {usd(estimate)} > max {usd(ceiling)} "
        f"(prompt ~{contract.est_prompt_tokens} × ${caps.price_in_per_mtok:g}/Mtok + "
        f"{choices}max_tokens {limit} × ${caps.price_out_per_mtok:g}/Mtok)"
    )


def bounded_body(body: dict[str, Any], contract: RequestContract, target: Target) -> dict[str, Any]:
    """The body sent to `target`: under a cost ceiling, a cloud request without max_tokens carries the
    output limit its estimate used; otherwise `body` itself."""
    if contract.max_cost_usd is None or contract.max_tokens_given or target.kind == "local":
        return body
    return {**body, "max_tokens": output_limit(contract, target)}
