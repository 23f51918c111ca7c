"""The `traffic:` section of the deployment config: graded switches, their sharing between gateway
replicas, and the deferred requests of the degradation tiers (router/traffic/migration.py, router/resilience/tiers.py,
router/traffic/tickets.py)."""

from __future__ import annotations

from pydantic import Field

from cluster.config.base import StrictModel
from router.traffic.migration import Gates


class MigrationSection(Gates):
    # the gates of a graded switch (router/traffic/migration.py) and how it is staggered and dry-run
    stagger_share: float = Field(
        0.5, gt=0, le=1, description="share of the gateway replicas that adopt a switch at once; the rest follow"
    )
    stagger_s: float = Field(10.0, ge=0, le=3600, description="how much later the other gateway replicas adopt it")
    dry_run_timeout_s: float = Field(
        30.0, gt=0, le=300, description="the standby's dry-run answer must come within this"
    )


class TicketSection(StrictModel):
    enabled: bool = Field(True, description="defer non-core requests under shortage (202 + ticket); off: shed them")
    max_entries: int = Field(1000, ge=1, le=1_000_000, description="tickets kept per gateway replica")
    max_bytes: int = Field(64 * 1024 * 1024, ge=1024, description="bytes of stored answers kept per gateway replica")
    ttl_s: float = Field(600.0, gt=0, description="a finished ticket's answer is kept this long")
    max_wait_s: float = Field(300.0, gt=0, description="a deferred request is retried this long, then fails")
    retry_s: float = Field(2.0, gt=0, le=60, description="pause between the background attempts of a deferred request")
    tenant_share: float = Field(
        0.25,
        gt=0,
        le=1,
        description="most of max_entries and of max_bytes one tenant's tickets may hold (with gateway.auth; "
        "without it every request is one tenant's): past it that tenant's next deferred request is shed, "
        "never another tenant's",
    )


class CacheSection(StrictModel):
    enabled: bool = Field(
        False, description="keep recent answers and serve an identical request's answer when every target is down"
    )
    max_entries: int = Field(1000, ge=1, le=1_000_000, description="answers kept per gateway replica")
    max_bytes: int = Field(16 * 1024 * 1024, ge=1024, description="bytes of answers kept per gateway replica")
    ttl_s: float = Field(600.0, gt=0, description="an answer older than this is never served")


class TrafficSection(StrictModel):
    sync_period_s: float = Field(
        1.0,
        gt=0,
        le=60,
        description="gateway replicas read the shared operator controls (and report rollbacks) this often",
    )
    migration: MigrationSection = Field(MigrationSection(), description="graded switches: steps, gates, staggering")
    tickets: TicketSection = Field(TicketSection(), description="deferred non-core requests (degradation tiers)")
    cache: CacheSection = Field(
        CacheSection(), description="read-only answers when every target is down (off by default)"
    )
