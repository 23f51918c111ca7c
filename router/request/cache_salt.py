"""Per-tenant prefix-cache isolation: vLLM's `cache_salt`, set by the gateway.

With prefix caching, a prompt whose prefix is already cached starts answering sooner. A tenant
that times its own requests could therefore learn whether ANOTHER tenant recently sent a given
prefix (a system prompt, a document): a cross-tenant side channel. vLLM keys cached blocks by the
request's `cache_salt` too (OpenAI chat and completions requests, vLLM >= 0.9; ray.serve.llm
passes the request object, field included, to the engine), so requests with different salts never
share cached blocks.

    auth on    every local request's `cache_salt` is derived from its tenant; a salt the client
               sent is folded in (it can split its own cache further, never reach another
               tenant's): sha256("spillover-tenant", tenant, client salt) as 64 hex characters
    auth off   no tenants to isolate: a client's `cache_salt` goes to the engine as sent, once
               checked against vLLM's rule (1-128 characters, no '@', '/', '\\' or NUL; 400
               `invalid_request` otherwise, not the engine's 500)

The salt is not a secret: clients cannot choose it (the gateway overwrites theirs), so knowing
how it is made does not let one tenant share another's cache. Cloud providers never receive it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

from router.errors import InvalidRequest

FIELD = "cache_salt"
MAX_SALT_CHARS = 128
_FORBIDDEN = frozenset("@/\\\x00")


def tenant_salt(tenant: str, client_salt: object = None) -> str:
    digest = hashlib.sha256()
    for part in ("spillover-tenant", tenant, client_salt if isinstance(client_salt, str) else ""):
        digest.update(part.encode("utf-8", "surrogatepass") + b"\x00")
    return digest.hexdigest()


def _check_client_salt(salt: object) -> None:
    if salt is None:
        return
    if not isinstance(salt, str) or not 1 <= len(salt) <= MAX_SALT_CHARS or _FORBIDDEN & set(salt):
        raise InvalidRequest(
            f"{FIELD} must be a string of 1-{MAX_SALT_CHARS} characters without '@', '/', '\\' or NUL",
            param=FIELD,
        )


def salted(body: Mapping[str, Any], tenant: str | None) -> dict[str, Any]:
    """The body a local engine gets: with the tenant's salt when there is a tenant (auth on)."""
    client_salt = body.get(FIELD)
    if tenant is None:
        _check_client_salt(client_salt)
        return dict(body)
    return {**body, FIELD: tenant_salt(tenant, client_salt)}
