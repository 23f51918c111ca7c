"""Dispatch one request: plan it, wait for local room if it must, run the attempts, record why.

The decisions are pure (`router.routing.plan.plan_request`: contract pipeline, then burst decision); this module
owns the gateway's mutable state for them — admission (serve_apps/dispatch/admission.py: leases on each model's
limit in the shared store, the waiting room), hysteresis latches, the decision store — and the awaiting.

Attempts (`serve_apps.resilience.state` holds the state, `router.resilience.failure` the table) walk the
candidates with one `Walk` per request (serve_apps/dispatch/walk.py: the trail, notes, streams and events
it leaves), through named doors: arrange the candidates (`_arranged`: the traffic controls), refuse a target
(`_gate`: the refusals, then the resilience gate), shape the body (`_body_for`), observe the outcome
(`_after_failure`, `_answered`):
* candidates are the planned target, then — unless the request is `local_only` — the capable cloud
  targets in ranked order; red/black health or an open breaker keeps a target out of the plan, and
  just before an attempt its gate may still skip it (health share, half-open trial, quota);
* after a failure the table decides: retry the same target once after a full-jitter backoff
  (honouring Retry-After), fail over to the next candidate, or return the error to the client; a
  429 whose short Retry-After fits the deadline is waited out on the same target when the
  scenario's strategy says so (router/resilience/retry.py `retry_after_choice`);
* a provider's 400 context_length_exceeded fails over and is remembered (serve_apps/resilience/learned_windows.py);
* a local call still waiting for its first byte when every replica of the model goes stale (Serve
  holds a dead replica's requests until a new one starts) or reports a fault (numerics failed, engine
  stalled) is abandoned and fails over; a complete greedy answer stuck in a loop is flagged and counts
  as an output failure of its target (serve_apps/streams/output_loops.py);
* an L1 answer that breaks its output contract moves on to the next capable target, or ends as
  502 contract_violation;
* a candidate whose cost estimate passes what the cost ceiling leaves is skipped (router/limits/budget.py);
* at most `resilience.retry.max_attempts` attempts start, none after the request's deadline, and
  retries against the domain that just failed draw on the gateway-wide retry budget.
After the first byte of a stream nothing is re-sent: a failure ends the stream with an error event,
unless the scenario continues streams and the next candidate that accepts a prefill continues the
text answer in the same response (serve_apps/streams/continuation.py). A stream is booked when it ends
(serve_apps/streams/record.py): its tokens, cost and outcome reach the record, ledger and metrics then.
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import replace
from functools import partial
from typing import Any

from cluster.config.deployment import SpilloverConfig
from router.errors import ContractViolation, ProviderContextExceeded, RequestError
from router.headers import DEGRADED, TRAFFIC
from router.learning.decision import Attempt, DecisionStore
from router.learning.quality import contract_bucket
from router.limits.budget import bounded_body
from router.output.output_contract import CONTRACT_HEADER
from router.request.cache_salt import salted
from router.request.contract import RequestContract
from router.request.openai_request import Kind
from router.resilience.next_step import Cursor, after_failed, moved, next_step
from router.resilience.retry import AfterFailure, AttemptBudget, after_failure, wait_out_delay
from router.routing.burst import Route
from router.routing.capabilities import Registry, Target
from router.routing.plan import Plan, PlanInputs, plan_request
from router.routing.snapshot import ClusterSnapshot
from serve_apps.backend import CloudBackend, ModelBackend
from serve_apps.clocks import Clocks
from serve_apps.dispatch.admission import Admission, Waited
from serve_apps.dispatch.calls import Calls
from serve_apps.dispatch.interfaces import Dispatched, NoObserver
from serve_apps.dispatch.parts import DispatchParts
from serve_apps.dispatch.record import Outcome, cut_attempt, cut_reason, executed_record
from serve_apps.dispatch.streams import ClientStreams, Started
from serve_apps.dispatch.walk import Called, Refusal, Walk, candidates, over_cost_ceiling, retry_after_wait
from serve_apps.off_loop.check_pool import CheckPool
from serve_apps.resilience.state import Gate, Resilience
from serve_apps.sessions.turns import Sessions
from serve_apps.streams.account import asking_usage, wants_usage
from serve_apps.streams.contract import held_until_checked, holds_back
from serve_apps.streams.output_check import checked, usage
from serve_apps.streams.output_loops import FLAG as LOOP_FLAG
from serve_apps.streams.output_loops import LoopCheck
from serve_apps.streams.record import StreamedAttempt


class Dispatcher:
    """One gateway replica's dispatch. `clocks` (serve_apps/clocks.py): deadlines, waits and latencies on
    the monotonic clock, record timestamps and stats freshness on the wall clock; `poll_s`: how often a
    wait for local room and a call waiting for its first byte look again; `parts`
    (serve_apps/dispatch/parts.py): what it shares with the rest of its gateway."""

    def __init__(
        self,
        config: SpilloverConfig,
        local: ModelBackend,
        providers: Mapping[str, CloudBackend],
        snapshot: Callable[[], ClusterSnapshot],
        *,
        clocks: Clocks | None = None,
        poll_s: float = 0.05,
        parts: DispatchParts | None = None,
    ) -> None:
        clocks, parts = clocks or Clocks(), parts or DispatchParts()
        self._config = config
        self._providers = dict(providers)
        enabled = [p for p in config.cloud.providers if p.name in self._providers]
        self._registry = parts.registry or Registry.from_config(config.models, enabled, routes=config.routes)
        self._snapshot = snapshot
        self._clock, self._wall, self._sleep = clocks.clock, clocks.wall, clocks.sleep
        self._observer = parts.observer or NoObserver()
        self.decisions = parts.decisions if parts.decisions is not None else DecisionStore()  # an empty one is falsy
        self._resilience = parts.resilience or Resilience(config, clock=clocks.clock, wall=clocks.wall)
        self._admission = Admission(
            config, self._observer, clock=clocks.clock, sleep=clocks.sleep, poll_s=poll_s,
            plans=parts.admission_plans, reservations=parts.reservations,
        )  # fmt: skip
        self._latched: dict[str, frozenset[str]] = defaultdict(frozenset)
        self._calls = Calls(local, self._providers, self._admission, snapshot, clocks, poll_s)
        self._loops = LoopCheck(config)
        self._refusals: tuple[Refusal, ...] = (over_cost_ceiling, self._too_small)  # the door `refuse a target`
        self._traffic = parts.traffic
        self.sessions = parts.sessions or Sessions(config, local)
        self._quality = parts.quality
        self.checks = parts.checks or CheckPool(name="schema-checks")
        self._streams = ClientStreams(
            config,
            self._calls.continuation,
            resilience=self._resilience,
            decisions=self.decisions,
            observer=self._observer,
            traffic=self._traffic,
            checks=self.checks,
            clocks=clocks,
        )

    def inflight(self, model: str) -> int:
        return self._admission.inflight(model)

    @property
    def admission(self) -> Admission:  # its limit, and `warm` on each fresh snapshot
        return self._admission

    @property
    def resilience(self) -> Resilience:
        return self._resilience

    def behind(self, model: str, endpoint: str) -> tuple[Target, ...]:
        """The targets of `model` an answer marked `x-spillover-target: <endpoint>` may come from."""
        return tuple(t for t in self._registry.for_alias(model) if t.endpoint == endpoint)

    def plan(self, contract: RequestContract, kind: Kind, *, peek: bool = False, arrived: float | None = None) -> Plan:
        """The request's plan. A route's local model (router/routing/capabilities.py): its replicas, admission and
        latches decide. `peek`: what the plan would be now, leaving the hysteresis latches and the `decided`
        metric alone (the tiered dispatch's look, serve_apps/traffic/deferral.py). `arrived`: when it came."""
        snapshot, now, model = self._snapshot(), self._wall(), self._registry.local_model(contract.model)
        self._resilience.watch_local(model, snapshot, now)
        limit = self._admission.limit_with_reason(model, snapshot, now)
        inputs = PlanInputs(
            contract=contract,
            policy=self._resilience.policy(self._config.policy),
            registry=self._registry,
            watermarks=self._config.watermarks_for(model),
            inflight=self._admission.inflight(model),
            admission_limit=limit.value,
            admission_detail=limit.detail,
            available_providers=frozenset(self._providers),  # a completion: those that serve it (completions_api)
            unavailable={
                **self._unavailable(contract),
                **self._resilience.windows.unavailable(self._registry.for_alias(contract.model), contract.min_context),
            },
            quality=self._learned(contract),
            forecast=self._admission.forecast(model, contract, snapshot, now, arrived),
            share=self._admission.share(model, peek=peek),
        )
        if peek:
            return plan_request(inputs, snapshot, now, self._latched[model])
        began = time.perf_counter()
        try:
            plan = plan_request(inputs, snapshot, now, self._latched[model])
        finally:
            self._observer.decided(time.perf_counter() - began)
        self._latched[model] = plan.latched
        return plan

    def _unavailable(self, contract: RequestContract) -> dict[str, str]:
        targets = self._registry.for_alias(contract.model)
        held = self._traffic.unavailable(contract, targets) if self._traffic is not None else {}
        return {**held, **self._resilience.unavailable(targets)}

    def _learned(self, contract: RequestContract) -> dict[str, float]:
        if self._quality is None:
            return {}
        ids = [t.id for t in self._registry.for_alias(contract.model)]
        return self._quality.estimates(ids, contract_bucket(contract), contract.tenant or "")  # its own feedback

    async def dispatch(
        self, kind: Kind, body: dict[str, Any], request_id: str, *, contract: RequestContract, deadline_s: float
    ) -> Dispatched:
        started, started_at = self._clock(), self._wall()
        self._resilience.budget.deposit()
        local_model = self._registry.local_model(contract.model)
        self._admission.observe(local_model, contract.est_prompt_tokens, contract.max_output_tokens)
        turn = await self.sessions.open(contract, body, request_id)
        contract, body = turn.contract, turn.body  # with the session's stored turns (sessions.store)
        planned = turn.planner(partial(self.plan, kind=kind, arrived=started))
        # the body asks for usage once (a stream's tokens are reported at its end); the client's own wish is kept
        walk = Walk(planned(), kind, asking_usage(body), request_id, contract, started + deadline_s, turn)
        walk.client_usage = wants_usage(body)
        waited = Waited(walk.plan, 0.0, 0)
        done: Dispatched | None = None
        ended = ""
        try:
            waited = await self._admission.admit(local_model, walk.plan, planned, walk.deadline, request_id)
            walk.plan, walk.reason = waited.plan, waited.plan.reason if waited.plan is not walk.plan else walk.reason
            done = await self._attempts(walk)
            await turn.close(walk.trail, done)
            return replace(done, waited_s=waited.waited_s)
        except (RequestError, asyncio.CancelledError) as exc:  # the record says why it ended (a timeout's cut too)
            ended = exc.message if isinstance(exc, RequestError) else cut_reason(exc)
            raise
        finally:
            self._admission.finish(request_id)  # a local stream keeps its lease until consumed
            notes = "".join(walk.notes)
            outcome = Outcome(started_at, waited, walk.trail, done, ended, notes, walk.events, turn.view())
            self._record(request_id, contract, walk.plan, outcome, kind, walk.streams)
            if self._traffic is not None and not (done is not None and walk.streams):
                self._traffic.observed(contract, walk.trail)  # the switch's gates (a stream's when it ends)

    def _record(
        self,
        request_id: str,
        contract: RequestContract,
        plan: Plan,
        outcome: Outcome,
        kind: Kind,
        streams: list[StreamedAttempt],
    ) -> None:
        """The executed plan's record (serve_apps/dispatch/record.py), stored and shown to the observer (metrics)
        (a stream's is stored unfinished and booked when the stream ends)."""
        finished = executed_record(
            request_id,
            self._config.policy,
            contract,
            plan,
            outcome,
            targets=self._registry.for_alias(contract.model),
            reachable=self._providers,
            health=self._resilience.states(),
            clock=self._wall,
        )
        if outcome.done is not None and streams:  # final when its stream ends (serve_apps/streams/record.py)
            streams[0].record = finished
            self.decisions.put(finished, final=False)
            return
        self.decisions.put(finished)
        self._observer.recorded(finished)

    async def _attempts(self, walk: Walk) -> Dispatched:
        """Walk the candidates; every attempt is appended to `walk.trail`. Where the walk goes next is decided
        by router/resilience/next_step.py on router/resilience/retry.py's rules (`after_failure`, fed by
        `router.resilience.failure`'s table: retry the same target after a backoff, fail over to the next one,
        or give up); this loop carries it out."""
        res = self._resilience
        candidates = self._arranged(walk)
        domains = [res.domain(target) for target, _ in candidates]
        budget = AttemptBudget(max_attempts=res.max_attempts, deadline=walk.deadline)
        cursor = Cursor()
        while True:
            step = next_step(cursor, domains, walk.made(), budget, self._clock(), res.budget.try_withdraw)
            if step.action in ("exhausted", "stop"):
                raise walk.final_error(step.why)
            if step.action == "skip":
                walk.passed(candidates[cursor.index][0], step.why)
                cursor = step.cursor
                continue
            outcome = await self._attempt(walk, cursor, candidates)
            if isinstance(outcome, Dispatched):
                return outcome
            cursor = outcome

    async def _attempt(self, walk: Walk, cursor: Cursor, candidates: list[tuple[Target, str]]) -> Dispatched | Cursor:
        """The candidate at `cursor`: its delay, its doors, the call; the answer, or where the walk goes next
        (a failure the retry table gives up on is raised)."""
        target, planned_reason = candidates[cursor.index]
        has_next = cursor.index + 1 < len(candidates)
        if cursor.delay_s > 0:  # before the gate: a Retry-After waited out has cooled the target's domain till now
            await self._resilience.sleep_out(target, cursor.delay_s, self._sleep)
        gate = await self._gate(walk, target, has_next)
        if gate.refused is not None:
            walk.skipped(target, gate.refused)
            return moved(cursor)
        walk.reason = planned_reason or walk.reason
        began = self._clock()
        try:
            called = await self._call(walk, target, gate, began, has_next)
        except RequestError as exc:
            step, wait_s = self._after_failure(walk, target, gate, exc, began, cursor.same)
            after = after_failed(cursor, step, wait_s, self._resilience.domain(target))
            if after is None:
                raise
            if step == "fail_over":
                walk.failed_over(target, exc)
            return after
        return self._answered(walk, target, gate, called, [t for t, _ in candidates[cursor.index + 1 :]])

    def _arranged(self, walk: Walk) -> list[tuple[Target, str]]:
        """The door `arrange the candidates`: the plan's order, then the traffic controls' (drains, pins,
        graded switches, live weights: serve_apps/traffic/controls.py)."""
        arranged = candidates(walk.plan, walk.contract)
        if self._traffic is not None:
            arranged, note = self._traffic.arrange(walk.contract, arranged)
            walk.notes.append(note)
        return arranged

    async def _gate(self, walk: Walk, target: Target, has_next: bool) -> Gate:
        """The door `refuse a target`: each refusal (serve_apps/dispatch/walk.py), then the resilience gate."""
        for refusal in self._refusals:
            if (why := refusal(walk, target)) is not None:
                return Gate(why)
        return await self._resilience.gate(target, has_alternative=has_next, tokens=walk.tokens)

    def _too_small(self, walk: Walk, target: Target) -> str | None:
        return self._resilience.windows.too_small(target, walk.contract.min_context)

    def _body_for(self, walk: Walk, target: Target, body: dict[str, Any]) -> dict[str, Any]:
        """The door `shape the body for a target`: the per-tenant prefix-cache salt for local engines
        (router/request/cache_salt.py), the cost ceiling's output bound for providers (router/limits/budget.py)."""
        return (
            salted(body, walk.contract.tenant) if target.kind == "local" else bounded_body(body, walk.contract, target)
        )

    async def _call(self, walk: Walk, target: Target, gate: Gate, began: float, has_next: bool) -> Called:
        """One attempt: the body shaped for `target` and the session's turn, the call, the output checks."""
        try:
            sent = await walk.turn.body_for(target, self._body_for(walk, target, walk.body))
            watch = walk.abandon_by(has_next, self._resilience.max_attempts)
            reply = await self._calls.call(target, walk.kind, sent, walk.request_id, watch_stale=watch)
            flagged: list[str] = []
            if reply.chunks is not None and holds_back(walk.kind, walk.contract):
                reply = await held_until_checked(reply, walk.contract, target, self.checks)
            reply, headers = await checked(walk.kind, reply, walk.contract, target, flagged, self.checks)
        except asyncio.CancelledError as cut:  # gateway.request_timeout_s, or the client went away
            walk.trail.append(attempt := cut_attempt(target, cut, self._clock() - began, walk.contract))
            self._resilience.cut(walk.request_id, target, attempt, gate.reservation, walk.tokens, walk.contract.tenant)
            raise
        return Called(sent, reply, headers, flagged, began)

    def _after_failure(
        self, walk: Walk, target: Target, gate: Gate, exc: RequestError, began: float, same: int
    ) -> tuple[AfterFailure, float]:
        """The door `observe an attempt's outcome`, for a failure (health, quota, spend, learned windows, the
        Retry-After rule); returns router/resilience/retry.py's next step and, to retry the same target, the delay."""
        res = self._resilience
        rule = res.failed(target, exc)
        res.settle(gate.reservation, 0)
        outcome = "contract_violation" if isinstance(exc, ContractViolation) else "error"
        spent = exc.usage if isinstance(exc, ContractViolation) else (0, 0)
        attempt = Attempt.priced(target, outcome, self._clock() - began, *spent, exc.code)
        if isinstance(exc, ContractViolation):  # the record says what broke it (bounded in router/output)
            attempt = replace(attempt, contract_errors=tuple(exc.errors))
        walk.trail.append(attempt)
        res.charge(walk.request_id, target, outcome, attempt.cost_usd, walk.contract.tenant)
        walk.failed(target, exc)
        if isinstance(exc, ProviderContextExceeded):
            res.windows.refused(target, walk.contract.min_context)
        wait = retry_after_wait(exc, walk, self._config.resilience.retry, self._clock())
        if wait is not None:
            walk.events.append({"kind": "retry_after", "target": target.id, "wait": wait.wait, "why": wait.why})
        waits_out = wait is not None and wait.wait
        step = after_failure(rule, same, res.budget.try_withdraw, wait_out=waits_out)
        delay = res.backoff.delay_s(same, getattr(exc, "retry_after_s", None)) if step == "retry_same" else 0.0
        return step, wait_out_delay(delay, res.shut_for_s(target)) if step == "retry_same" and waits_out else delay

    def _answered(self, walk: Walk, target: Target, gate: Gate, called: Called, rest: list[Target]) -> Dispatched:
        """The door `observe an attempt's outcome`, for an answer: a stream handed to the client streams
        (booked when it ends), or a complete answer checked for greedy loops, booked and priced now."""
        res, reply, headers = self._resilience, called.reply, called.headers
        route: Route = "local" if target.kind == "local" else "cloud"
        if walk.traffic_note():
            headers = {**headers, TRAFFIC: walk.traffic_note()}
        if reply.chunks is not None:
            contract, began = walk.contract, called.began
            streamed = StreamedAttempt(walk.request_id, contract.tenant, target, began, gate.reservation, walk.tokens)
            streamed.loop = self._loops.for_stream(target, called.sent)
            walk.streams.append(streamed)
            walk.trail.append(Attempt(target.id, "streaming", self._clock() - began))
            ended = walk.turn.stream_ended if walk.turn.active else None  # for the session's anchor, history
            local_body = salted(walk.body, contract.tenant)
            started = Started(walk.kind, contract, walk.body, local_body, streamed, reply.chunks, rest,
                              walk.deadline, walk.made(), walk.client_usage, ended)  # fmt: skip
            return Dispatched(self._streams.reply(started), route, target.endpoint, walk.reason, 0.0, headers)
        attempt = Attempt.priced(target, "ok", self._clock() - called.began, *usage(reply))
        loop = self._loops.loop(target, called.sent, reply.body)
        if loop is not None:
            called.flagged.append(f"{LOOP_FLAG}: {loop}")
            headers = {**headers, DEGRADED: LOOP_FLAG}
        contract_header = headers.get(CONTRACT_HEADER)
        walk.trail.append(replace(attempt, contract=contract_header, contract_errors=tuple(called.flagged)))
        res.charge(walk.request_id, target, "ok", attempt.cost_usd, walk.contract.tenant)
        res.settle(gate.reservation, sum(usage(reply)) or walk.tokens)
        res.output_failed(target) if loop is not None else res.succeeded(target)
        return Dispatched(reply, route, target.endpoint, walk.reason, 0.0, headers)
