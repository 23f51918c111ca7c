"""The `resilience:` and `spend:` sections of the deployment config.

Defaults follow common practice: retries ≤ ~10% of requests (gRPC retry throttling), backoff with
full jitter, breakers that need a minimum count before they judge, probes at 10 s / 30 s /
5 min, yellow moving ~30% of new requests away, recovery after a short cool-down through a half-open
phase (a few live trials, probes every 5 s), then a 20% → 50% → 100% ramp (router/health.py).
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from cluster.config_base import StrictModel


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
        default_factory=lambda: ["cost"],
        description="scenario strategies that wait out a short Retry-After on the same target (cheaper, keeps the "
        "target); the others fail over at once",
    )


class BreakerSection(StrictModel):
    window_s: float = Field(30.0, gt=0, description="outcomes considered")
    min_requests: int = Field(5, ge=1, description="outcomes needed in the window before it can open")
    failure_ratio: float = Field(0.5, gt=0, le=1, description="share of failed outcomes in the window that opens it")
    open_s: float = Field(10.0, gt=0, description="open this long, then half-open")
    half_open_probes: int = Field(1, ge=1, description="trial requests let through when half-open")


class HealthSection(StrictModel):
    liveness_probe_s: float = Field(10.0, gt=0, description="L1: is the target reachable at all")
    latency_probe_s: float = Field(30.0, gt=0, description="L2: a tiny prompt within latency_slo_s")
    correctness_probe_s: float = Field(300.0, gt=0, description="L3: a golden prompt with a known answer")
    latency_slo_s: float = Field(5.0, gt=0, description="an L2 probe slower than this failed")
    probe_timeout_s: float = Field(10.0, gt=0, description="a probe without an answer this long failed")
    window_s: float = Field(120.0, gt=0, description="live outcomes considered")
    min_requests: int = Field(5, ge=1, description="live outcomes needed in the window before their error ratio counts")
    yellow_error_ratio: float = Field(0.2, gt=0, le=1, description="live error ratio that turns a green target yellow")
    yellow_share: float = Field(0.7, ge=0, le=1, description="share of new requests a yellow target keeps")
    red_after_s: float = Field(120.0, gt=0, description="yellow this long becomes red")
    red_probe_failures: int = Field(3, ge=1, description="consecutive failed liveness probes: red at once")
    red_live_failures: int = Field(5, ge=1, description="consecutive failed live requests: red at once")
    recovery_probes: int = Field(
        2, ge=1, description="consecutive good probes that start the ramp back (once the cool-down is over)"
    )
    cooldown_s: float = Field(10.0, ge=0, description="minimum time in red; then half-open")
    half_open_share: float = Field(
        0.1,
        ge=0,
        le=1,
        description="share of new requests a half-open target (red, cool-down over) takes as trials; the first "
        "that succeeds starts the ramp, one that fails restarts the cool-down",
    )
    recovery_probe_s: float = Field(
        5.0, gt=0, description="liveness and latency probes of a red target run this often (when shorter)"
    )
    live_evidence_s: float = Field(
        10.0,
        ge=0,
        description="a live outcome at most this old outranks liveness and latency probes: they are recorded "
        "(and counted as overruled when they disagree) but do not move the state",
    )
    ramp: tuple[float, ...] = Field((0.2, 0.5, 1.0), min_length=1, description="shares while ramping back")
    ramp_step_s: float = Field(10.0, ge=0, description="each ramp share held this long without failures")
    black_retry_s: float = Field(600.0, ge=0, description="after a credential failure, probes believed after this")
    yellow_clear_s: float = Field(30.0, ge=0, description="yellow with a clean window this long: green")
    stale_red_s: float = Field(
        30.0,
        ge=0,
        description="every replica's stats stale this long past telemetry.max_age_s: red (shorter staleness "
        "only diverts traffic while it lasts)",
    )

    @model_validator(mode="after")
    def _ramp_rises_to_one(self) -> HealthSection:
        ramp = self.ramp
        if any(not 0 < share <= 1 for share in ramp) or list(ramp) != sorted(ramp) or ramp[-1] != 1.0:
            raise ValueError("ramp must be rising shares in (0, 1] ending with 1.0")
        return self


class IdempotencySection(StrictModel):
    ttl_s: float = Field(600.0, gt=0, description="how long a completed answer is replayed for its key")
    max_entries: int = Field(10_000, ge=1, description="per gateway replica")
    max_bytes: int = Field(64 * 1024 * 1024, ge=1024, description="stored answers' JSON bytes, per gateway replica")
    wait_s: float = Field(300.0, gt=0, description="a repeat of an in-flight key waits this long for it")


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
        IdempotencySection(), description="stored answers for idempotency-key, per gateway replica"
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
