"""The gateway's side of the telemetry path: poll the TelemetryBoard into ClusterSnapshots.

Each row's `read_at` is rebuilt on this gateway's clock from the board's `board_age_s` (how long ago the
board received it, on the board's clock: serve_apps/telemetry/board.py), so the router's freshness
check never compares a worker's or the head's clock with ours; a row without it (a board started before
this rule) keeps the replica's own `read_at`.

Each new snapshot is assessed once (router/routing/saturation.py `assess`, against each model's
watermarks): the router, `/metrics` and `GET /v1/spillover/cluster` all read those saturations.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from router.routing.saturation import assess
from router.routing.snapshot import AGE_KEY, ClusterSnapshot, ReplicaStats
from router.routing.watermarks import Watermarks
from serve_apps.head_actor import HEAD_CALL_TIMEOUT_S, call

log = logging.getLogger("spillover.telemetry")


class BoardPoller:
    """Keeps the latest immutable `ClusterSnapshot`; `run()` refreshes it every `period_s`.

    `watermarks_for(model)`: the model's watermarks, which each snapshot's saturations are judged by."""

    def __init__(
        self,
        board: Any,
        *,
        period_s: float,
        max_age_s: float,
        watermarks_for: Callable[[str], Watermarks],
        clock: Callable[[], float] = time.time,
        on_refresh: Callable[[ClusterSnapshot, float], None] | None = None,
        call_timeout_s: float = HEAD_CALL_TIMEOUT_S,
    ):
        self._board = board
        self._call_timeout_s = call_timeout_s
        self._on_refresh = on_refresh
        self._period_s = period_s
        self._max_age_s = max_age_s
        self._watermarks_for = watermarks_for
        self._clock = clock
        self._snapshot = ClusterSnapshot(taken_at=0.0, max_age_s=max_age_s, errors=("no telemetry yet",))

    def latest(self) -> ClusterSnapshot:
        return self._snapshot

    async def refresh(self) -> ClusterSnapshot:
        now = self._clock()
        try:
            rows = await call(self._board.snapshot.remote(now), self._call_timeout_s)  # hung: TimeoutError
            replicas = tuple(sorted((_stats(r, now) for r in rows), key=lambda r: (r.model, r.replica_id)))
            snapshot = ClusterSnapshot(taken_at=now, replicas=replicas, max_age_s=self._max_age_s)
            self._snapshot = assess(snapshot, self._watermarks_for)
        except Exception as exc:  # noqa: BLE001 - keep the old replicas; they age into "stale"
            log.warning("telemetry board unreachable: %s", type(exc).__name__)
            self._snapshot = replace(self._snapshot, errors=(f"board: {exc!r}"[:200],))
        if self._on_refresh is not None:
            self._on_refresh(self._snapshot, now)
        return self._snapshot

    async def run(self) -> None:
        while True:
            await self.refresh()
            await asyncio.sleep(self._period_s)


def _stats(row: dict[str, Any], now: float) -> ReplicaStats:
    """A board row as ReplicaStats read at `now - board_age_s` on the poller's clock."""
    fields = dict(row)
    age = fields.pop(AGE_KEY, None)
    if isinstance(age, int | float) and not isinstance(age, bool) and math.isfinite(age):
        fields["read_at"] = now - max(0.0, float(age))
    return ReplicaStats.from_dict(fields)
