"""The gateway's tenants, from the config: keys from the environment, policies for router/request/auth.py."""

from __future__ import annotations

import logging
from collections.abc import Mapping

from cluster.config.deployment import SpilloverConfig
from router.request.auth import Authenticator, TenantPolicy

log = logging.getLogger("spillover.auth")


def tenant_policies(config: SpilloverConfig) -> list[TenantPolicy]:
    """What each configured tenant may do (router/request/auth.py), without its key."""
    return [
        TenantPolicy(
            t.name,
            residency=frozenset(t.residency) if isinstance(t.residency, list) else t.residency,
            allowed_providers=None if t.allowed_providers is None else frozenset(t.allowed_providers),
            requests_per_minute=t.requests_per_minute,
            admin=t.admin,
            max_concurrent=t.max_concurrent,
            monthly_budget_usd=t.monthly_budget_usd,
            global_feedback=t.global_feedback,
        )
        for t in config.tenants
    ]


def authenticator_for(config: SpilloverConfig, env: Mapping[str, str]) -> Authenticator | None:
    """The gateway's authenticator when `gateway.auth` is on; keys come from the environment."""
    if not config.gateway.auth:
        return None
    tenants = tenant_policies(config)
    keys = {t.name: env.get(t.api_key_env, "") for t in config.tenants}
    for tenant in config.tenants:
        if not keys[tenant.name]:
            log.warning("tenant %s has no key: environment variable %s is not set", tenant.name, tenant.api_key_env)
    return Authenticator(tenants, keys)
