"""The gateway's side of the telemetry path: the TelemetryBoard's rows as ClusterSnapshots, by subscription.

`run()` watches the board from a thread of its own (`spillover-telemetry`, with its own event loop): each
`watch` call (serve_apps/telemetry/board.py) is answered as soon as a replica pushes news, or after
`heartbeat_s` with the rows as they are, and the next watch starts `min_interval_s` after an answer (pushes
in between are answered together, at once). So the actor calls never run on the loop that serves requests,
a change after a quiet spell reaches the gateway at once instead of on the next poll, and an idle cluster
(engines pushing the same stats) costs one call per `min_interval_s + heartbeat_s`. The new snapshot is
swapped in whole (readers on the request loop see the old one or the new one, never a mix), and `on_refresh`
— the plans, gauges and health that follow the readings — runs on the request loop, once per new snapshot,
never on a request.
A board that predates `watch` is polled every `min_interval_s` (`snapshot`), as before.

Each row's `read_at` is rebuilt on this gateway's clock from the board's `board_age_s` (how long ago the
board received it, on the board's clock), taken when the answer arrives, so the router's freshness check
never compares a worker's or the head's clock with ours; a row without it keeps the replica's own `read_at`.

Each new snapshot is assessed once (router/routing/saturation.py `assess`, against each model's
watermarks): the router, `/metrics` and `GET /v1/spillover/cluster` all read those saturations.
`refresh()` is one read of the whole board (`snapshot`) on the caller's loop: tests, and a caller that
needs a reading now.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from router.routing.saturation import assess
from router.routing.snapshot import AGE_KEY, ClusterSnapshot, ReplicaStats
from router.routing.watermarks import Watermarks
from serve_apps.head_actor import HEAD_CALL_TIMEOUT_S, call

log = logging.getLogger("spillover.telemetry")
RETRY_S = 1.0  # after a failed watch: the board is away (restarting, its node busy)


class BoardReader:
    """Keeps the latest immutable `ClusterSnapshot` of the board's rows.

    `watermarks_for(model)`: the model's watermarks, which each snapshot's saturations are judged by;
    `min_interval_s`: the shortest time between two snapshots (telemetry.poll_period_s); `heartbeat_s`: the
    longest a watch waits for news (default `min_interval_s`: an idle engine's row is at most two periods
    older here than on the board, well inside `max_age_s`)."""

    def __init__(
        self,
        board: Any,
        *,
        min_interval_s: float,
        max_age_s: float,
        watermarks_for: Callable[[str], Watermarks],
        clock: Callable[[], float] = time.time,
        on_refresh: Callable[[ClusterSnapshot, float], None] | None = None,
        call_timeout_s: float = HEAD_CALL_TIMEOUT_S,
        heartbeat_s: float | None = None,
    ):
        self._board = board
        self._call_timeout_s = call_timeout_s
        self._on_refresh = on_refresh
        self._min_interval_s = min_interval_s
        self._heartbeat_s = min_interval_s if heartbeat_s is None else heartbeat_s
        self._max_age_s = max_age_s
        self._watermarks_for = watermarks_for
        self._clock = clock
        self._snapshot = ClusterSnapshot(taken_at=0.0, max_age_s=max_age_s, errors=("no telemetry yet",))
        self.answers = 0  # watch (or poll) answers taken, for tests and the bench

    def latest(self) -> ClusterSnapshot:
        return self._snapshot

    async def refresh(self) -> ClusterSnapshot:
        """One read of the whole board now, on the caller's loop; `on_refresh` is called with it."""
        try:
            rows = await call(self._board.snapshot.remote(self._clock()), self._call_timeout_s)  # hung: TimeoutError
            snapshot, now = self._take(rows)
        except Exception as exc:  # noqa: BLE001 - keep the old replicas; they age into "stale"
            snapshot, now = self._lost(exc)
        if self._on_refresh is not None:
            self._on_refresh(snapshot, now)
        return snapshot

    async def run(self) -> None:
        """Watch the board from the `spillover-telemetry` thread until cancelled; `on_refresh` runs on this loop."""
        loop = asyncio.get_running_loop()
        stop = threading.Event()
        thread = threading.Thread(
            target=lambda: asyncio.run(self._watch(loop, stop)), name="spillover-telemetry", daemon=True
        )
        thread.start()
        try:
            while thread.is_alive():
                await asyncio.sleep(1.0)
            log.error("the telemetry thread ended: the engine readings age into stale")
        finally:
            stop.set()

    async def _watch(self, gateway: asyncio.AbstractEventLoop, stop: threading.Event) -> None:
        watching = hasattr(self._board, "watch")  # a board started by an older gateway has none: poll it
        version = -1  # never a board's: the first watch is answered at once
        while not stop.is_set():
            try:
                if watching:
                    wait = self._heartbeat_s + self._call_timeout_s
                    version, rows = await call(self._board.watch.remote(version, self._heartbeat_s), wait)
                else:
                    rows = await call(self._board.snapshot.remote(self._clock()), self._call_timeout_s)
                snapshot, now = self._take(rows)
                pause = self._min_interval_s  # the next answer no sooner: pushes in between are taken as one
            except (Exception, asyncio.CancelledError) as exc:  # noqa: BLE001 - the old replicas age into "stale"
                if stop.is_set():
                    return  # the call was cut short by the replica going away
                snapshot, now = self._lost(exc)
                version, pause = -1, RETRY_S
            try:
                gateway.call_soon_threadsafe(self._refreshed, snapshot, now)
            except RuntimeError:
                return  # the gateway's loop is closed: the replica is going away
            if pause > 0:
                await asyncio.sleep(pause)

    def _take(self, rows: list[dict[str, Any]]) -> tuple[ClusterSnapshot, float]:
        now = self._clock()  # when the answer is here: the rows' ages are as of now
        replicas = tuple(sorted((_stats(r, now) for r in rows), key=lambda r: (r.model, r.replica_id)))
        snapshot = ClusterSnapshot(taken_at=now, replicas=replicas, max_age_s=self._max_age_s)
        self._snapshot = assess(snapshot, self._watermarks_for)
        self.answers += 1
        return self._snapshot, now

    def _lost(self, exc: BaseException) -> tuple[ClusterSnapshot, float]:
        log.warning("telemetry board unreachable: %s", type(exc).__name__)
        self._snapshot = replace(self._snapshot, errors=(f"board: {exc!r}"[:200],))
        return self._snapshot, self._clock()

    def _refreshed(self, snapshot: ClusterSnapshot, now: float) -> None:
        if self._on_refresh is not None and snapshot is self._snapshot:  # a newer one is on its way otherwise
            self._on_refresh(snapshot, now)


def _stats(row: dict[str, Any], now: float) -> ReplicaStats:
    """A board row as ReplicaStats read at `now - board_age_s` on the reader's clock."""
    fields = dict(row)
    age = fields.pop(AGE_KEY, None)
    if isinstance(age, int | float) and not isinstance(age, bool) and math.isfinite(age):
        fields["read_at"] = now - max(0.0, float(age))
    return ReplicaStats.from_dict(fields)
