"""Local admission: how many requests a model may have in flight, who is in flight, who waits.

The gateway's own counters, per model, on the gateway's event loop:

    limit     the configured `admission_limit` per replica, else `admission.fraction` of the KV-predicted
              maximum concurrent sequences (cluster/capacity.py), summed over the replicas with fresh stats
    inflight  local calls started and not finished (a stream counts until it is consumed)
    waiting   requests in the bounded waiting room (`admission.queue_max`) for a local-only or
              no-cloud request while the model is saturated; each re-plans every `poll_s` until
              it may run, the deadline passes, or the room is full (429 local_capacity_exhausted)
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

from cluster.capacity import admission_limit, max_concurrent_sequences
from cluster.config import SpilloverConfig
from router.errors import LocalCapacityExhausted
from router.plan import Plan
from router.snapshot import ClusterSnapshot
from serve_apps.backend import BackendReply
from serve_apps.dispatch_types import DispatchObserver


@dataclass(frozen=True)
class Waited:
    """How a wait for local room ended: the plan to run, seconds waited and re-plans made."""

    plan: Plan
    waited_s: float
    replans: int


class Admission:
    def __init__(
        self,
        config: SpilloverConfig,
        observer: DispatchObserver,
        *,
        clock: Callable[[], float],
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        poll_s: float = 0.05,
    ) -> None:
        self._config = config
        self._observer = observer
        self._clock = clock
        self._sleep = sleep
        self._poll_s = poll_s
        self._inflight: dict[str, int] = defaultdict(int)
        self._waiting: dict[str, int] = defaultdict(int)

    def inflight(self, model: str) -> int:
        return self._inflight[model]

    def limit(self, model: str, snapshot: ClusterSnapshot, now: float) -> int | None:
        """Per model: the configured per-replica limit, else `admission.fraction` of the KV-predicted
        maximum, summed over the replicas with fresh stats (None: no fresh replica, or no KV budget)."""
        spec = self._config.model(model)
        fresh = [r for r in snapshot.for_model(model) if not snapshot.is_stale(r, now)]
        if spec is None or not fresh:
            return None
        if spec.admission_limit is not None:
            return spec.admission_limit * len(fresh)
        adm = self._config.admission
        total = 0
        for replica in fresh:
            if replica.kv_budget_tokens is None:
                return None
            predicted = max_concurrent_sequences(
                replica.kv_budget_tokens, adm.mean_prompt_tokens, adm.mean_output_tokens
            )
            total += admission_limit(predicted, adm.fraction)
        return total

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

    async def counted(self, model: str, call: Awaitable[BackendReply]) -> BackendReply:
        """Run a local call counted in flight until its answer (or its stream) is done."""
        self._inflight[model] += 1
        try:
            reply = await call
        except BaseException:
            self._inflight[model] -= 1
            raise
        if reply.chunks is None:
            self._inflight[model] -= 1
            return reply
        return BackendReply(chunks=self._count_until_done(model, reply.chunks))

    async def _count_until_done(self, model: str, chunks: AsyncIterator[str]) -> AsyncIterator[str]:
        try:
            async for chunk in chunks:
                yield chunk
        finally:
            self._inflight[model] -= 1
