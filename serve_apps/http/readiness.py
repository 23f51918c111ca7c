"""`GET /readyz`: a gateway is ready when every local model it serves would be routed to.

Per model, the first reason found keeps it not ready: its deployment fails its health check; with a
telemetry source, no fresh stats reading on this gateway yet (after a deploy the board may hold only an
earlier replica's last reading, and the gateway would divert the model's traffic); its health is red or
black here (probed while its engine loaded); it has not (yet) answered its golden prompt right.

With a shared store (`state.url`) the body also says whether it answers (`state`): a store that is down
keeps no model from being ready, since the replica serves from its own state meanwhile
(serve_apps/state/fallback.py), but an operator sees it here."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Protocol

from router.routing.snapshot import ClusterSnapshot
from serve_apps.backend import ModelBackend
from serve_apps.resilience.golden_gate import GoldenGate
from serve_apps.state.fallback import StoreView


class HealthView(Protocol):
    def local_down(self, alias: str) -> str | None: ...


class Readiness:
    def __init__(
        self,
        backend: ModelBackend,
        aliases: list[str],
        *,
        health_timeout_s: float,
        snapshot: Callable[[], ClusterSnapshot] | None,
        clock: Callable[[], float],
        health: HealthView | None,
        golden: GoldenGate | None,
        store: Callable[[], StoreView | None] | None = None,
    ) -> None:
        self._backend = backend
        self._aliases = aliases
        self._health_timeout_s = health_timeout_s
        self._snapshot = snapshot
        self._clock = clock
        self._health = health
        self._golden = golden
        self._store = store

    async def check(self) -> tuple[bool, dict[str, Any]]:
        """(ready, the /readyz body)."""
        aliases = self._aliases
        reasons = await asyncio.gather(*(self._backend.check_health(a, self._health_timeout_s) for a in aliases))
        if self._snapshot is not None:
            snapshot, now = self._snapshot(), self._clock()
            # a fault the replicas report (numerics failed, engine stalled) says more than the health check
            # it also fails ("unhealthy: RayTaskError"): it comes first
            reasons = [
                faulted(snapshot, alias, now) or reason or unread(snapshot, alias, now)
                for alias, reason in zip(aliases, reasons, strict=True)
            ]
        if self._health is not None:
            reasons = [reason or self._health.local_down(a) for a, reason in zip(aliases, reasons, strict=True)]
        if self._golden is not None:
            reasons = [reason or self._golden.blocked(a) for a, reason in zip(aliases, reasons, strict=True)]
        models = {alias: (reason or "ok") for alias, reason in zip(aliases, reasons, strict=True)}
        ready = all(reason is None for reason in reasons)
        body: dict[str, Any] = {"status": "ready" if ready else "not_ready", "models": models}
        view = self._store() if self._store is not None else None
        if view is not None:
            state = "ok" if view.up else f"down, serving with this replica's own state: {view.detail}"
            body["state"] = {"store": view.kind, "status": state, "outages": view.outages}
        return ready, body


def faulted(snapshot: ClusterSnapshot, model: str, now: float) -> str | None:
    """The fault every fresh replica of `model` reports (None: one may serve, or there is no fresh one)."""
    fresh = [r for r in snapshot.for_model(model) if not snapshot.is_stale(r, now)]
    if not fresh or any(r.fault is None for r in fresh):
        return None
    return sorted(r.fault for r in fresh if r.fault)[0]


def unread(snapshot: ClusterSnapshot, model: str, now: float) -> str | None:
    """Why `model` has no fresh stats reading on `snapshot` (None when it has one)."""
    replicas = snapshot.for_model(model)
    if any(snapshot.unusable(r, now) is None for r in replicas):
        return None
    if not replicas:
        return "no engine stats reading yet"
    if faults := sorted({r.fault for r in replicas if r.fault and not snapshot.is_stale(r, now)}):
        return faults[0]
    return f"no fresh engine stats reading (newest {min(r.age(now) for r in replicas):.1f}s old)"
