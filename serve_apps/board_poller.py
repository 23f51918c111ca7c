"""The gateway's side of the telemetry path: poll the TelemetryBoard into ClusterSnapshots."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from router.snapshot import ClusterSnapshot, ReplicaStats

log = logging.getLogger("spillover.telemetry")


class BoardPoller:
    """Keeps the latest immutable `ClusterSnapshot`; `run()` refreshes it every `period_s`."""

    def __init__(
        self,
        board: Any,
        *,
        period_s: float,
        max_age_s: float,
        clock: Callable[[], float] = time.time,
        on_refresh: Callable[[ClusterSnapshot, float], None] | None = None,
    ):
        self._board = board
        self._on_refresh = on_refresh
        self._period_s = period_s
        self._max_age_s = max_age_s
        self._clock = clock
        self._snapshot = ClusterSnapshot(taken_at=0.0, max_age_s=max_age_s, errors=("no telemetry yet",))

    def latest(self) -> ClusterSnapshot:
        return self._snapshot

    async def refresh(self) -> ClusterSnapshot:
        now = self._clock()
        try:
            rows = await self._board.snapshot.remote(now)
            replicas = tuple(sorted((ReplicaStats.from_dict(r) for r in rows), key=lambda r: (r.model, r.replica_id)))
            self._snapshot = ClusterSnapshot(taken_at=now, replicas=replicas, max_age_s=self._max_age_s)
        except Exception as exc:  # noqa: BLE001 - keep the old replicas; they age into "stale"
            log.warning("telemetry board unreachable: %s", type(exc).__name__)
            old = self._snapshot
            self._snapshot = ClusterSnapshot(old.taken_at, old.replicas, old.max_age_s, (f"board: {exc!r}"[:200],))
        if self._on_refresh is not None:
            self._on_refresh(self._snapshot, now)
        return self._snapshot

    async def run(self) -> None:
        while True:
            await self.refresh()
            await asyncio.sleep(self._period_s)
