"""The operator's traffic document shared by every gateway replica: a small named Ray actor on the
head node, like the breaker exchange (serve_apps/resilience/breaker_exchange.py).

`command` applies an operator's command (router/traffic/traffic.py) and bumps the version; `sync` takes a
replica's reports (a switch its gates rolled back or completed: the first report wins, the others
see the phase already set) and returns the document with the replica's position in [0, 1) among
the replicas heard from in the last `forget_after_s` (the order they first synced in), which sets
when it adopts a switch (router/traffic/migration.py, `stagger_delay_s`).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

import ray
from ray.actor import ActorHandle

from router.traffic import traffic as doc_ops
from serve_apps.head_actor import HEAD_CALL_TIMEOUT_S, call, command_call, on_head

BOARD_NAME = "spillover-traffic"
BOARD_NAMESPACE = "spillover"


class TrafficBoard:
    def __init__(self, clock: Callable[[], float] = time.time, forget_after_s: float = 60.0) -> None:
        self._clock = clock
        self._forget_after_s = forget_after_s
        self._doc = doc_ops.empty_doc()
        self._seen: dict[str, tuple[int, float]] = {}  # replica -> (arrival order, last sync)
        self._arrivals = 0

    def sync(self, replica: str, reports: list[tuple[str, str, str, str]]) -> tuple[dict[str, Any], float]:
        now = self._clock()
        for scope, switch_id, phase, reason in reports[:100]:
            said = doc_ops.mark(self._doc, scope, phase, f"{reason} (gateway replica {replica[:8]})", switch_id)
            if "no such switch" not in said and "already" not in said:
                self._doc = doc_ops.recorded(self._doc, now, phase, scope, said)
        order = self._seen.get(replica, (self._arrivals, now))[0]
        if replica not in self._seen:
            self._arrivals += 1
        self._seen[replica] = (order, now)
        self._seen = {r: (o, t) for r, (o, t) in self._seen.items() if t >= now - self._forget_after_s}
        ranked = sorted(self._seen, key=lambda r: self._seen[r][0])
        return self._doc, ranked.index(replica) / len(ranked)

    def command(self, command: doc_ops.Command, switch_id: str) -> tuple[dict[str, Any], str]:
        self._doc, said = doc_ops.apply(self._doc, command, at=self._clock(), switch_id=switch_id)
        return self._doc, said

    def record(self, action: str, scope: str, said: str) -> dict[str, Any]:
        """An event without a change of state (a switch refused by its dry-run)."""
        self._doc = doc_ops.recorded(self._doc, self._clock(), action, scope, said)
        return self._doc


def get_or_create_traffic_board() -> ActorHandle:
    actor = ray.remote(num_cpus=0, max_concurrency=16)(TrafficBoard)  # type: ignore[call-overload]  # see board
    return on_head(actor, BOARD_NAME, BOARD_NAMESPACE)


def kill_traffic_board() -> None:
    try:
        ray.kill(ray.get_actor(BOARD_NAME, namespace=BOARD_NAMESPACE))
    except ValueError:
        pass  # never created


class RayBoard:
    """`BoardClient` over the actor."""

    def __init__(self, actor: ActorHandle, command_timeout_s: float = HEAD_CALL_TIMEOUT_S) -> None:
        self._actor = actor
        self._command_timeout_s = command_timeout_s

    async def sync(self, replica: str, reports: list[tuple[str, str, str, str]]) -> tuple[dict[str, Any], float]:
        return await call(self._actor.sync.remote(replica, reports))

    async def command(self, command: doc_ops.Command, switch_id: str) -> tuple[dict[str, Any], str]:
        called: Awaitable[tuple[dict[str, Any], str]] = self._actor.command.remote(command, switch_id)
        return await command_call(called, "the traffic board", self._command_timeout_s)

    async def record(self, action: str, scope: str, said: str) -> dict[str, Any]:
        recorded: Awaitable[dict[str, Any]] = self._actor.record.remote(action, scope, said)
        return await command_call(recorded, "the traffic board", self._command_timeout_s)


class LocalBoard:
    """`BoardClient` over a plain `TrafficBoard` in this process (unit tests, one-replica tools)."""

    def __init__(self, board: TrafficBoard) -> None:
        self.board = board

    async def sync(self, replica: str, reports: list[tuple[str, str, str, str]]) -> tuple[dict[str, Any], float]:
        return self.board.sync(replica, reports)

    async def command(self, command: doc_ops.Command, switch_id: str) -> tuple[dict[str, Any], str]:
        return self.board.command(command, switch_id)

    async def record(self, action: str, scope: str, said: str) -> dict[str, Any]:
        return self.board.record(action, scope, said)
