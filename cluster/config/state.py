"""The `state:` section: the shared store every gateway replica keeps cross-request state in
(serve_apps/state/, docs/architecture.md "Cross-request state").

With one gateway replica and no `state.url` the store is the replica's own memory. More than one replica
(`gateway.replicas > 1`, or autoscaling to more than one) needs `state.url`, else each replica would admit,
limit and remember on its own: the config is refused, naming the fix (`SpilloverConfig`).
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

from pydantic import Field, field_validator

from cluster.config.base import StrictModel

LOCAL = "local"  # `spillover serve` starts a loopback redis-server of its own (serve_apps/state/local_redis.py)
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")


class StateSection(StrictModel):
    url: str | None = Field(
        None,
        description="the shared store: redis://HOST:PORT/DB (rediss:// for TLS) of a Redis >= 7 every gateway replica "
        "reaches (ray-cluster.yaml starts one on the head), or 'local': `spillover serve` starts a loopback "
        "redis-server of its own (one machine only); null: each replica's own memory, allowed with one gateway "
        "replica only. The password is never in the URL: see password_env",
    )
    password_env: str = Field(
        "SPILLOVER_STATE_PASSWORD",
        description="the environment variable that holds the store's password (unset: no password; with "
        "url 'local' spillover sets it for the replicas it starts)",
    )
    timeout_s: float = Field(
        0.25,
        gt=0,
        le=10,
        description="longest wait for one store operation; past it the replica serves from its own memory until "
        "the store answers again (checked every retry_s)",
    )
    retry_s: float = Field(1.0, gt=0, le=60, description="how often a replica pings a store that stopped answering")

    @field_validator("url")
    @classmethod
    def _redis_url(cls, value: str | None) -> str | None:
        if value is None or value == LOCAL:
            return value
        parts = urlsplit(value)
        if parts.scheme not in ("redis", "rediss"):
            raise ValueError(f"not a Redis URL (redis://HOST:PORT/DB, rediss://..., or 'local'): {value[:200]!r}")
        if parts.password is not None:
            raise ValueError("the URL holds a password: put it in the environment variable state.password_env names")
        if not parts.hostname:
            raise ValueError("the URL names no host (redis://HOST:PORT/DB)")
        try:
            parts.port  # noqa: B018 (raises on a port that is not a number or out of range)
        except ValueError as exc:
            raise ValueError(f"bad port: {exc}") from None
        return value

    @field_validator("password_env")
    @classmethod
    def _env_name(cls, value: str) -> str:
        if not _ENV_NAME.fullmatch(value):
            raise ValueError("not an environment variable name (letters, digits and _, not starting with a digit)")
        return value
