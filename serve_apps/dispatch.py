"""Dispatch one request: plan it, wait for local room if it must, run the attempts, record why.

The decisions are pure (`router.plan.plan_request`: contract pipeline, then burst decision);
this module owns the gateway's mutable state for them — per-model in-flight and waiting counts,
hysteresis latches, the decision store — and the awaiting.

Attempts (`serve_apps.resilience` holds the state, `router.failure` the table):
* candidates are the planned target, then — unless the request is `local_only` — the capable cloud
  targets in ranked order; red/black health or an open breaker keeps a target out of the plan, and
  just before an attempt its gate may still skip it (health share, half-open trial, quota);
* after a failure the table decides: retry the same target once after a full-jitter backoff
  (honouring Retry-After), fail over to the next candidate, or return the error to the client;
* a local call still waiting for its first byte when every replica of the model goes stale (Serve
  holds a dead replica's requests until a new one starts) is abandoned and fails over;
* an L1 answer that breaks its output contract moves on to the next capable target, or ends as
  502 contract_violation;
* a candidate whose cost estimate is above what the request's cost ceiling leaves after the earlier
  attempts is skipped with the reason (router/budget.py), which the final error also names;
* at most `resilience.retry.max_attempts` attempts start, none after the request's deadline, and
  retries against the domain that just failed draw on the gateway-wide retry budget.
After the first byte of a stream nothing is re-sent: a failure ends the stream with an error event.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import replace
from functools import partial
from typing import Any

from cluster.config import SpilloverConfig
from router.budget import bounded_body, ceiling_refusal, spent_usd
from router.burst import Route
from router.cache_salt import salted
from router.capabilities import Registry, Target
from router.contract import RequestContract
from router.decision import Attempt, DecisionRecord, DecisionStore
from router.errors import ContractViolation, RequestError, TargetUnavailable
from router.openai_request import Kind
from router.plan import Plan, PlanInputs, plan_request
from router.retry import AttemptBudget, after_failure, before_attempt
from router.snapshot import ClusterSnapshot
from serve_apps.admission import Admission, Waited
from serve_apps.backend import BackendReply, CloudBackend, ModelBackend
from serve_apps.dispatch_types import Dispatched, DispatchObserver, NoObserver
from serve_apps.output_check import checked, usage
from serve_apps.resilience import Resilience


class Dispatcher:
    def __init__(
        self,
        config: SpilloverConfig,
        local: ModelBackend,
        providers: Mapping[str, CloudBackend],
        snapshot: Callable[[], ClusterSnapshot],
        *,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        poll_s: float = 0.05,
        observer: DispatchObserver | None = None,
        decisions: DecisionStore | None = None,
        resilience: Resilience | None = None,
    ) -> None:
        self._config = config
        self._local = local
        self._providers = dict(providers)
        self._registry = Registry.from_config(
            config.models, [p for p in config.cloud.providers if p.name in self._providers], routes=config.routes
        )
        self._snapshot = snapshot
        self._clock = clock
        self._sleep = sleep
        self._poll_s = poll_s
        self._observer = observer or NoObserver()
        self.decisions = decisions if decisions is not None else DecisionStore()  # an empty store is falsy
        self._resilience = resilience or Resilience(config, clock=clock)
        self._admission = Admission(config, self._observer, clock=clock, sleep=sleep, poll_s=poll_s)
        self._latched: dict[str, frozenset[str]] = defaultdict(frozenset)

    def inflight(self, model: str) -> int:
        return self._admission.inflight(model)

    def admission_limit(self, model: str, snapshot: ClusterSnapshot, now: float) -> int | None:
        return self._admission.limit(model, snapshot, now)

    @property
    def resilience(self) -> Resilience:
        return self._resilience

    def plan(self, contract: RequestContract, kind: Kind) -> Plan:
        # a route's local model (router/capabilities.py): its replicas, admission and latches decide
        snapshot, now, model = self._snapshot(), self._clock(), self._registry.local_model(contract.model)
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
            # providers are reached through their chat API only
            available_providers=frozenset(self._providers) if kind == "chat" else frozenset(),
            unavailable=self._resilience.unavailable(self._registry.for_alias(contract.model)),
        )
        began = time.perf_counter()
        try:
            plan = plan_request(inputs, snapshot, now, self._latched[model])
        finally:
            self._observer.decided(time.perf_counter() - began)
        self._latched[model] = plan.latched
        return plan

    async def dispatch(
        self, kind: Kind, body: dict[str, Any], request_id: str, *, contract: RequestContract, deadline_s: float
    ) -> Dispatched:
        started = self._clock()
        self._resilience.budget.deposit()
        local_model = self._registry.local_model(contract.model)
        self._admission.observe(local_model, contract.est_prompt_tokens, contract.max_output_tokens)
        plan = self.plan(contract, kind)
        waited = Waited(plan, 0.0, 0)
        done: Dispatched | None = None
        ended = ""
        trail: list[Attempt] = []
        try:
            if plan.route == "wait":
                replan = partial(self.plan, contract, kind)
                waited = await self._admission.wait_for_room(local_model, plan, replan, started + deadline_s)
                plan = waited.plan
            done = await self._attempts(plan, kind, body, request_id, contract, trail, started + deadline_s)
            return replace(done, waited_s=waited.waited_s)
        except RequestError as exc:
            ended = exc.message
            raise
        finally:
            self._record(request_id, contract, plan, started, waited, trail, done, ended)

    def _record(
        self,
        request_id: str,
        contract: RequestContract,
        plan: Plan,
        started: float,
        waited: Waited,
        trail: list[Attempt],
        done: Dispatched | None,
        ended: str,
    ) -> None:
        """The decision record of the plan that was executed (after any wait and re-plans), its
        attempts and how it ended; stored, and shown to the observer (metrics)."""
        record = DecisionRecord.from_pipeline(
            request_id,
            self._config.policy,
            contract,
            plan.pipeline,
            clock=lambda: started,
            unavailable=plan.unavailable,
            health=self._resilience.states(),
        )
        route = done.route if done is not None else plan.route
        reason = done.reason if done is not None else (ended or plan.reason)
        executed = replace(
            record, attempts=tuple(trail), route=route, reason=reason, waited_s=waited.waited_s, replans=waited.replans
        )
        finished = executed.finished(done.target if done is not None else None, clock=self._clock)
        self.decisions.put(finished)
        self._observer.recorded(finished)

    def _candidates(self, plan: Plan, contract: RequestContract) -> list[tuple[Target, str]]:
        if plan.route == "local" and plan.local is not None:
            fallback = [] if contract.residency == "local_only" else [(t, "") for t in plan.cloud]
            return [(plan.local, plan.reason), *fallback]
        return [(t, plan.reason if i == 0 else "") for i, t in enumerate(plan.cloud)]

    async def _attempts(
        self,
        plan: Plan,
        kind: Kind,
        body: dict[str, Any],
        request_id: str,
        contract: RequestContract,
        trail: list[Attempt],
        deadline: float,
    ) -> Dispatched:
        """Walk the candidates, appending every attempt to `trail`. What comes next is decided by
        router/retry.py (`before_attempt`; `after_failure`, fed by `router.failure`'s table: retry the
        same target after a backoff, fail over to the next one, or give up); this loop carries it out."""
        res = self._resilience
        granted = res.budget.try_withdraw  # the gateway-wide retry budget (router/retry.py)
        candidates = self._candidates(plan, contract)
        local_body = salted(body, contract.tenant)  # per-tenant prefix cache (router/cache_salt.py)
        tokens = contract.est_prompt_tokens + contract.max_output_tokens
        budget = AttemptBudget(max_attempts=res.max_attempts, deadline=deadline)
        last_error: RequestError | None = None
        refusals: list[str] = []
        over_ceiling: list[str] = []
        reason = plan.reason
        index = same_retries = 0
        delay, failed_domain = 0.0, ""
        while index < len(candidates):
            target, planned_reason = candidates[index]
            has_next = index + 1 < len(candidates)
            attempts = sum(a.outcome != "skipped" for a in trail)
            into_failed = attempts > 0 and not same_retries and res.domain(target) == failed_domain
            step = before_attempt(
                attempts, budget, self._clock(), delay, into_failed_domain=into_failed, retry_granted=granted
            )
            if step == "stop":
                refusals.append(f"attempt budget spent ({attempts} of {budget.max_attempts}, or the deadline)")
                break
            if step == "skip":
                trail.append(Attempt(target.id, "skipped", 0.0, error="gateway retry budget exhausted"))
                index += 1
                continue
            # the cost ceiling less what earlier attempts spent (router/budget.py), then the resilience gate
            over = ceiling_refusal(contract, target, spent_usd(a.cost_usd for a in trail))
            gate = res.gate(target, has_alternative=has_next, tokens=tokens) if over is None else None
            refused = f"max cost: {over}" if gate is None else gate.refused
            if refused is not None or gate is None:
                refused = refused or ""
                trail.append(Attempt(target.id, "skipped", 0.0, error=refused[:200]))
                refusals.append(refused)
                if over is not None:
                    over_ceiling.append(f"{target.id} skipped: {refused}")
                reason = f"{target.endpoint} skipped: {refused}"[:300]
                index, same_retries, delay = index + 1, 0, 0.0
                continue
            if delay > 0:
                await self._sleep(delay)
            reason = planned_reason or reason
            began = self._clock()
            try:
                sent = local_body if target.kind == "local" else bounded_body(body, contract, target)
                reply = await self._call(target, kind, sent, request_id, watch_stale=has_next)
                reply, headers = await checked(kind, reply, contract, target)
            except RequestError as exc:
                rule = res.failed(target, exc)
                res.settle(gate.reservation, 0)
                outcome = "contract_violation" if isinstance(exc, ContractViolation) else "error"
                spent = exc.usage if isinstance(exc, ContractViolation) else (0, 0)
                attempt = Attempt.priced(target, outcome, self._clock() - began, *spent, exc.code)
                trail.append(attempt)
                res.charge(request_id, target, outcome, attempt.cost_usd, contract.tenant)
                last_error, failed_domain = exc, res.domain(target)
                step_after = after_failure(rule, same_retries, granted)
                if step_after == "retry_same":
                    delay = res.backoff.delay_s(same_retries, getattr(exc, "retry_after_s", None))
                    same_retries += 1
                    continue
                if step_after == "give_up":
                    raise
                index, same_retries, delay = index + 1, 0, 0.0
                if isinstance(exc, ContractViolation):
                    reason = f"{target.endpoint} broke the output contract"
                else:
                    reason = f"{target.endpoint} failed before the first byte: {exc.message}"[:300]
                continue
            attempt = Attempt.priced(target, "ok", self._clock() - began, *usage(reply))
            trail.append(attempt)
            res.charge(request_id, target, "ok", attempt.cost_usd, contract.tenant)
            res.settle(gate.reservation, sum(usage(reply)) or tokens)
            if reply.chunks is None:
                res.succeeded(target)
            else:
                reply = BackendReply(chunks=self._observed(target, reply.chunks))
            route: Route = "local" if target.kind == "local" else "cloud"
            return Dispatched(reply, route, target.endpoint, reason, 0.0, headers)
        if last_error is not None:
            if over_ceiling:  # the fall-overs the ceiling left out, in the error the client gets
                last_error.message = "; then ".join([last_error.message, *over_ceiling])[:1000]
            raise last_error
        raise TargetUnavailable("no target could take the request: " + "; ".join(refusals)[:500])

    async def _observed(self, target: Target, chunks: AsyncIterator[str]) -> AsyncIterator[str]:
        """A stream's outcome reaches breakers and health when it ends (it is never re-sent)."""
        try:
            async for chunk in chunks:
                yield chunk
        except RequestError as exc:
            self._resilience.failed(target, exc)
            raise
        else:
            self._resilience.succeeded(target)

    async def _call(
        self, target: Target, kind: Kind, body: dict[str, Any], request_id: str, *, watch_stale: bool
    ) -> BackendReply:
        if target.kind == "local":
            body = body if body.get("model") == target.alias else {**body, "model": target.alias}  # a route's name
            return await self._local_unless_stale(target.alias, kind, body, request_id, watch=watch_stale)
        return await self._providers[target.provider or ""].chat(target.alias, body, request_id)

    async def _local_unless_stale(
        self, model: str, kind: Kind, body: dict[str, Any], request_id: str, *, watch: bool
    ) -> BackendReply:
        """The local call; with `watch`, abandoned (TargetUnavailable) if every replica of the
        model goes stale before the first byte arrives."""
        call = asyncio.ensure_future(self._admission.counted(model, self._local.call(model, kind, body, request_id)))
        if not watch:
            return await call
        try:
            while True:
                done, _ = await asyncio.wait({call}, timeout=self._poll_s)
                if done:
                    return call.result()
                snapshot, now = self._snapshot(), self._clock()
                if all(snapshot.is_stale(r, now) for r in snapshot.for_model(model)):
                    message = f"every replica of {model} went stale while waiting for the first byte"
                    raise TargetUnavailable(message, code="replicas_stale")
        finally:
            if not call.done():
                call.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await call  # let the local call unwind (in-flight count, Serve cancel)
