"""The `gateway:`, `tenants:` and `state:` sections of the deployment config: where the gateway listens, how
many replicas it runs, who may call it (nothing listens beyond loopback without auth), and the shared store its
replicas keep cross-request state in (serve_apps/state/, docs/architecture.md "Cross-request state").

With one gateway replica and no `state.url` the store is the replica's own memory. More than one replica
(`gateway.replicas > 1`, or autoscaling to more than one) needs `state.url`, else each replica would admit,
limit and remember on its own: the config is refused, naming the fix (`SpilloverConfig`)."""

from __future__ import annotations

import re
from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, field_validator, model_validator

from cluster.config.base import StrictModel, is_loopback


class GatewayAutoscaling(StrictModel):
    """Serve autoscaling of the gateway deployment (replaces `gateway.replicas` when set)."""

    min_replicas: int = Field(1, ge=1, description="fewest gateway replicas")
    max_replicas: int = Field(4, ge=1, description="most gateway replicas (at least min_replicas)")
    target_ongoing_requests: float = Field(64, gt=0, description="per gateway replica")

    @model_validator(mode="after")
    def _bounds(self) -> GatewayAutoscaling:
        if self.max_replicas < self.min_replicas:
            raise ValueError("max_replicas must be >= min_replicas")
        return self


class CheckSection(StrictModel):
    workers: int = Field(
        2,
        ge=1,
        le=64,
        description="threads per gateway replica that check client JSON Schemas (deriving the contract of a "
        "request with tools or a response_format, validating answers); as many again derive the other requests' "
        "contracts, so those never queue behind schema work",
    )
    per_tenant: int = Field(
        1,
        ge=1,
        le=64,
        description="checks of one tenant running at once in each pool (with gateway.auth; without it the whole "
        "pool): the tenant's others wait in its own queue, and a freed thread goes round-robin to the waiting tenants",
    )


class HttpLimits(StrictModel):
    """What the HTTP server in front of the gateway accepts before any route runs (Ray Serve's proxy, the
    cloud simulator): serve_apps/http/limits.py enforces it where the bytes arrive, docs/security.md says
    where each bound holds."""

    max_header_bytes: int = Field(
        64 * 1024, ge=1024, le=16 * 1024 * 1024, description="a request's line and headers together; more: 431"
    )
    max_headers: int = Field(100, ge=8, le=10_000, description="header fields in one request; more: 431")
    header_timeout_s: float = Field(
        10,
        gt=0,
        le=600,
        description="a request's line and headers must arrive within this, counted from the connection's opening "
        "(or a kept-alive connection's next byte); later: 408 and the connection closed",
    )
    body_timeout_s: float = Field(
        60,
        gt=0,
        le=3600,
        description="a request's whole body must arrive within this after its headers; later: 408 (or the "
        "connection closed, once an answer has begun)",
    )
    idle_timeout_s: int = Field(
        30,
        ge=1,
        le=3600,
        description="a kept-alive connection with no request on it is closed after this many seconds (behind a "
        "load balancer, set it above the balancer's own idle timeout)",
    )


