"""The replica side of the telemetry path: read `ReplicaStats`, push them to the TelemetryBoard.

`SpilloverLLMServer` reads its vLLM engine; the multi-node tests' stats-only replicas read a fake
engine; both push the same way, with their GPUs' memory from `serve_apps.engine.gpus.ReplicaGpus`
(the real NVML, or the simulated one that SPILLOVER_FAKE_NVML names).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from ray.actor import ActorHandle

from router.routing.snapshot import ReplicaStats
from serve_apps.head_actor import call

log = logging.getLogger("spillover.replica")

PUSH_PERIOD_S = 0.2


async def push_forever(
    read: Callable[[], Awaitable[ReplicaStats]], board: ActorHandle, period_s: float = PUSH_PERIOD_S
) -> None:
    """Push `await read()` every `period_s` until cancelled; a failed push is logged and retried."""
    while True:
        try:
            await call(board.push.remote((await read()).to_dict()))
        except Exception:
            log.exception("pushing engine stats failed; retrying")
            await asyncio.sleep(1.0)
        await asyncio.sleep(period_s)
