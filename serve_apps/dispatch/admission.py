"""Local admission: how many requests a model may have in flight, who is in flight, who waits.

The gateway's own counters, per model, on the gateway's event loop:

    limit     calibrated models (`models[].perf` with an SLO): min(memory bound, compute bound) per
              replica for the live workload mix (cluster/capacity/bound.py) — the mean prompt / output
              tokens of the model's recent requests (serve_apps/dispatch/workload_mix.py; admission.mean_* before
              the first) and the replicas' prefix-cache hit rate as the prefix share — kept within
              [perf.min_admission_limit, perf.max_admission_limit]; `Limit.detail` says which bound and
              which inputs set it; the plans are made off the request path (admission_plans.py).
              Uncalibrated: the configured `admission_limit` per replica, else
              `admission.fraction` of the KV-predicted maximum concurrent sequences (cluster/capacity/memory.py).
              Either way summed over the replicas with fresh stats
    inflight  requests admitted to the model by every gateway replica and not done (a stream counts until it is
              consumed): leases in the shared store (reservations.py), taken by `admit` with the plan's limit
    waiting   requests in the bounded waiting room (`admission.queue_max`) for a local-only or
              no-cloud request while the model is saturated; each re-plans every `poll_s` until
              it may run, the deadline passes, or the room is full (429 local_capacity_exhausted)
    share     load-proportional spill (router/routing/local_share.py, off by default): the share of burstable
              requests kept local, moved by the latency and failures of the model's local calls
    forecast  deadline-aware spill (router/routing/deadline.py): the request's predicted local finish against its
              deadline, from the fit and the live load, and the running requests it would make late (each local
              request admitted with a forecast is kept, by its lease, with its deadline and predicted finish)
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

from cluster.capacity.compute_model import PerfParams
from cluster.capacity.memory import admission_limit, max_concurrent_sequences
from cluster.config.deployment import SpilloverConfig
from cluster.config.model_spec import ModelSpec
from cluster.config.perf import PerfSection
from router.errors import LocalCapacityExhausted
from router.request.contract import RequestContract
from router.routing.deadline import Load, LocalForecast, Running, StepModel, delay, forecast
from router.routing.local_share import LocalShare, ShareDraw
from router.routing.plan import Plan
from router.routing.snapshot import ClusterSnapshot, ReplicaStats
from serve_apps.backend import BackendReply
from serve_apps.dispatch.admission_plans import AdmissionPlans, PlanKey, replica_gpu_gib
from serve_apps.dispatch.interfaces import DispatchObserver
from serve_apps.dispatch.reservations import Reservations
from serve_apps.dispatch.workload_mix import WorkloadMix
from serve_apps.state.memory import MemoryStore


@dataclass(frozen=True)
class Waited:
    """How a wait for local room ended: the plan to run, seconds waited and re-plans made."""

    plan: Plan
    waited_s: float
    replans: int


@dataclass(frozen=True)
class Limit:
    """A model's admission limit (None: no limit) and, for calibrated models, what set it."""

    value: int | None
    detail: str = ""


