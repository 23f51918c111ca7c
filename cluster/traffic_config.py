"""The `traffic:` section of the deployment config: graded switches, their sharing between gateway
replicas, and the deferred requests of the degradation tiers (router/migration.py, router/tiers.py,
router/tickets.py)."""

from __future__ import annotations

from pydantic import Field, model_validator

from cluster.config_base import StrictModel


class MigrationSection(StrictModel):
    steps: list[float] = Field(
        [0.01, 0.05, 0.25, 0.5, 1.0],
        min_length=1,
        description="shares of the old target's traffic a switch moves to the new one, step by step; the last is 1.0",
    )
    step_s: float = Field(
        30.0, ge=0, le=3600, description="each step is held at least this long (a switch may shorten it)"
    )
    min_requests: int = Field(
        5, ge=1, le=10_000, description="outcomes of the new target a step needs before its gates judge it"
    )
    max_error_delta: float = Field(
        0.05, ge=0, le=1, description="error gate: the new target's error ratio may exceed the old one's by this much"
    )
    latency_factor: float = Field(1.8, ge=1, description="latency gate: new p95 at most this times the old p95")
    max_violation_delta: float = Field(
        0.05, ge=0, le=1, description="contract gate: output-contract violation ratio, new minus old, at most this"
    )
    stagger_share: float = Field(
        0.5, gt=0, le=1, description="share of the gateway replicas that adopt a switch at once; the rest follow"
    )
    stagger_s: float = Field(10.0, ge=0, le=3600, description="how much later the other gateway replicas adopt it")
    dry_run_timeout_s: float = Field(
        30.0, gt=0, le=300, description="the standby's dry-run answer must come within this"
    )

    @model_validator(mode="after")
    def _steps(self) -> MigrationSection:
        steps = self.steps
        if steps != sorted(set(steps)) or steps[0] <= 0 or steps[-1] != 1.0:
            raise ValueError("migration.steps must be ascending shares in (0, 1] ending with 1.0")
        return self


class TicketSection(StrictModel):
    enabled: bool = Field(True, description="defer non-core requests under shortage (202 + ticket); off: shed them")
    max_entries: int = Field(1000, ge=1, le=1_000_000, description="tickets kept per gateway replica")
    max_bytes: int = Field(64 * 1024 * 1024, ge=1024, description="bytes of stored answers kept per gateway replica")
    ttl_s: float = Field(600.0, gt=0, description="a finished ticket's answer is kept this long")
    max_wait_s: float = Field(300.0, gt=0, description="a deferred request is retried this long, then fails")
    retry_s: float = Field(2.0, gt=0, le=60, description="pause between the background attempts of a deferred request")


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
