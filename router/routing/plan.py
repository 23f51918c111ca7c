"""One request's routing plan: the contract pipeline first, then the burst decision.

Pure, like the rest of router/. Order matters:

1. `run_pipeline` removes every target that cannot honour the request's contract (context,
   tools, schema, residency, data policy, cost, ...). Nothing capable → 422 no_capable_model
   (400 context_length_exceeded when length is the only obstacle; 422 carried_context_restricted
   when the context the request's session carries may not go where it could be served), never a
   truncated answer.
   Targets whose health is red/black or whose breaker is open (`unavailable`) stay out of the
   tiers; the record lists them as unavailable.
2. If the local model is not capable (or unavailable) (e.g. the request needs tools it lacks), the request goes to
   the best capable cloud target even when local has room — never a silently degraded answer.
3. Otherwise `router.routing.burst.decide` chooses local vs cloud vs wait from engine pressure, offering
   only the capable cloud targets, in the pipeline's ranked order.

A route (`routes:` in the config, `Registry.for_alias`) offers its own targets, in its order unless
the request's scenario says `route_order: strategy`; its local model, if any, is the one whose
pressure decides, and a route without one goes straight to its cloud targets.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from router.errors import NoTargetFitsContext, TargetUnavailable
from router.request.contract import RequestContract
from router.routing.burst import BurstInputs, Route, decide
from router.routing.capabilities import Registry, Target, is_local_id
from router.routing.deadline import LocalForecast
from router.routing.local_share import ShareDraw
from router.routing.pipeline import PipelineResult, no_capable_model, run_pipeline
from router.routing.plugins import TargetState
from router.routing.policy import Policy
from router.routing.snapshot import ClusterSnapshot
from router.routing.watermarks import Watermarks
from router.sessions.carried import restricted


@dataclass(frozen=True)
class Plan:
    route: Route
    reason: str
    local: Target | None  # the local target when it is capable
    cloud: tuple[Target, ...]  # capable, available cloud targets, best first
    latched: frozenset[str]
    pipeline: PipelineResult
    unavailable: Mapping[str, str] = field(default_factory=dict)  # target id -> why, from the inputs
    local_last: bool = False  # route cloud, with local (which had room) as the last fall-back: a session's pin
    forecast: LocalForecast | None = None  # the deadline forecast it was decided with (router/routing/deadline.py)

    @property
    def first(self) -> Target | None:
        if self.route == "local":
            return self.local
        return self.cloud[0] if self.route == "cloud" and self.cloud else None


@dataclass(frozen=True)
class PlanInputs:
    contract: RequestContract
    policy: Policy
    registry: Registry
    watermarks: Watermarks
    inflight: int
    admission_limit: int | None
    available_providers: frozenset[str]  # providers with a live adapter (enabled, not broken)
    unavailable: Mapping[str, str] = field(default_factory=dict)  # target id -> why (health red/black, breaker)
    admission_detail: str = ""  # which bound and inputs set admission_limit (calibrated models)
    quality: Mapping[str, float] = field(
        default_factory=dict
    )  # target id -> learned quality (router/learning/quality.py)
    forecast: LocalForecast | None = None  # deadline-aware spill (router/routing/deadline.py)
    share: ShareDraw | None = None  # load-proportional spill (router/routing/local_share.py)


def plan_request(inputs: PlanInputs, snapshot: ClusterSnapshot, now: float, latched: frozenset[str]) -> Plan:
    contract = inputs.contract
    targets = inputs.registry.for_alias(contract.model)
    states = {
        t.id: TargetState(
            available=(t.kind == "local" or t.provider in inputs.available_providers)
            and t.id not in inputs.unavailable,
            quality=inputs.quality.get(t.id),
        )
        for t in targets
    }
    # a route's targets keep its order unless the scenario ranks them by its strategy (docs/routing.md#routes)
    order = inputs.registry.route_order(contract.model) if contract.route_order == "route" else None
    result = run_pipeline(contract, targets, states, inputs.policy, order=order)
    if not result.capable:
        error = no_capable_model(result, contract.model)
        if result.removed and all(r.filter == "context" for r in result.removed):
            raise NoTargetFitsContext(error.message, reasons=error.reasons)
        if contract.carried is not None and any(r.filter == "carried" for r in result.removed):
            raise restricted(contract.carried, error)  # the carried-state rule (router/sessions/carried.py)
        raise error
    by_id = {t.id: t for t in targets}
    local = by_id[result.tiers[0][0]] if result.tiers[0] else None
    cloud = tuple(by_id[i] for i in result.tiers[1])

    if local is None:
        if not cloud:
            why = "; ".join(f"{i}: {inputs.unavailable[i]}" for i in result.unavailable if i in inputs.unavailable)
            raise TargetUnavailable(
                f"every target able to serve {contract.model} under this contract is unavailable"
                + (f" ({why})" if why else "")
            )
        removal = next((r for r in result.removed if is_local_id(r.target)), None)
        down = next((inputs.unavailable[i] for i in result.unavailable if is_local_id(i)), None)
        if not any(t.kind == "local" for t in targets):
            why = f"route {contract.model} has no local model"
        elif removal is not None:
            why = f"local {contract.model} cannot serve this request: {removal.reason}"
        else:
            why = f"local {contract.model} is unavailable: {down}" if down else "local not capable"
        return Plan("cloud", why, None, cloud, latched, result, inputs.unavailable)

    burst = BurstInputs(
        model=local.alias,  # a route's local model is served under its own alias
        watermarks=inputs.watermarks,
        inflight=inputs.inflight,
        admission_limit=inputs.admission_limit,
        admission_detail=inputs.admission_detail,
        local_only=contract.local_only,
        providers=tuple(t.provider or "" for t in cloud),
        forecast=inputs.forecast,
        share=inputs.share,
    )
    decision = decide(burst, snapshot, now, latched)
    return Plan(
        decision.route, decision.reason, local, cloud, decision.latched, result, inputs.unavailable,
        forecast=inputs.forecast,
    )  # fmt: skip
