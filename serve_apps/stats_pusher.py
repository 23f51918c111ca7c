"""The replica side of the telemetry path: read `ReplicaStats`, push them to the TelemetryBoard.

`SpilloverLLMServer` reads its vLLM engine; the multi-node tests' stats-only replicas read a fake
engine; both push the same way, with their node's GPU memory from an NVML reader (a fake pynvml
module in tests, the real one in production).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence

from ray.actor import ActorHandle

from cluster.nvml import GpuReader
from cluster.telemetry import GpuMemory, ReplicaStats

log = logging.getLogger("spillover.replica")

PUSH_PERIOD_S = 0.2


def gpu_memory(reader: GpuReader, gpu_ids: Sequence[int]) -> tuple[GpuMemory, ...]:
    """Memory of the GPUs Ray gave this replica (none on a CPU replica: NVML is not read)."""
    if not gpu_ids:
        return ()
    inventory = reader.read()
    return tuple(
        GpuMemory(g.index, g.uuid, g.memory_used, g.memory_total) for g in inventory.gpus if g.index in gpu_ids
    )


async def push_forever(read: Callable[[], ReplicaStats], board: ActorHandle, period_s: float = PUSH_PERIOD_S) -> None:
    """Push `read()` every `period_s` until cancelled; a failed push is logged and retried."""
    while True:
        try:
            await board.push.remote(read().to_dict())
        except Exception:
            log.exception("pushing engine stats failed; retrying")
            await asyncio.sleep(1.0)
        await asyncio.sleep(period_s)
