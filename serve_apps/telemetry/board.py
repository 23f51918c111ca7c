"""TelemetryBoard: the named Ray actor replicas push engine stats to and the gateway reads.

Detached and found by name (`get_or_create_board`), so it outlives whichever process created
it first and works the same under `spillover serve`, `serve run` and `serve deploy`.
`Running.stop()` (serve_apps.runner) kills it; a `ray stop` removes it too.

Freshness is measured by the receiver, never by comparing clocks of two machines: the board notes
when each push arrived on its own monotonic clock and hands every row out with `board_age_s`, the
seconds since (`BoardState`); the gateway's reader turns that into a `read_at` on its own clock
(serve_apps/telemetry/board_reader.py). A worker whose clock is hours off the head's therefore reads as fresh
while it pushes, and goes stale when it stops, exactly like one in sync. The replica's own `read_at`
travels unchanged but is only shown, never compared.

Gateways subscribe rather than poll: `watch(after_version, wait_s)` answers as soon as the board's version
passes the one the gateway last saw, or after `wait_s` with the rows as they are. A push moves the version
when it brings news — a replica not on the board, or stats that differ from its last push in anything but
`read_at` — so an idle engine's pushes keep its row fresh without waking every gateway, and the heartbeat
answers carry the ages that tell a gateway an engine stopped pushing. An `after_version` this board never
gave (a board started again) is answered at once.
"""

from __future__ import annotations

import asyncio
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
        self._version = 0
        self._pushed = asyncio.Event()  # set (and replaced) by each push: wakes every waiting `watch`

    def push(self, stats: dict[str, Any]) -> None:
        replica = str(stats["replica_id"])
        before = self._latest.get(replica)
        self._latest[replica] = (self._clock(), stats)
        if before is None or _news(before[1], stats):
            self._version += 1
            self._pushed.set()
            self._pushed = asyncio.Event()

    async def watch(self, after_version: int, wait_s: float) -> tuple[int, list[dict[str, Any]]]:
        """`(version, snapshot())` once the board holds a push after `after_version`, else after `wait_s`
        (at most 60 s); the version is the one to watch after next."""
        if after_version == self._version:
            try:
                await asyncio.wait_for(self._pushed.wait(), min(max(0.0, wait_s), 60.0))
            except TimeoutError:
                pass  # nothing new: the rows as they are, a little older
        return self._version, self.snapshot()

    def snapshot(self, now: float | None = None) -> list[dict[str, Any]]:
        """Every row with its `board_age_s`. `now` (a caller's clock, from gateways before this rule)
        is ignored: ages are the board's own."""
        here = self._clock()
        self._latest = {k: v for k, v in self._latest.items() if here - v[0] <= self._forget_after_s}
        return [{**stats, AGE_KEY: max(0.0, here - received)} for received, stats in self._latest.values()]


def _news(before: dict[str, Any], now: dict[str, Any]) -> bool:
    """Whether a replica's push says more than "still the same" (its `read_at` always moves)."""
    return before.keys() != now.keys() or any(v != before[k] for k, v in now.items() if k != "read_at")


@ray.remote(num_cpus=0, max_concurrency=256)  # type: ignore[call-overload]  # an actor option Ray's stubs omit
class TelemetryBoard(BoardState):
    """The detached actor around `BoardState` (one per cluster, on the head node): an async actor (`watch`),
    whose every method runs on its one event loop, so pushes, reads and watches never race."""


def get_or_create_board() -> ActorHandle:
    """On the head node (serve_apps/head_actor.py)."""
    return on_head(TelemetryBoard, BOARD_NAME, BOARD_NAMESPACE)


def kill_board() -> None:
    try:
        ray.kill(ray.get_actor(BOARD_NAME, namespace=BOARD_NAMESPACE))
    except ValueError:
        pass  # never created
