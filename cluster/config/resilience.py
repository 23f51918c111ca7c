"""The `resilience:` and `spend:` sections of the deployment config.

Defaults follow common practice: retries ≤ ~10% of requests (gRPC retry throttling), backoff with
full jitter, breakers that need a minimum count before they judge, probes at 10 s / 30 s /
5 min, yellow moving ~30% of new requests away, recovery after a short cool-down through a half-open
phase (a few live trials, probes every 5 s), then a 20% → 50% → 100% ramp (router/resilience/health.py).
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator

from cluster.config.base import StrictModel
from router.resilience.breaker import BreakerSettings
from router.resilience.health import HealthSettings


class GoldenProbe(StrictModel):
    """Health L3 (correctness) for one local model: a prompt whose answer must match `expect`."""

    prompt: str = Field(min_length=1, description="the probe's user message")
    expect: str = Field(min_length=1, description="case-insensitive regular expression the answer must match")
    max_tokens: int = Field(16, ge=1, le=256, description="max_tokens of the probe's request")

    @field_validator("expect")
    @classmethod
    def _compiles(cls, value: str) -> str:
        try:
            re.compile(value)
        except re.error as exc:
            raise ValueError(f"not a regular expression: {exc}") from None
        return value


class ProviderProbe(StrictModel):
    """The one-message chat a cloud provider's latency probe sends. The defaults are what any capable
    chat model accepts: no temperature (some reasoning models refuse anything but their own) and room
    for a short answer (some refuse a budget of a single token)."""

    prompt: str = Field(
        "Reply with the word OK.", min_length=1, max_length=2000, description="the probe's user message"
    )
    max_tokens: int | None = Field(16, ge=1, le=256, description="max_tokens of the probe's request; null: not sent")
    temperature: float | None = Field(
        None, ge=0, le=2, description="temperature of the probe's request; null: not sent"
    )


def _cost_only() -> list[Literal["quality", "cost", "latency"]]:
    return ["cost"]


class RetrySection(StrictModel):
    max_attempts: int = Field(3, ge=1, le=10, description="attempts per request, the first one included")
    backoff_base_s: float = Field(0.1, gt=0, description="full jitter: uniform(0, min(cap, base * 2^n))")
    backoff_cap_s: float = Field(2.0, gt=0, description="longest backoff (never shorter than Retry-After)")
    budget_ratio: float = Field(0.1, ge=0, le=1, description="gateway-wide: retries per request (token bucket)")
    budget_min_per_s: float = Field(1.0, ge=0, description="retries per second always allowed")
    budget_window_s: float = Field(10.0, gt=0, description="deposits older than this expire")
    max_retry_after_s: float = Field(
        300.0, gt=0, description="a provider's Retry-After is capped at this (cool-down, backoff, client header)"
    )
    retry_after_wait_max_s: float = Field(
        2.0,
        ge=0,
        le=60,
        description="a 429 whose Retry-After is at most this (and fits the request's deadline) is waited out on the "
        "same target, for the scenario strategies of retry_after_wait_strategies; 0: always fail over at once",
    )
    retry_after_wait_strategies: list[Literal["quality", "cost", "latency"]] = Field(
        default_factory=_cost_only,
        description="scenario strategies that wait out a short Retry-After on the same target (cheaper, keeps the "
        "target); the others fail over at once",
    )


BreakerSection = BreakerSettings  # the router's breaker settings are the config section


class HealthSection(HealthSettings):
    # the health state machine's settings (router/resilience/health.py) and the probe schedule

    liveness_probe_s: float = Field(10.0, gt=0, description="L1: is the target reachable at all")
    latency_probe_s: float = Field(30.0, gt=0, description="L2: a tiny prompt within latency_slo_s")
    correctness_probe_s: float = Field(300.0, gt=0, description="L3: a golden prompt with a known answer")
    latency_slo_s: float = Field(5.0, gt=0, description="an L2 probe slower than this failed")
    probe_timeout_s: float = Field(10.0, gt=0, description="a probe without an answer this long failed")
    recovery_probe_s: float = Field(
        5.0, gt=0, description="liveness and latency probes of a red target run this often (when shorter)"
    )
    stale_red_s: float = Field(
        30.0,
        ge=0,
        description="every replica's stats stale this long past telemetry.max_age_s: red (shorter staleness "
        "only diverts traffic while it lasts)",
    )


class IdempotencySection(StrictModel):
    ttl_s: float = Field(
        600.0, gt=0, description="how long a completed answer is replayed for its key (and an in-progress marker kept)"
    )
    max_entries: int = Field(
        10_000, ge=1, description="unused: the answers live in the shared store, bounded by its bytes (state)"
    )
    max_bytes: int = Field(
        64 * 1024 * 1024,
        ge=1024,
        description="one stored answer's bytes (a stream: its events); larger ones are not kept",
    )
    wait_s: float = Field(300.0, gt=0, description="a non-streamed repeat of an in-flight key waits this long for it")


class ResilienceSection(StrictModel):
    retry: RetrySection = Field(
        RetrySection(), description="attempts per request, backoff and the gateway-wide retry budget"
    )
    breaker: BreakerSection = Field(
        BreakerSection(),
        description="circuit breakers per target and per failure domain (a domain opens on failures from at least "
        "2 of its targets, or at once on a 429)",
    )
    health: HealthSection = Field(
        HealthSection(), description="the health state machine per local model and cloud provider, and its probes"
    )
    idempotency: IdempotencySection = Field(
        IdempotencySection(), description="stored answers for idempotency-key, in the shared store (state)"
    )
    probes: bool = Field(True, description="run the health probes (live outcomes feed health either way)")
    share_period_s: float = Field(
        0.5, gt=0, description="gateway replicas exchange open breakers this often (honoured within 2x)"
    )


class SpendSection(StrictModel):
    ledger: str | None = Field(
        None,
        description="SQLite file with a row per cloud attempt and its cost, failed ones included; null: "
        "<cache>/spend.sqlite, <cache> being $SPILLOVER_CACHE or ~/.cache/spillover",
    )
    monthly_budget_usd: float | None = Field(
        None,
        gt=0,
        description="soft budget: past half of it the cost weight of every strategy rises, to max_cost_factor at "
        "the budget (never a refusal); null: none",
    )
    max_cost_factor: float = Field(4.0, ge=1, description="cost weight multiplier at and above the budget")