class GatewaySection(StrictModel):
    host: str = Field(
        "127.0.0.1",
        description="Serve HTTP listener address; a host that is not a loopback address needs gateway.auth: true "
        "(the config is refused otherwise)",
    )
    port: int = Field(8000, ge=1, le=65535, description="Serve HTTP listener port")
    direct_port: int | None = Field(
        None,
        ge=1,
        le=65535,
        description="each gateway replica also serves the gateway on this port of gateway.host itself, without "
        "Serve's proxy (shared by a node's gateway replicas: SO_REUSEPORT; a stopping replica closes it first and "
        "drains, docs/architecture.md); same auth and http_limits; null: off",
    )
    replicas: int = Field(1, ge=1, description="gateway replicas behind Serve's proxy (without autoscaling)")
    resources: dict[str, float] = Field(
        {},
        description="Ray custom resources each gateway replica needs, which places the replicas on the nodes that "
        "declare them (ray-cluster.yaml gives the head `spillover_gateway`: configs/gpu.yaml's replicas, and so "
        "their direct_port, run there, one address for clients); {}: any node",
    )
    num_cpus: float = Field(0.1, gt=0, description="Ray logical CPUs per gateway replica")
    request_timeout_s: float = Field(
        300,
        gt=0,
        description="longest wait for an answer (or a stream's first byte), the contract's schema checks, waiting "
        "room and attempts included; then 504 request_timeout",
    )
    readiness_timeout_s: float = Field(
        600, gt=0, description="how long `spillover serve` and `spillover deploy` wait for /readyz"
    )
    decisions_kept: int = Field(1000, ge=1, description="decision records kept in memory per gateway replica")
    decisions_log: str | None = Field(None, description="also append every decision record to this JSONL file")
    decisions_max_bytes: int = Field(
        64 * 1024 * 1024, ge=1024, description="decision records kept in memory, at most this many bytes of JSON"
    )
    decisions_ttl_s: float = Field(
        86400.0,
        gt=0,
        le=30 * 86400,
        description="each finished decision record (and its feedback) is also kept this long in the shared store "
        "(state.url), where every gateway replica finds it; a record over the store's value bound stays local",
    )
    auth: bool = Field(False, description="require `Authorization: Bearer <tenant key>` on /v1/*")
    autoscaling: GatewayAutoscaling | None = Field(
        None, description="Serve autoscaling of the gateway instead of a fixed gateway.replicas; null: fixed"
    )
    max_body_bytes: int = Field(8 * 1024 * 1024, ge=1024, description="largest request body; larger: 413")
    checks: CheckSection = Field(
        CheckSection(), description="threads for the CPU-bound request checks, shared fairly by tenants"
    )
    http_limits: HttpLimits = Field(
        HttpLimits(), description="header size and count, and slow or idle clients, bounded where HTTP is served"
    )

    @field_validator("resources")
    @classmethod
    def _custom_resources_only(cls, value: dict[str, float]) -> dict[str, float]:
        for name, amount in value.items():
            reserved = name in ("CPU", "GPU", "memory", "object_store_memory")
            if reserved or not re.fullmatch(r"[A-Za-z_][\w.-]{0,63}", name):
                raise ValueError(f"gateway.resources: {name!r} is not a custom resource name (CPUs: gateway.num_cpus)")
            if not 0 < amount <= 10_000:
                raise ValueError(f"gateway.resources.{name}: {amount} is not in (0, 10000]")
        return value

    @model_validator(mode="after")
    def _direct_port_apart_from_the_proxy(self) -> GatewaySection:
        if self.direct_port is not None and self.direct_port == self.port:
            raise ValueError(
                f"gateway.direct_port {self.direct_port} is gateway.port, where Serve's proxy listens: "
                "pick another port"
            )
        return self

    @model_validator(mode="after")
    def _no_open_listener_without_auth(self) -> GatewaySection:
        if not self.auth and not is_loopback(self.host):
            raise ValueError(
                f"gateway.host {self.host!r} is not a loopback address and gateway.auth is off: anyone who "
                "reaches the port could use the models and the operator endpoints. Fix: set gateway.auth: true "
                "with tenants (keys from tenants[].api_key_env), or gateway.host: 127.0.0.1"
            )
        return self


class Tenant(StrictModel):
    """A client of the gateway: its key (from the environment) and what its data may do."""

    name: str = Field(
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$",
        description="decision records and idempotency keys are scoped by it",
    )
    api_key_env: str = Field(
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        description="environment variable holding its key on the gateway's node (never in the file)",
    )
    residency: Literal["any", "local_only"] | list[str] = Field(
        "any",
        description="any, local_only or the regions its data may be processed in; narrows every request like "
        "x-spillover-residency",
    )
    allowed_providers: list[str] | None = Field(
        None, description="cloud providers its requests may use (like x-spillover-providers); null: any"
    )
    requests_per_minute: float | None = Field(
        None,
        ge=1,
        description="requests per minute on every authenticated route, all gateway replicas together (a one-minute "
        "window in the state store), at least 1; over it: 429 tenant_rate_limited with Retry-After; null: unlimited",
    )
    admin: bool = Field(
        False,
        description="may call the operator routes: /v1/spillover/resilience (and its reset), /v1/spillover/cluster",
    )
    max_concurrent: int | None = Field(
        None,
        ge=1,
        strict=True,
        description="generation requests of this tenant in flight at once on all gateway replicas together (a "
        "stream counts until it ends; a lease in the state store, freed within seconds of a replica dying); over "
        "it: 429 tenant_concurrency_exceeded with Retry-After; null: unlimited",
    )
    monthly_budget_usd: float | None = Field(
        None,
        gt=0,
        strict=True,
        allow_inf_nan=False,
        description="cloud spend of this tenant per UTC calendar month (from the spend ledger); once reached: "
        "402 tenant_budget_exceeded until the month ends; null: unlimited",
    )
    global_feedback: bool = Field(
        False,
        description="its POST /v1/spillover/feedback verdicts and labels move every tenant's routing and typing "
        "(each tenant's weighted down to learning.quality.max_feedback_per_tenant), as an admin tenant's do; "
        "false: they move only its own requests",
    )


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
        0.5,
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
