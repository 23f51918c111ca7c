"""The decision record of one dispatched request, built from the plan that was executed — the last one,
after any wait and re-plans — with its attempts, how it ended, the graded switch or weight it ran under,
its events (Retry-After, stream repairs and continuations), its session and the capability / health
snapshot a replay needs (router/decision_inputs.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any

from router.capabilities import Target
from router.contract import RequestContract
from router.decision import Attempt, DecisionRecord
from router.decision_inputs import plan_snapshot
from router.plan import Plan
from router.policy import Policy
from serve_apps.admission import Waited
from serve_apps.dispatch_types import Dispatched


@dataclass(frozen=True)
class Outcome:
    """What happened to the request, beside its plan."""

    started: float
    waited: Waited
    trail: list[Attempt]
    done: Dispatched | None
    ended: str  # the error message when it failed
    traffic: str
    events: list[dict[str, Any]]
    session: dict[str, Any] | None


def executed_record(
    request_id: str,
    policy: Policy,
    contract: RequestContract,
    plan: Plan,
    outcome: Outcome,
    *,
    targets: Iterable[Target],
    reachable: Iterable[str],
    health: dict[str, str],
    clock: Callable[[], float],
) -> DecisionRecord:
    snapshot = plan_snapshot(list(targets), reachable, plan.unavailable, health)
    record = DecisionRecord.from_pipeline(
        request_id,
        policy,
        contract,
        plan.pipeline,
        clock=lambda: outcome.started,
        unavailable=plan.unavailable,
        health=health,
        snapshot=snapshot,
    )
    done = outcome.done
    executed = replace(
        record,
        attempts=tuple(outcome.trail),
        route=done.route if done is not None else plan.route,
        reason=done.reason if done is not None else (outcome.ended or plan.reason),
        waited_s=outcome.waited.waited_s,
        replans=outcome.waited.replans,
        traffic=outcome.traffic,
        events=tuple(outcome.events),
        session=outcome.session,
    )
    return executed.finished(done.target if done is not None else None, clock=clock)
