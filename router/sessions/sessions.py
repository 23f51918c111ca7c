"""Sessions: which conversation a request belongs to, and whether it stays on its pinned target.

Pure: no clock, no I/O. The pin itself is stored by serve_apps/sessions/pins.py; the dispatcher's
side (anchor, compression, recording) is serve_apps/sessions/turns.py. docs/sessions.md tells the story.

The session id and its precedence: router/sessions/session_id.py.

The pin decision, given the pinned target and the plan the router made for this turn alone:

    switch: free        follow the plan; a different target is a switch ("free")
    switch: on_failure  stay on the pinned target while it is capable, available (health, breaker)
    (the default)       and — for a local model — within its watermarks and admission limit, even when
                        the plan ranked another target first; else the plan's target (a forced switch,
                        saying why: capacity | health | breaker | contract)
    switch: never       stay on the pinned target: a saturated local model is waited for (bounded,
                        then 429 like local_only), an unavailable or incapable one is a 503
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from router.errors import TargetUnavailable
from router.routing.capabilities import Target, is_local_id
from router.routing.plan import Plan
from router.routing.policy import SwitchRule

Action = Literal["new", "keep", "switch"]
Why = Literal["capacity", "health", "breaker", "contract", "failure", "free"]


@dataclass(frozen=True)
class PinDecision:
    action: Action
    pinned: str | None  # the target id the session was pinned to (None: a new session)
    target: str | None  # the target id this turn is planned to (None: waiting for local room)
    reason: str
    why: Why | None = None  # for a switch

    def describe(self) -> str:
        if self.action == "new":
            return "new session"
        if self.action == "keep":
            return f"session kept on {self.pinned}"
        return f"session switched {self.pinned} -> {self.target or 'pending'} ({self.why}: {self.reason})"


def _why_away(pinned: str, plan: Plan) -> tuple[Why, str]:
    """Why the pinned target cannot take this turn (it is not the plan's choice)."""
    if pinned in plan.unavailable:
        text = plan.unavailable[pinned]
        return ("breaker" if "breaker" in text or text.startswith("domain") else "health"), text
    removal = next((r for r in plan.pipeline.removed if r.target == pinned), None)
    if removal is not None:
        return "contract", f"{removal.filter}: {removal.reason}"
    if is_local_id(pinned) and plan.local is not None and plan.local.id == pinned:
        return "capacity", plan.reason
    return "contract", "not a candidate for this request"


def _usable(pinned: str, plan: Plan) -> Target | None:
    """The pinned target when this plan may run on it now."""
    if plan.local is not None and plan.local.id == pinned:
        return plan.local if plan.route in ("local", "wait") else None
    return next((t for t in plan.cloud if t.id == pinned), None)


def _on(plan: Plan, target: Target, *, fallback: bool) -> Plan:
    """`plan` running on `target` first (with the others as fall-backs when `fallback`)."""
    if target.kind == "local":
        return replace(
            plan, route=plan.route if plan.route == "wait" else "local", cloud=plan.cloud if fallback else ()
        )
    others = tuple(t for t in plan.cloud if t.id != target.id) if fallback else ()
    local_last = fallback and plan.route == "local"
    return replace(plan, route="cloud", cloud=(target, *others), local_last=local_last)


def decide_pin(pinned: str | None, plan: Plan, rule: SwitchRule) -> tuple[Plan, PinDecision]:
    """The plan this turn runs with, and what happened to the session's pin."""
    first = plan.first
    if pinned is None:
        return plan, PinDecision("new", None, first.id if first else None, plan.reason)
    if rule == "free":
        if first is None or first.id == pinned:
            return plan, PinDecision("keep", pinned, first.id if first else None, plan.reason)
        return plan, PinDecision("switch", pinned, first.id, f"the plan chose it: {plan.reason}", "free")
    target = _usable(pinned, plan)
    if target is not None:
        kept = _on(plan, target, fallback=rule == "on_failure")
        reason = plan.reason if target.kind == "local" else f"pinned; {plan.reason}"
        return replace(kept, reason=reason), PinDecision("keep", pinned, pinned, plan.reason)
    why, detail = _why_away(pinned, plan)
    if rule == "never":
        if why == "capacity" and plan.local is not None and plan.local.id == pinned:
            waiting = replace(plan, route="wait", cloud=(), reason=f"{detail}; switch: never: waiting for {pinned}")
            return waiting, PinDecision("keep", pinned, None, waiting.reason)
        raise TargetUnavailable(f"session pinned to {pinned} ({why}: {detail}); the scenario's switch: never")
    return plan, PinDecision("switch", pinned, first.id if first else None, detail, why)


def after_failover(decision: PinDecision, answered: str | None, failure: str) -> PinDecision:
    """The pin decision once the attempts ended on `answered` (a fail-over moves a session too)."""
    if answered is None or answered == decision.target:
        return decision
    if decision.action == "new" or (decision.action == "switch" and decision.target is None):
        return replace(decision, target=answered)  # a new session, or one that waited and was then planned
    if answered == decision.pinned:
        return replace(decision, action="keep", target=answered, why=None)
    return PinDecision("switch", decision.pinned, answered, failure or decision.reason, "failure")
