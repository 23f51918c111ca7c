"""Dispatch one request: local replica or cloud provider, with admission and a waiting room.

The decision itself is `router.burst.decide` (pure). This module owns the gateway's mutable
state for it — per-model in-flight counts, waiting counts, hysteresis latches — and the
awaiting: calling the local backend or a provider, or waiting (bounded by the request's
deadline) for local room when the request may not, or cannot, burst.

A local call that fails before its first byte (replica gone, engine unavailable) is retried
on the cloud once when the request may burst. So is one still waiting for its first byte when
every replica of the model goes stale (a dead replica's requests are held by Serve until a new
one starts): the local call is cancelled and the cloud answers. After the first byte nothing is
re-sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from cluster.capacity import admission_limit, max_concurrent_sequences
from cluster.config import SpilloverConfig
from cluster.telemetry import ClusterSnapshot
from router.burst import BurstInputs, Route, RouteDecision, decide
from router.errors import LocalCapacityExhausted, TargetUnavailable
from router.openai_request import Kind
from serve_apps.backend import BackendReply, ModelBackend


class CloudBackend(Protocol):
    @property
    def name(self) -> str: ...

    async def chat(self, alias: str, body: dict[str, Any], request_id: str) -> Any:
        """Returns an object with `body` (dict | None) and `chunks` (async iterator | None)."""
        ...


@dataclass(frozen=True)
class Dispatched:
    reply: BackendReply
    route: Route
    target: str
    reason: str
    waited_s: float


class DispatchObserver(Protocol):
    def waiting(self, model: str, count: int) -> None: ...

    def waited(self, model: str, seconds: float, outcome: str) -> None: ...


class _NoObserver:
    def waiting(self, model: str, count: int) -> None:
        return None

    def waited(self, model: str, seconds: float, outcome: str) -> None:
        return None


class LocalDispatch:
    """Everything local, no admission: for a gateway without burst configured (and tests)."""

    def __init__(self, local: ModelBackend) -> None:
        self._local = local

    async def dispatch(
        self, model: str, kind: Kind, body: dict[str, Any], request_id: str, *, local_only: bool, deadline_s: float
    ) -> Dispatched:
        reply = await self._local.call(model, kind, body, request_id)
        return Dispatched(reply, "local", f"local:{model}", "local (burst not configured)", 0.0)


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
    ) -> None:
        self._config = config
        self._local = local
        self._providers = dict(providers)
        self._snapshot = snapshot
        self._clock = clock
        self._sleep = sleep
        self._poll_s = poll_s
        self._observer = observer or _NoObserver()
        self._inflight: dict[str, int] = defaultdict(int)
        self._waiting: dict[str, int] = defaultdict(int)
        self._latched: dict[str, frozenset[str]] = defaultdict(frozenset)

    def inflight(self, model: str) -> int:
        return self._inflight[model]

    def providers_for(self, model: str, kind: Kind) -> tuple[str, ...]:
        if kind != "chat":
            return ()  # providers are reached through their chat API only
        return tuple(
            p.name
            for p in self._config.cloud.providers
            if p.enabled and model in p.models and p.name in self._providers
        )

    def admission_limit(self, model: str, snapshot: ClusterSnapshot, now: float) -> int | None:
        """Per model: the configured per-replica limit, else 80% of the KV-predicted maximum,
        summed over the replicas with fresh stats."""
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

    def decide(self, model: str, kind: Kind, local_only: bool) -> RouteDecision:
        snapshot = self._snapshot()
        now = self._clock()
        inputs = BurstInputs(
            model=model,
            watermarks=self._config.watermarks_for(model),
            inflight=self._inflight[model],
            admission_limit=self.admission_limit(model, snapshot, now),
            local_only=local_only,
            providers=self.providers_for(model, kind),
        )
        decision = decide(inputs, snapshot, now, self._latched[model])
        self._latched[model] = decision.latched
        return decision

    async def dispatch(
        self, model: str, kind: Kind, body: dict[str, Any], request_id: str, *, local_only: bool, deadline_s: float
    ) -> Dispatched:
        started = self._clock()
        decision = self.decide(model, kind, local_only)
        if decision.route == "wait":
            decision = await self._wait_for_room(model, kind, local_only, decision, started + deadline_s)
        waited = self._clock() - started
        if decision.route == "cloud":
            reply = await self._cloud(decision.target.removeprefix("cloud:"), model, body, request_id)
            return Dispatched(reply, "cloud", decision.target, decision.reason, waited)
        providers = () if local_only else self.providers_for(model, kind)
        try:
            reply = await self._local_unless_stale(model, kind, body, request_id, watch=bool(providers))
        except TargetUnavailable as exc:
            if not providers:
                raise
            reason = f"local {model} failed before the first byte: {exc.message}"[:300]
            reply = await self._cloud(providers[0], model, body, request_id)
            return Dispatched(reply, "cloud", f"cloud:{providers[0]}", reason, waited)
        return Dispatched(reply, "local", decision.target, decision.reason, waited)

    async def _local_unless_stale(
        self, model: str, kind: Kind, body: dict[str, Any], request_id: str, *, watch: bool
    ) -> BackendReply:
        """The local call; with `watch`, abandoned (TargetUnavailable) if every replica of the
        model goes stale before the first byte arrives."""
        call = asyncio.ensure_future(self._run_local(model, kind, body, request_id))
        if not watch:
            return await call
        try:
            while True:
                done, _ = await asyncio.wait({call}, timeout=self._poll_s)
                if done:
                    return call.result()
                snapshot, now = self._snapshot(), self._clock()
                replicas = snapshot.for_model(model)
                if all(snapshot.is_stale(r, now) for r in replicas):
                    raise TargetUnavailable(f"every replica of {model} went stale while waiting for the first byte")
        finally:
            if not call.done():
                call.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await call  # let the local call unwind (in-flight count, Serve cancel)

    async def _wait_for_room(
        self, model: str, kind: Kind, local_only: bool, decision: RouteDecision, deadline: float
    ) -> RouteDecision:
        queue_max = self._config.admission.queue_max
        if self._waiting[model] >= queue_max:
            self._observer.waited(model, 0.0, "rejected")
            raise LocalCapacityExhausted(f"{decision.reason}; waiting room full ({queue_max} requests)")
        self._waiting[model] += 1
        self._observer.waiting(model, self._waiting[model])
        started = self._clock()
        try:
            while decision.route == "wait":
                if self._clock() >= deadline:
                    self._observer.waited(model, self._clock() - started, "timeout")
                    waited = self._clock() - started
                    raise LocalCapacityExhausted(f"{decision.reason}; no local room after {waited:.1f}s")
                await self._sleep(self._poll_s)
                decision = self.decide(model, kind, local_only)
            self._observer.waited(model, self._clock() - started, decision.route)
            return decision
        finally:
            self._waiting[model] -= 1
            self._observer.waiting(model, self._waiting[model])

    async def _run_local(self, model: str, kind: Kind, body: dict[str, Any], request_id: str) -> BackendReply:
        self._inflight[model] += 1
        try:
            reply = await self._local.call(model, kind, body, request_id)
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

    async def _cloud(self, provider: str, model: str, body: dict[str, Any], request_id: str) -> BackendReply:
        reply = await self._providers[provider].chat(model, body, request_id)
        return BackendReply(body=reply.body, chunks=reply.chunks)
