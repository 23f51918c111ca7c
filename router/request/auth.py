"""Gateway authentication: tenants, their API keys, and what a tenant's policy narrows.

Each tenant may carry a `requests_per_minute` limit: the gateway counts it in the store its replicas share,
right after authentication (serve_apps/limits/tenants.py `TenantRates`; 429 tenant_rate_limited with
Retry-After). Keys are read from the environment variables the config names (never from the config file)
and compared in constant time: every configured key is checked, with `hmac.compare_digest`
over SHA-256 digests, whatever matches. A tenant carries its residency and allowed providers;
they narrow the request's contract exactly as the `x-spillover-*` headers do (never widen it).
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from router.errors import Unauthorized
from router.request.contract import RequestContract
from router.request.contract_headers import Residency, narrow_residency


@dataclass(frozen=True)
class TenantPolicy:
    name: str
    residency: Residency = "any"
    allowed_providers: frozenset[str] | None = None
    requests_per_minute: float | None = None  # counted across replicas (serve_apps/limits/tenants.py)
    admin: bool = False  # may call the operator endpoints (POST /v1/spillover/resilience/reset)
    max_concurrent: int | None = None  # generation requests in flight at once (serve_apps/limits/tenants.py)
    monthly_budget_usd: float | None = None  # cloud spend per UTC month (serve_apps/limits/tenants.py)
    global_feedback: bool = False  # its feedback moves every tenant's routing, not only its own (as an admin's)

    @property
    def shares_feedback(self) -> bool:
        """Whether its feedback moves every tenant's routing (router/learning/quality.py,
        router/request/typing_rules.py)."""
        return self.admin or self.global_feedback


def _digest(text: str) -> bytes:
    return hashlib.sha256(text.encode()).digest()


class Authenticator:
    """Maps `Authorization: Bearer <key>` to a tenant. `keys` holds tenant name -> key."""

    def __init__(self, tenants: Sequence[TenantPolicy], keys: Mapping[str, str]) -> None:
        by_name = {t.name: t for t in tenants}
        self._entries = [(_digest(key), by_name[name]) for name, key in keys.items() if key and name in by_name]

    def authenticate(self, authorization: str | None) -> TenantPolicy:
        scheme, _, given = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not given.strip():
            raise Unauthorized("missing API key: send `Authorization: Bearer <key>`")
        wanted = _digest(given.strip())
        found: TenantPolicy | None = None
        for digest, tenant in self._entries:  # no early exit: the time does not depend on the match
            if hmac.compare_digest(digest, wanted):
                found = tenant
        if found is None:
            raise Unauthorized("invalid API key")
        return found


def narrow_for_tenant(contract: RequestContract, tenant: TenantPolicy) -> RequestContract:
    providers = contract.allowed_providers
    if tenant.allowed_providers is not None:
        providers = tenant.allowed_providers if providers is None else providers & tenant.allowed_providers
    return replace(
        contract,
        residency=narrow_residency(tenant.residency, contract.residency),
        allowed_providers=providers,
        tenant=tenant.name,
    )
