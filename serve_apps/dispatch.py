"""Dispatch one request: plan it, wait for local room if it must, run the attempts, record why.

The decisions are pure (`router.plan.plan_request`: contract pipeline, then burst decision);
this module owns the gateway's mutable state for them — per-model in-flight and waiting counts,
hysteresis latches, the decision store — and the awaiting.

Attempts (`serve_apps.resilience` holds the state, `router.failure` the table):
* candidates are the planned target, then — unless the request is `local_only` — the capable cloud
  targets in ranked order; red/black health or an open breaker keeps a target out of the plan, and
  just before an attempt its gate may still skip it (health share, half-open trial, quota);
* after a failure the table decides: retry the same target once after a full-jitter backoff
  (honouring Retry-After), fail over to the next candidate, or return the error to the client; a
  429 whose short Retry-After fits the deadline is waited out on the same target when the
  scenario's strategy says so (router/retry.py `retry_after_choice`);
* a provider's 400 context_length_exceeded fails over and is remembered for that request size
  (serve_apps/learned_windows.py);
* a local call still waiting for its first byte when every replica of the model goes stale (Serve
  holds a dead replica's requests until a new one starts) or reports a fault (numerics failed, engine
  stalled) is abandoned and fails over; a complete greedy answer stuck in a loop is flagged and counts
  as an output failure of its target (serve_apps/output_loops.py);
* an L1 answer that breaks its output contract moves on to the next capable target, or ends as
  502 contract_violation;
* a candidate whose cost estimate is above what the request's cost ceiling leaves after the earlier
  attempts is skipped with the reason (router/budget.py), which the final error also names;
* at most `resilience.retry.max_attempts` attempts start, none after the request's deadline, and
  retries against the domain that just failed draw on the gateway-wide retry budget.
After the first byte of a stream nothing is re-sent: a failure ends the stream with an error event,
unless the scenario continues streams and the next candidate that accepts a prefill continues the
text answer in the same response (serve_apps/continuation.py). A stream is booked when it ends
(serve_apps/stream_record.py): its tokens, cost and real outcome reach the record, the spend ledger
and the metrics then.
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import replace
from functools import partial
from typing import Any

from cluster.config import SpilloverConfig
from router.budget import bounded_body, ceiling_refusal, spent_usd
from router.burst import Route
from router.cache_salt import salted
from router.capabilities import Registry, Target
from router.contract import RequestContract
from router.decision import Attempt, DecisionStore
from router.errors import (
    ContractViolation,
    ProviderContextExceeded,
    ProviderRateLimited,
    RequestError,
    TargetUnavailable,
)
from router.headers import DEGRADED, TRAFFIC
from router.openai_request import Kind
from router.output_contract import CONTRACT_HEADER
from router.plan import Plan, PlanInputs, plan_request
from router.quality import QualityBook, contract_bucket
from router.retry import AttemptBudget, RetryAfterChoice, after_failure, before_attempt, retry_after_choice
from router.snapshot import ClusterSnapshot
from serve_apps.admission import Admission, Waited
from serve_apps.backend import CloudBackend, ModelBackend
from serve_apps.check_pool import CheckPool
from serve_apps.dispatch_calls import Calls
from serve_apps.dispatch_record import Outcome, cut_attempt, cut_reason, executed_record
from serve_apps.dispatch_streams import ClientStreams, Started
from serve_apps.dispatch_types import Dispatched, DispatchObserver, NoObserver
from serve_apps.output_check import checked, usage
from serve_apps.output_loops import FLAG as LOOP_FLAG
from serve_apps.output_loops import LoopCheck
from serve_apps.resilience import Gate, Resilience
from serve_apps.sessions import Sessions, Turn
from serve_apps.stream_account import asking_usage, wants_usage
from serve_apps.stream_contract import held_until_checked, holds_back
from serve_apps.stream_record import StreamedAttempt
from serve_apps.traffic import Traffic


class Dispatcher:
    def __init__(
        self,
        config: SpilloverConfig,
        local: ModelBackend,
        providers: Mapping[str, CloudBackend],
        snapshot: Callable[[], ClusterSnapshot],
        *,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        poll_s: float = 0.05,
        observer: DispatchObserver | None = None,
        decisions: DecisionStore | None = None,
        resilience: Resilience | None = None,
        traffic: Traffic | None = None,
        sessions: Sessions | None = None,
        quality: QualityBook | None = None,
        checks: CheckPool | None = None,
    ) -> None:
        self._config = config
        self._providers = dict(providers)
        self._registry = Registry.from_config(
            config.models, [p for p in config.cloud.providers if p.name in self._providers], routes=config.routes
        )
        self._snapshot = snapshot
        # deadlines, waits, latencies on `clock` (monotonic: a wall-clock step must not end or stretch a request);
        # record timestamps and stats freshness (the snapshot's `read_at`) on `wall`; a lone injected `clock`: both
        self._clock = clock
        self._wall = wall if wall is not None else time.time if clock is time.monotonic else clock
        self._sleep = sleep
        self._observer = observer or NoObserver()
        self.decisions = decisions if decisions is not None else DecisionStore()  # an empty store is falsy
        self._resilience = resilience or Resilience(config, clock=clock, wall=self._wall)
        self._admission = Admission(config, self._observer, clock=clock, sleep=sleep, poll_s=poll_s)
        self._latched: dict[str, frozenset[str]] = defaultdict(frozenset)
        self._calls = Calls(local, self._providers, self._admission, snapshot, self._wall, poll_s)
        self._loops = LoopCheck(config)
        self._traffic = traffic  # operator drains / pins and graded switches (serve_apps/traffic.py)
        self.sessions = sessions or Sessions(config, local)  # pins, anchor, compression (serve_apps/sessions.py)
        self._quality = quality  # learned per-bucket quality for the quality scorer (router/quality.py)
        self.checks = checks or CheckPool(name="schema-checks")  # output checks (serve_apps/check_pool.py)
        self._streams = ClientStreams(
            config,
            continuation=self._calls.continuation,
            resilience=self._resilience,
            decisions=self.decisions,
            observer=self._observer,
            clock=clock,
            wall=self._wall,
            traffic=traffic,
            checks=self.checks,
        )

    def inflight(self, model: str) -> int:
        return self._admission.inflight(model)

    def admission_limit(self, model: str, snapshot: ClusterSnapshot, now: float) -> int | None:
        return self._admission.limit(model, snapshot, now)

    @property
    def resilience(self) -> Resilience:
        return self._resilience

    def behind(self, model: str, endpoint: str) -> tuple[Target, ...]:
        """The targets of `model` an answer marked `x-spillover-target: <endpoint>` may come from."""
        return tuple(t for t in self._registry.for_alias(model) if t.endpoint == endpoint)

    def plan(self, contract: RequestContract, kind: Kind) -> Plan:
        # a route's local model (router/capabilities.py): its replicas, admission and latches decide
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
            # providers are reached through their chat API only
            available_providers=frozenset(self._providers) if kind == "chat" else frozenset(),
            unavailable={
                **self._unavailable(contract),
                **self._resilience.windows.unavailable(self._registry.for_alias(contract.model), contract.min_context),
            },
            quality=self._learned(contract),
        )
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
        planned = turn.planner(partial(self.plan, kind=kind))
        plan = planned()
        waited = Waited(plan, 0.0, 0)
        done: Dispatched | None = None
        ended = ""
        trail: list[Attempt] = []
        notes: list[str] = []  # the graded switch the request ran under
        streams: list[StreamedAttempt] = []  # the attempt whose stream the client gets, booked when it ends
        events: list[dict[str, Any]] = []  # the record's events (a Retry-After waited out or not)
        try:
            if plan.route == "wait":
                waited = await self._admission.wait_for_room(local_model, plan, planned, started + deadline_s)
                plan = waited.plan
            done = await self._attempts(
                plan, kind, body, request_id, contract, trail, started + deadline_s, notes, streams, events, turn
            )
            await turn.close(trail, done)
            return replace(done, waited_s=waited.waited_s)
        except (RequestError, asyncio.CancelledError) as exc:  # the record says why it ended (a timeout's cut too)
            ended = exc.message if isinstance(exc, RequestError) else cut_reason(exc)
            raise
        finally:
            outcome = Outcome(started_at, waited, trail, done, ended, "".join(notes), events, turn.view())
            self._record(request_id, contract, plan, outcome, kind, streams)
            if self._traffic is not None and not (done is not None and streams):
                self._traffic.observed(contract, trail)  # the switch's gates (a stream's when it ends)

    def _record(
        self,
        request_id: str,
        contract: RequestContract,
        plan: Plan,
        outcome: Outcome,
        kind: Kind,
        streams: list[StreamedAttempt],
    ) -> None:
        """The executed plan's record (serve_apps/dispatch_record.py): stored, and shown to the observer
        (metrics); a stream's is stored unfinished and booked when the stream ends."""
        finished = executed_record(
            request_id,
            self._config.policy,
            contract,
            plan,
            outcome,
            targets=self._registry.for_alias(contract.model),
            reachable=self._providers if kind == "chat" else (),
            health=self._resilience.states(),
            clock=self._wall,
        )
        if outcome.done is not None and streams:  # final when its stream ends (serve_apps/stream_record.py)
            streams[0].record = finished
            self.decisions.put(finished, final=False)
            return
        self.decisions.put(finished)
        self._observer.recorded(finished)

    def _candidates(self, plan: Plan, contract: RequestContract) -> list[tuple[Target, str]]:
        if plan.route == "local" and plan.local is not None:
            fallback = [] if contract.local_only else [(t, "") for t in plan.cloud]
            return [(plan.local, plan.reason), *fallback]
        last = [(plan.local, "")] if plan.local_last and plan.local is not None else []
        return [(t, plan.reason if i == 0 else "") for i, t in enumerate(plan.cloud)] + last

    async def _attempts(
        self,
        plan: Plan,
        kind: Kind,
        body: dict[str, Any],
        request_id: str,
        contract: RequestContract,
        trail: list[Attempt],
        deadline: float,
        notes: list[str],
        streams: list[StreamedAttempt],
        events: list[dict[str, Any]],
        turn: Turn,
    ) -> Dispatched:
        """Walk the candidates, appending every attempt to `trail`. What comes next is decided by
        router/retry.py (`before_attempt`; `after_failure`, fed by `router.failure`'s table: retry the
        same target after a backoff, fail over to the next one, or give up); this loop carries it out."""
        res = self._resilience
        granted = res.budget.try_withdraw  # the gateway-wide retry budget (router/retry.py)
        candidates = self._candidates(plan, contract)
        if self._traffic is not None:
            candidates, note = self._traffic.arrange(contract, candidates)
            notes.append(note)
        client_usage, body = wants_usage(body), asking_usage(body)  # a stream's tokens are reported at its end
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
            if delay > 0:  # before the gate: a Retry-After waited out has cooled the target's domain till now
                await self._sleep(delay)
            # the cost ceiling less what earlier attempts spent (router/budget.py), a context window the target
            # refused before (serve_apps/learned_windows.py), then the resilience gate
            over = ceiling_refusal(contract, target, spent_usd(a.cost_usd for a in trail))
            too_small = self._resilience.windows.too_small(target, contract.min_context)
            if over is not None:
                gate = Gate(f"max cost: {over}")
                over_ceiling.append(f"{target.id} skipped: max cost: {over}")
            elif too_small is not None:
                gate = Gate(too_small)
            else:
                gate = res.gate(target, has_alternative=has_next, tokens=tokens)
            if gate.refused is not None:
                trail.append(Attempt(target.id, "skipped", 0.0, error=gate.refused[:200]))
                refusals.append(gate.refused)
                reason = f"{target.endpoint} skipped: {gate.refused}"[:300]
                index, same_retries, delay = index + 1, 0, 0.0
                continue
            reason = planned_reason or reason
            began = self._clock()
            try:
                sent = local_body if target.kind == "local" else bounded_body(body, contract, target)
                sent = await turn.body_for(target, sent)
                reply = await self._calls.call(target, kind, sent, request_id, watch_stale=has_next)
                flagged: list[str] = []
                if reply.chunks is not None and holds_back(kind, contract):
                    reply = await held_until_checked(reply, contract, target, self.checks)
                reply, headers = await checked(kind, reply, contract, target, flagged, self.checks)
            except asyncio.CancelledError as cut:  # gateway.request_timeout_s, or the client went away
                trail.append(attempt := cut_attempt(target, cut, self._clock() - began, contract))
                res.cut(request_id, target, attempt, gate.reservation, tokens, contract.tenant)
                raise
            except RequestError as exc:
                rule = res.failed(target, exc)
                res.settle(gate.reservation, 0)
                outcome = "contract_violation" if isinstance(exc, ContractViolation) else "error"
                spent = exc.usage if isinstance(exc, ContractViolation) else (0, 0)
                attempt = Attempt.priced(target, outcome, self._clock() - began, *spent, exc.code)
                trail.append(attempt)
                res.charge(request_id, target, outcome, attempt.cost_usd, contract.tenant)
                last_error, failed_domain = exc, res.domain(target)
                if isinstance(exc, ProviderContextExceeded):
                    self._resilience.windows.refused(target, contract.min_context)
                wait = self._retry_after(exc, contract, deadline)
                if wait is not None:
                    events.append({"kind": "retry_after", "target": target.id, "wait": wait.wait, "why": wait.why})
                step_after = after_failure(rule, same_retries, granted, wait_out=wait is not None and wait.wait)
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
            if reply.chunks is not None:
                streamed = StreamedAttempt(request_id, contract.tenant, target, began, gate.reservation, tokens)
                streamed.loop = self._loops.for_stream(target, sent)
                streams.append(streamed)
                trail.append(Attempt(target.id, "streaming", self._clock() - began))
                rest = [t for t, _ in candidates[index + 1 :]]
                made = sum(a.outcome != "skipped" for a in trail)
                ended = turn.stream_ended if turn.active else None  # the answer for the session's anchor, history
                started_stream = Started(
                    kind, contract, body, local_body, streamed, reply.chunks, rest, deadline, made, client_usage, ended
                )
                reply = self._streams.reply(started_stream)  # serve_apps/dispatch_streams.py
                route: Route = "local" if target.kind == "local" else "cloud"
                if notes and notes[-1]:
                    headers = {**headers, TRAFFIC: notes[-1]}
                return Dispatched(reply, route, target.endpoint, reason, 0.0, headers)
            attempt = Attempt.priced(target, "ok", self._clock() - began, *usage(reply))
            loop = self._loops.loop(target, sent, reply.body)
            if loop is not None:
                flagged.append(f"{LOOP_FLAG}: {loop}")
                headers = {**headers, DEGRADED: LOOP_FLAG}
            trail.append(replace(attempt, contract=headers.get(CONTRACT_HEADER), contract_errors=tuple(flagged)))
            res.charge(request_id, target, "ok", attempt.cost_usd, contract.tenant)
            res.settle(gate.reservation, sum(usage(reply)) or tokens)
            res.output_failed(target) if loop is not None else res.succeeded(target)
            route = "local" if target.kind == "local" else "cloud"
            if notes and notes[-1]:
                headers = {**headers, TRAFFIC: notes[-1]}
            return Dispatched(reply, route, target.endpoint, reason, 0.0, headers)
        if last_error is not None:
            if over_ceiling:  # the fall-overs the ceiling left out, in the error the client gets
                last_error.message = "; then ".join([last_error.message, *over_ceiling])[:1000]
            raise last_error
        raise TargetUnavailable("no target could take the request: " + "; ".join(refusals)[:500])

    def _retry_after(self, exc: RequestError, contract: RequestContract, deadline: float) -> RetryAfterChoice | None:
        """The Retry-After rule's choice for a 429 (router/retry.py), None for anything else."""
        if not isinstance(exc, ProviderRateLimited):
            return None
        retry = self._config.resilience.retry
        return retry_after_choice(
            exc.retry_after_s,
            contract.strategy,
            max_wait_s=retry.retry_after_wait_max_s,
            waiting_strategies=retry.retry_after_wait_strategies,
            now=self._clock(),
            deadline=deadline,
        )