class Admission:
    def __init__(
        self,
        config: SpilloverConfig,
        observer: DispatchObserver,
        *,
        clock: Callable[[], float],
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        poll_s: float = 0.05,
        plans: AdmissionPlans | None = None,
        reservations: Reservations | None = None,
    ) -> None:
        self._config = config
        self._observer = observer
        self._clock = clock
        self._sleep = sleep
        self._poll_s = poll_s
        self.reservations = reservations or Reservations(MemoryStore(clock=clock), "replica", sleep=sleep)
        self._waiting: dict[str, int] = defaultdict(int)
        self._last_limit: dict[str, int | None] = {}
        self._running: dict[str, dict[str, Running]] = defaultdict(dict)  # model -> lease holder -> its deadline
        self._fits: dict[str, PerfSection] = {}  # model -> the fit its last forecast used
        self._shares: dict[str, LocalShare] = {}  # model -> its load-proportional share (admission.local_share)
        self.mix = WorkloadMix()
        self._plans = plans or AdmissionPlans()  # made off the request path in the gateway

    def inflight(self, model: str) -> int:
        return self.reservations.inflight(model)

    def limit(self, model: str, snapshot: ClusterSnapshot, now: float) -> int | None:
        return self.limit_with_reason(model, snapshot, now).value

    def limit_with_reason(self, model: str, snapshot: ClusterSnapshot, now: float) -> Limit:
        """Per model, summed over the replicas with fresh stats (None: no fresh replica, or no KV
        budget): see the module docstring. The last one is the limit `admit` takes leases within."""
        limit = self._limit_with_reason(model, snapshot, now)
        self._last_limit[model] = limit.value
        return limit

    def _limit_with_reason(self, model: str, snapshot: ClusterSnapshot, now: float) -> Limit:
        spec = self._config.model(model)
        fresh = [r for r in snapshot.for_model(model) if snapshot.unusable(r, now) is None]
        if spec is None or not fresh:
            return Limit(None)
        unfitted = ""
        if spec.has_slo:
            fit, mismatch = spec.fit_for((r.cpu_class, r.precision) for r in fresh)
            if fit is not None and fit.has_slo:
                return self._live_limit(spec, fit, fresh, _hit_rate(fresh))
            # never a fit from another CPU or precision silently applied: the uncalibrated limit, and why
            why = mismatch or "the fit for this machine has no SLO"
            unfitted = f"compute bound off: {why} (run bench calibrate on this machine); "
        if spec.admission_limit is not None:
            return Limit(spec.admission_limit * len(fresh), unfitted + "models[].admission_limit" if unfitted else "")
        adm = self._config.admission
        total = 0
        for replica in fresh:
            if replica.kv_budget_tokens is None:
                return Limit(None)
            predicted = max_concurrent_sequences(
                replica.kv_budget_tokens, adm.mean_prompt_tokens, adm.mean_output_tokens
            )
            total += admission_limit(predicted, adm.fraction)
        return Limit(total, unfitted + "admission.fraction of the KV bound" if unfitted else "")

    def forecast(
        self, model: str, contract: RequestContract, snapshot: ClusterSnapshot, now: float, arrived: float | None
    ) -> LocalForecast | None:
        """Will the request, here since `arrived` (this clock; None: now), finish locally before its deadline
        (router/routing/deadline.py)? None where that cannot be told: `admission.deadline_spill` off, no deadline
        (the contract's, else perf.slo_e2e_p95_s), no fresh replica, or no fit that describes the replicas (another
        CPU class or precision). Call after `limit`."""
        spec = self._config.model(model)
        if not self._config.admission.deadline_spill or spec is None or not spec.perf:
            return None
        fresh = [r for r in snapshot.for_model(model) if snapshot.unusable(r, now) is None]
        perf, _ = spec.fit_for((r.cpu_class, r.precision) for r in fresh)
        if perf is None or not fresh:
            return None
        deadline_s = contract.deadline_ms / 1000 if contract.deadline_ms is not None else perf.slo_e2e_p95_s
        if deadline_s is None:
            return None
        self._fits[model] = perf
        adm, hit = self._config.admission, _hit_rate(fresh)
        prompt, output, _ = self._mix(model)
        load = Load(
            inflight=self.inflight(model),
            replicas=len(fresh),
            limit=self._last_limit.get(model),
            ahead=self._waiting[model],
            mean_prompt_tokens=prompt * (1 - hit),
            mean_output_tokens=output,
        )
        return forecast(
            _step_model(perf.params),
            load,
            prefill_tokens=contract.est_prompt_tokens * (1 - hit),
            output_tokens=contract.max_output_tokens,
            left_s=deadline_s - (0.0 if arrived is None else self._clock() - arrived),
            can_wait=self._waiting[model] < adm.queue_max,
            running=self._live_running(model),
            now=self._clock(),
        )

    def share(self, model: str, *, peek: bool = False) -> ShareDraw | None:
        """The request's turn in the model's load-proportional spill (router/routing/local_share.py); None where
        `admission.local_share` is off, or for a peek (which takes no turn)."""
        settings = self._config.admission.local_share
        if not settings.enabled or peek:
            return None
        if model not in self._shares:
            self._shares[model] = LocalShare(settings, self._clock())
        return self._shares[model].draw(self._clock())

    def _mix(self, model: str) -> tuple[float, float, str]:
        """The model's mean prompt and output tokens (its recent requests, else admission.mean_*) and their source."""
        mix, adm = self.mix.mean(model), self._config.admission
        if mix is not None:
            return mix.prompt_tokens, mix.output_tokens, f"the last {mix.requests} requests"
        return adm.mean_prompt_tokens, adm.mean_output_tokens, "admission.mean_* (no request yet)"

    def _live_running(self, model: str) -> list[Running]:
        """The local requests of `model` still holding their lease (a stream until consumed); the others forgotten."""
        running = self._running[model]
        for holder in [h for h in running if not self.reservations.live(h)]:
            del running[holder]
        return list(running.values())

    def _track(self, model: str, request_id: str, plan: Plan) -> None:
        """A request admitted locally with a forecast: its deadline and predicted finish are kept until it is done,
        and the running ones' predicted finishes move by the delay it adds (router/routing/deadline.py)."""
        fit, fc, holder = self._fits.get(model), plan.forecast, self.reservations.holder_of(request_id)
        if fc is None or fit is None or holder is None:
            return
        now, params = self._clock(), _step_model(fit.params)
        self._live_running(model)
        running = self._running[model]
        for other, r in running.items():
            added = delay(params, r, now, prefill_tokens=fc.prefill_tokens, output_tokens=fc.output_tokens)
            running[other] = Running(r.deadline_at, r.finish_at + added)
        running[holder] = Running(now + fc.left_s, now + fc.e2e_s)

    def warm(self, snapshot: ClusterSnapshot, now: float) -> None:
        """Ask for every calibrated model's plan on a fresh snapshot, so that it is made before a request needs it."""
        for spec in self._config.models:
            if spec.has_slo:
                self.limit_with_reason(spec.alias, snapshot, now)

    def _live_limit(self, spec: ModelSpec, perf: PerfSection, replicas: list[ReplicaStats], share: float) -> Limit:
        adm, prefix_share = self._config.admission, share
        kv_tokens = [r.kv_budget_tokens for r in replicas]
        if any(tokens is None for tokens in kv_tokens):
            return Limit(None)
        prompt, output, source = self._mix(spec.alias)
        # the inputs to two significant digits (prefix share to 0.05): the limit need not follow a mix
        # that moved by a token, and the plan (an engine simulation) is memoised on them
        prompt, output, prefix_share = _sig2(prompt), max(1, _sig2(output)), min(0.95, round(prefix_share * 20) / 20)
        total, first, fit = 0, None, spec.perf.index(perf)
        for replica, tokens in zip(replicas, kv_tokens, strict=True):
            memory = admission_limit(max_concurrent_sequences(tokens or 0, prompt, output, prefix_share), adm.fraction)
            key = PlanKey(spec.alias, memory, prompt, output, prefix_share, replica_gpu_gib(spec, replica), fit)
            planned = self._plans.plan(spec, key)
            if planned.plan is None or planned.key is None:  # none made yet for this model: the floor until it is
                total += perf.min_admission_limit
                continue
            first = first or planned
            value = max(planned.plan.admission_limit, perf.min_admission_limit)
            total += value if perf.max_admission_limit is None else min(value, perf.max_admission_limit)
        if first is None or first.plan is None or first.key is None:
            return Limit(total, f"compute plan pending: perf.min_admission_limit x {len(kv_tokens)} replica(s)")
        plan, made_for = first.plan, first.key
        mix_now = f"prompt {prompt:.0f}, output {output:.0f}, prefix {prefix_share:.2f}"
        mix_made = f"prompt {made_for.prompt_tokens:.0f}, output {made_for.output_tokens:.0f}, "
        mix_made += f"prefix {made_for.prefix_share:.2f}"
        if mix_made != mix_now:  # the previous mix's plan admits while this one's is made
            source = f"an earlier mix ({mix_now} from {source}: its plan is being computed)"
        compute = plan.compute.concurrency if plan.compute else None
        slos = [f"e2e p95 <= {perf.slo_e2e_p95_s:g} s"] if perf.slo_e2e_p95_s is not None else []
        slos += [f"ttft p95 <= {perf.slo_ttft_p95_s:g} s"] if perf.slo_ttft_p95_s is not None else []
        detail = (
            f"{plan.bound} bound: min(memory {plan.memory_limit}, compute "
            f"{compute if compute is not None else '>= memory'}) x {len(kv_tokens)} replica(s) for "
            f"{' and '.join(slos)} at {mix_made} from {source}"
        )
        if total != plan.admission_limit * len(kv_tokens):
            detail += f"; within perf bounds [{perf.min_admission_limit}, {perf.max_admission_limit or '-'}]"
        return Limit(total, detail)

    async def wait_for_room(self, model: str, plan: Plan, replan: Callable[[], Plan], deadline: float) -> Waited:
        """Wait (bounded room, bounded time) until `replan()` no longer says "wait"."""
        queue_max = self._config.admission.queue_max
        if self._waiting[model] >= queue_max:
            self._observer.waited(model, 0.0, "rejected")
            raise LocalCapacityExhausted(f"{plan.reason}; waiting room full ({queue_max} requests)")
        self._waiting[model] += 1
        self._observer.waiting(model, self._waiting[model])
        started, replans = self._clock(), 0
        try:
            while plan.route == "wait":
                if self._clock() >= deadline:
                    waited = self._clock() - started
                    self._observer.waited(model, waited, "timeout")
                    raise LocalCapacityExhausted(f"{plan.reason}; no local room after {waited:.1f}s")
                await self._sleep(self._poll_s)
                plan, replans = replan(), replans + 1
            waited = self._clock() - started
            self._observer.waited(model, waited, plan.route)
            return Waited(plan, waited, replans)
        finally:
            self._waiting[model] -= 1
            self._observer.waiting(model, self._waiting[model])

    async def admit(
        self, model: str, plan: Plan, replan: Callable[[], Plan], deadline: float, request_id: str
    ) -> Waited:
        """The plan the request runs: waited for while it says "wait"; one that goes local holds a lease within the
        model's limit (`finish(request_id)` gives it back). A lease refused (other gateways filled the model) reads
        the model as full: the request is planned again, so it bursts or waits."""
        waited = Waited(plan, 0.0, 0)
        while True:
            if waited.plan.route == "wait":
                more = await self.wait_for_room(model, waited.plan, replan, deadline)
                waited = Waited(more.plan, waited.waited_s + more.waited_s, waited.replans + more.replans)
            if waited.plan.route != "local" or waited.plan.local is None:
                return waited
            snapshot_limit = self._last_limit.get(model)
            if await self.reservations.reserve(model, request_id, snapshot_limit):
                self._track(model, request_id, waited.plan)
                return waited
            waited = Waited(replan(), waited.waited_s, waited.replans + 1)

    def finish(self, request_id: str) -> None:
        """The dispatch of `request_id` is over: its lease goes once its local streams are consumed too."""
        self.reservations.finish(request_id)

    def observe(self, model: str, prompt_tokens: int, output_tokens: int) -> None:
        """Count one request of `model` in its live workload mix."""
        self.mix.observe(model, prompt_tokens, output_tokens)

    async def counted(self, model: str, call: Awaitable[BackendReply], request_id: str) -> BackendReply:
        """Run a local call counted in flight until its answer (or its stream) is done; its end-to-end latency (a
        stream's to its last byte) or its failure moves the model's load-proportional share when that is on."""
        try:
            reservation = await self.reservations.counted(model, request_id)
        except BaseException:
            if asyncio.iscoroutine(call):
                call.close()  # never started
            raise
        began, share = self._clock(), self._shares.get(model)
        try:
            reply = await call
        except BaseException as exc:
            self.reservations.release(reservation)
            if share is not None and isinstance(exc, Exception):  # a cut (cancellation) says nothing of the engine
                share.observe(self._clock(), None)
            raise
        if reply.chunks is None:
            self.reservations.release(reservation)
            if share is not None:
                share.observe(self._clock(), self._clock() - began)
            return reply
        chunks = self.reservations.until_done(reservation, reply.chunks)
        return BackendReply(chunks=chunks if share is None else self._timed(share, began, chunks))

    async def _timed(self, share: LocalShare, began: float, chunks: AsyncIterator[str]) -> AsyncIterator[str]:
        """A local stream passed through; its end (or its failure) told to the load-proportional share. A stream
        closed by its reader (after its last event, or a client gone) ends there."""
        failed = False
        try:
            async for chunk in chunks:
                yield chunk
        except Exception:
            failed = True
            raise
        finally:
            share.observe(self._clock(), None if failed else self._clock() - began)


def _step_model(p: PerfParams) -> StepModel:
    return StepModel(p.request_overhead_s, p.step_s, p.per_sequence_s, p.per_prefill_token_s, p.tail_e2e)


def _hit_rate(replicas: list[ReplicaStats]) -> float:
    """The replicas' prefix-cache hit rate (tokens found / queried), capped below 1."""
    queries = sum(r.prefix_cache_queries for r in replicas)
    return min(0.99, sum(r.prefix_cache_hits for r in replicas) / queries) if queries else 0.0


def _sig2(value: float) -> int:
    """A token count to two significant digits: 1234 → 1200, 64 → 64, 7 → 7 (0.4 → 0)."""
    if value < 100:
        return round(value)
    scale = 10 ** (len(str(round(value))) - 2)
    return round(value / scale) * scale
