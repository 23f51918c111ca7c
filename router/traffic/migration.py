"""Graded migration of a scope's traffic from an old target to a new one, with gates and rollback.

A switch (an operator's, a new model snapshot, a recovered model) never moves everything at once:
the new target takes `steps` of the traffic that would have gone to the old one — 1% → 5% → 25% →
50% → 100% by default — and each step is held at least `step_s` and until the new target has
answered `min_requests` requests at that step. Then the step's gates compare the new target with the
old one over the requests of that step:

    errors      new error ratio     <= old error ratio + max_error_delta
    latency     new p95 latency     <= latency_factor x old p95 (when both have latencies)
    contract    new violation ratio <= old violation ratio + max_violation_delta

All pass → the next step (at 100% held: complete, the new target is the primary). A gate that fails
→ rolled back: the new target takes 0% until an operator switches again. A gate is also checked as
soon as the step has `min_requests` outcomes of the new target, so a target that starts failing at
25% is rolled back within those requests, not only at the end of the step. Before widening, the
standby's quota is asked (`quota_ok(share)`): a refusal holds the step (and says why) instead of
moving traffic the standby could not take.

Pure: outcomes and time come in as arguments / the injected clock; every transition is kept as an
`Event` (for the view, the metrics and the decision records).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from pydantic import Field, model_validator

from router.percentile import percentile
from router.settings_base import StrictModel

Clock = Callable[[], float]
Phase = Literal["running", "complete", "rolled_back"]
DEFAULT_STEPS: tuple[float, ...] = (0.01, 0.05, 0.25, 0.5, 1.0)
MAX_EVENTS = 50


class Gates(StrictModel):
    # the gate part of the `traffic.migration` config section (cluster/config/traffic.py adds the rest)
    steps: tuple[float, ...] = Field(
        DEFAULT_STEPS,
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

    @model_validator(mode="after")
    def _ascending_to_one(self) -> Gates:
        steps = self.steps
        if list(steps) != sorted(set(steps)) or steps[0] <= 0 or steps[-1] != 1.0:
            raise ValueError(f"migration steps must be ascending shares in (0, 1] ending with 1.0, got {list(steps)}")
        return self


@dataclass(frozen=True)
class Event:
    at: float
    kind: str  # started | step | held | rolled_back | complete
    share: float  # the new target's share after the event
    reason: str


@dataclass
class _Tally:
    requests: int = 0
    errors: int = 0
    violations: int = 0
    latencies: list[float] = field(default_factory=list)

    def add(self, ok: bool, violation: bool, latency_s: float | None) -> None:
        self.requests += 1
        self.errors += 0 if ok or violation else 1
        self.violations += 1 if violation else 0
        if ok and latency_s is not None and len(self.latencies) < 10_000:
            self.latencies.append(latency_s)

    def ratio(self, count: int) -> float:
        return count / self.requests if self.requests else 0.0

    def p95(self) -> float | None:
        return percentile(self.latencies, 95)


class Migration:
    """One scope's move from `old` to `new`; `share()` is what the new target takes now."""

    def __init__(self, old: str, new: str, gates: Gates, clock: Clock) -> None:
        self.old, self.new, self.gates = old, new, gates
        self._clock = clock
        self.phase: Phase = "running"
        self.step = 0
        self._since = clock()
        self._old, self._new = _Tally(), _Tally()
        self.events: list[Event] = []
        self._event("started", f"{old} -> {new}: {gates.steps[0]:.0%} of its traffic first")

    def share(self) -> float:
        if self.phase == "rolled_back":
            return 0.0
        return 1.0 if self.phase == "complete" else self.gates.steps[self.step]

    @property
    def reason(self) -> str:
        return self.events[-1].reason

    def observe(self, target: str, *, ok: bool, violation: bool = False, latency_s: float | None = None) -> None:
        """One attempt's outcome on the old or the new target (others are ignored)."""
        if self.phase != "running" or target not in (self.old, self.new):
            return
        (self._new if target == self.new else self._old).add(ok, violation, latency_s)
        if self._new.requests >= self.gates.min_requests and (why := self._failed_gate()) is not None:
            self._roll_back(why)

    def tick(self, quota_ok: Callable[[float], str | None] = lambda share: None) -> None:
        """Advance when the step is held long enough with enough evidence and its gates pass."""
        if self.phase != "running":
            return
        now, gates = self._clock(), self.gates
        if now - self._since < gates.step_s or self._new.requests < gates.min_requests:
            return
        if (why := self._failed_gate()) is not None:
            self._roll_back(why)
            return
        if self.step + 1 == len(gates.steps):
            self.phase = "complete"
            self._event("complete", f"{self.new} held 100% for {gates.step_s:g}s: it is the primary")
            return
        nxt = gates.steps[self.step + 1]
        refused = quota_ok(nxt)
        if refused is not None:
            said = f"held at {self.share():.0%}: {refused}"[:300]
            if self.events[-1].reason != said:
                self._event("held", said)
            return
        held = self.share()
        self.step += 1
        self._since = now
        self._old, self._new = _Tally(), _Tally()
        self._event("step", f"gates passed at {held:.0%}: {self.new} takes {nxt:.0%}")

    def rollback(self, reason: str) -> None:
        """An outside rollback (another gateway replica's gates, an operator)."""
        if self.phase == "running":
            self._roll_back(reason)

    def _failed_gate(self) -> str | None:
        g, old, new = self.gates, self._old, self._new
        err_new, err_old = new.ratio(new.errors), old.ratio(old.errors)
        if err_new > err_old + g.max_error_delta:
            return f"error gate: {self.new} {err_new:.0%} of {new.requests} vs {self.old} {err_old:.0%}"
        vio_new, vio_old = new.ratio(new.violations), old.ratio(old.violations)
        if vio_new > vio_old + g.max_violation_delta:
            return f"contract gate: {self.new} violated {vio_new:.0%} vs {self.old} {vio_old:.0%}"
        p95_new, p95_old = new.p95(), old.p95()
        if p95_new is not None and p95_old is not None and p95_new > g.latency_factor * p95_old:
            return f"latency gate: {self.new} p95 {p95_new:.2f}s > {g.latency_factor:g} x {self.old} p95 {p95_old:.2f}s"
        return None

    def _roll_back(self, why: str) -> None:
        at = self.share()
        self.phase = "rolled_back"
        self._event("rolled_back", f"rolled back at {at:.0%}: {why}")

    def _event(self, kind: str, reason: str) -> None:
        self.events.append(Event(self._clock(), kind, self.share(), reason[:300]))
        del self.events[:-MAX_EVENTS]

    def view(self, to_wall: float = 0.0) -> dict[str, object]:
        """`to_wall` is added to event times (the caller's wall clock minus this clock)."""
        return {
            "old": self.old,
            "new": self.new,
            "phase": self.phase,
            "share": self.share(),
            "step": self.step,
            "steps": list(self.gates.steps),
            "new_requests_at_step": self._new.requests,
            "old_requests_at_step": self._old.requests,
            "events": [
                {"at": e.at + to_wall, "kind": e.kind, "share": e.share, "reason": e.reason} for e in self.events[-10:]
            ],
        }


def stagger_delay_s(position: float, *, first_share: float, stagger_s: float) -> float:
    """When a gateway replica at `position` in [0, 1) adopts a switch, after it was posted: the first
    `first_share` of the replicas at once, the rest `stagger_s` later (so one bad switch starts on a
    share of the replicas, and a rollback there reaches the rest before they move)."""
    return 0.0 if position < first_share else stagger_s


def splitter(share: float, count: int) -> bool:
    """Deterministic split: the `count`-th request (0-based) goes to the new target when the whole
    number of new-target requests owed so far grows — exactly `share` of every run of requests."""
    return math.floor((count + 1) * share) > math.floor(count * share)
