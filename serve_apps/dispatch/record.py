"""The decision record of one dispatched request, built from the plan that was executed — the last one,
after any wait and re-plans — with its attempts, how it ended, the graded switch or weight it ran under,
its events (Retry-After, stream repairs and continuations), its session and the capability / health
snapshot a replay needs (router/learning/decision_inputs.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any

from router.errors import RequestTimeout
from router.learning.decision import Attempt, DecisionRecord
from router.learning.decision_inputs import plan_snapshot
from router.request.contract import RequestContract
from router.routing.capabilities import Target
from router.routing.plan import Plan
from router.routing.policy import Policy
from serve_apps.dispatch.admission import Waited
from serve_apps.dispatch.interfaces import Dispatched


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


def _timed_out(cut: asyncio.CancelledError) -> bool:
    """The gateway's request timeout cancels with this message (serve_apps/http/guards.py `within`)."""
    return bool(cut.args) and cut.args[0] == RequestTimeout.code


def cut_reason(cut: asyncio.CancelledError) -> str:
    """Why a request ended without an answer of its own, for its record."""
    return "cut by gateway.request_timeout_s" if _timed_out(cut) else "cancelled (the client went away)"


def cut_attempt(target: Target, cut: asyncio.CancelledError, latency_s: float, contract: RequestContract) -> Attempt:
    """An attempt cut while it waited for its answer: `cancelled`, error `request_timeout` when the gateway's
    request timeout cut it, with what it may have used as its tokens (`usage: "estimated"`): nothing for a
    local target, the prompt estimate and the output limit for a cloud one — a provider may finish, and
    bill, a request whose caller left — so the spend ledger is charged that estimate."""
    cloud = target.kind == "cloud"
    spent = (contract.est_prompt_tokens, contract.max_output_tokens) if cloud else (0, 0)
    error = RequestTimeout.code if _timed_out(cut) else "cancelled"
    return replace(Attempt.priced(target, "cancelled", latency_s, *spent, error), usage="estimated")
