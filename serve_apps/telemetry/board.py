"""TelemetryBoard: the named Ray actor replicas push engine stats to and the gateway reads.

Detached and found by name (`get_or_create_board`), so it outlives whichever process created
it first and works the same under `spillover serve`, `serve run` and `serve deploy`.
`Running.stop()` (serve_apps.runner) kills it; a `ray stop` removes it too.

Freshness is measured by the receiver, never by comparing clocks of two machines: the board notes
when each push arrived on its own monotonic clock and hands every row out with `board_age_s`, the
seconds since (`BoardState`); the gateway's poller turns that into a `read_at` on its own clock
(serve_apps/telemetry/board_poller.py). A worker whose clock is hours off the head's therefore reads as fresh
while it pushes, and goes stale when it stops, exactly like one in sync. The replica's own `read_at`
travels unchanged but is only shown, never compared.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import ray
from ray.actor import ActorHandle

from router.routing.snapshot import AGE_KEY
from serve_apps.head_actor import on_head

BOARD_NAME = "spillover-telemetry"
BOARD_NAMESPACE = "spillover"


class BoardState:
    """Latest stats dict per replica id, with when it arrived on `clock` (monotonic); replicas not heard
    from in `forget_after_s` (by that clock) vanish."""

    def __init__(self, forget_after_s: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        self._latest: dict[str, tuple[float, dict[str, Any]]] = {}
        self._forget_after_s = forget_after_s
        self._clock = clock

    def push(self, stats: dict[str, Any]) -> None:
        self._latest[str(stats["replica_id"])] = (self._clock(), stats)

    def snapshot(self, now: float | None = None) -> list[dict[str, Any]]:
        """Every row with its `board_age_s`. `now` (a caller's clock, from gateways before this rule)
        is ignored: ages are the board's own."""
        here = self._clock()
        self._latest = {k: v for k, v in self._latest.items() if here - v[0] <= self._forget_after_s}
        return [{**stats, AGE_KEY: max(0.0, here - received)} for received, stats in self._latest.values()]


@ray.remote(num_cpus=0, max_concurrency=64)  # type: ignore[call-overload]  # an actor option Ray's stubs omit
class TelemetryBoard(BoardState):
    """The detached actor around `BoardState` (one per cluster, on the head node)."""


def get_or_create_board() -> ActorHandle:
    """On the head node (serve_apps/head_actor.py)."""
    return on_head(TelemetryBoard, BOARD_NAME, BOARD_NAMESPACE)


def kill_board() -> None:
    try:
        ray.kill(ray.get_actor(BOARD_NAME, namespace=BOARD_NAMESPACE))
    except ValueError:
        pass  # never created
