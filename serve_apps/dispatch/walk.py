"""One request's walk over its candidates: what the dispatcher's attempts read, and the history they leave.

`Walk` is created once per request by `Dispatcher.dispatch` (serve_apps/dispatch/dispatcher.py) and handed to the
attempt loop, which appends to it instead of filling lists its caller passed in; the record, the session's
turn and the traffic gates read the same object afterwards:

`trail`     every attempt, skipped ones included (router/learning/decision.py `Attempt`)
`notes`     the graded switch the request ran under (serve_apps/traffic/controls.py `arrange`), for the record
`streams`   the attempt whose stream the client gets, booked when the stream ends
`events`    the record's events (a Retry-After waited out or not)
`reason`    why the request is where it is now (the plan's reason, then the last skip or fail-over)

The refusal doors (`Refusal`) are the checks that may refuse a target before its resilience gate, each from
its own module: the cost ceiling less what earlier attempts spent (router/limits/budget.py) and a context window the
target refused before (serve_apps/resilience/learned_windows.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cluster.config.resilience import RetrySection
from router.errors import ContractViolation, ProviderRateLimited, RequestError, TargetUnavailable
from router.learning.decision import Attempt
from router.limits.budget import ceiling_refusal, spent_usd
from router.request.contract import RequestContract
from router.request.openai_request import Kind
from router.resilience.retry import RetryAfterChoice, retry_after_choice
from router.routing.capabilities import Target
from router.routing.plan import Plan
from serve_apps.backend import BackendReply
from serve_apps.sessions.turns import Turn
from serve_apps.streams.record import StreamedAttempt

Refusal = Callable[["Walk", Target], str | None]  # why `target` may not be tried now, or None


@dataclass
class Called:
    """One attempt that answered: the body sent, the reply (checked), its headers and output flags."""

    sent: dict[str, Any]
    reply: BackendReply
    headers: dict[str, str]
    flagged: list[str]
    began: float


@dataclass
class Walk:
    plan: Plan
    kind: Kind
    body: dict[str, Any]
    request_id: str
    contract: RequestContract
    deadline: float
    turn: Turn
    trail: list[Attempt] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    streams: list[StreamedAttempt] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    reason: str = ""
    last_error: RequestError | None = None
    last_target: str = ""
    refusals: list[str] = field(default_factory=list)
    passed_over: list[str] = field(default_factory=list)  # skips and the stop since the last failure, named
    earlier: list[str] = field(default_factory=list)  # the failures before the last one, named
    client_usage: bool = False  # the client asked for a stream's usage itself (`body` always asks)

    def __post_init__(self) -> None:
        self.reason = self.reason or self.plan.reason

    @property
    def tokens(self) -> int:
        """The request's token estimate, what the quota gate reserves."""
        return self.contract.est_prompt_tokens + self.contract.max_output_tokens

    def made(self) -> int:
        """Attempts started so far (skips do not count)."""
        return sum(a.outcome != "skipped" for a in self.trail)

    def abandon_by(self, has_next: bool, max_attempts: int) -> float | None:
        """How an attempt starting now is watched before its first byte (serve_apps/dispatch/calls.py): None, with
        no candidate after it, never abandoned; else until when stale stats abandon it — the deadline while an
        attempt is left, never (-inf) on the last one — while a fault its replicas report abandons it at any time."""
        if not has_next:
            return None
        return self.deadline if self.made() + 1 < max_attempts else -math.inf

    def skipped(self, target: Target, why: str) -> None:
        self.passed(target, why)
        self.refusals.append(why)
        self.reason = f"{target.endpoint} skipped: {why}"[:300]

    def failed(self, target: Target, error: RequestError) -> None:
        """An attempt of `target` failed with `error`: what the client gets if nothing answers after it."""
        if self.last_error is not None:
            self.earlier.append(f"{self.last_target} failed: {self.last_error.code or self.last_error.message[:80]}")
        self.last_error, self.last_target = error, target.id
        self.passed_over.clear()

    def passed(self, target: Target, why: str) -> None:
        """`target` passed over by the walk itself (the gateway's retry budget): the reason stays the failure's."""
        self.trail.append(Attempt(target.id, "skipped", 0.0, error=why[:200]))
        self.passed_over.append(f"{target.id} skipped: {why}")

    def failed_over(self, target: Target, exc: RequestError) -> None:
        if isinstance(exc, ContractViolation):
            self.reason = f"{target.endpoint} broke the output contract"
        else:
            self.reason = f"{target.endpoint} failed before the first byte: {exc.message}"[:300]

    def traffic_note(self) -> str:
        return self.notes[-1] if self.notes else ""

    def final_error(self, stop: str = "") -> RequestError:
        """What the client gets when no candidate answered: the last failure, then every candidate passed over
        after it and why (a cost ceiling, a shut target, the attempt budget: `stop`), then the failures before it
        and the targets the plan left out, so no fall-over is left out unexplained."""
        if stop:
            self.refusals.append(stop)
            self.passed_over.append(stop)
        if self.last_error is not None:
            message = "; then ".join([self.last_error.message, *self.passed_over])
            if self.earlier:
                message += " (after " + "; ".join(self.earlier) + ")"
            if self.plan.unavailable:  # left out when the request was planned (health, breakers)
                message += " (not tried: " + "; ".join(f"{t}: {why}" for t, why in self.plan.unavailable.items()) + ")"
            self.last_error.message = message[:1000]
            return self.last_error
        return TargetUnavailable("no target could take the request: " + "; ".join(self.refusals)[:500])


def over_cost_ceiling(walk: Walk, target: Target) -> str | None:
    """The request's cost ceiling less what its earlier attempts spent (router/limits/budget.py)."""
    over = ceiling_refusal(walk.contract, target, spent_usd(a.cost_usd for a in walk.trail))
    if over is None:
        return None
    return f"max cost: {over}"


def candidates(plan: Plan, contract: RequestContract) -> list[tuple[Target, str]]:
    """The plan's targets in order, each with the reason to give if it answers: the local target first on
    a local route (then the cloud, unless `local_only`), else the cloud ones (local last when allowed)."""
    if plan.route == "local" and plan.local is not None:
        fallback = [] if contract.local_only else [(t, "") for t in plan.cloud]
        return [(plan.local, plan.reason), *fallback]
    last = [(plan.local, "")] if plan.local_last and plan.local is not None else []
    return [(t, plan.reason if i == 0 else "") for i, t in enumerate(plan.cloud)] + last


def retry_after_wait(exc: RequestError, walk: Walk, retry: RetrySection, now: float) -> RetryAfterChoice | None:
    """The Retry-After rule's choice for a 429 (router/resilience/retry.py), None for anything else."""
    if not isinstance(exc, ProviderRateLimited):
        return None
    return retry_after_choice(
        exc.retry_after_s,
        walk.contract.strategy,
        max_wait_s=retry.retry_after_wait_max_s,
        waiting_strategies=retry.retry_after_wait_strategies,
        now=now,
        deadline=walk.deadline,
    )
