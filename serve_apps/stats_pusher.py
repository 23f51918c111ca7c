"""The replica side of the telemetry path: read `ReplicaStats`, push them to the TelemetryBoard.

`SpilloverLLMServer` reads its vLLM engine; the multi-node tests' stats-only replicas read a fake
engine; both push the same way, with their GPUs' memory from `ReplicaGpus` (the real NVML, or the
simulated one that SPILLOVER_FAKE_NVML names), split between the replica's engine and the rest.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence

import psutil
from ray.actor import ActorHandle

from cluster.gpu_memory import replica_gpus
from cluster.nvml import GpuReader
from cluster.nvml_sim import announce_engine
from router.snapshot import GpuMemory, ReplicaStats

log = logging.getLogger("spillover.replica")

PUSH_PERIOD_S = 0.2


PIDS_REFRESH_S = 5.0
ENGINE_PROCESS_MARK = "EngineCore"  # vLLM V1 names its engine process VLLM::EngineCore


def process_tree(pid: int) -> frozenset[int]:
    """`pid` and all its descendants (the engine core and its workers run as children)."""
    try:
        root = psutil.Process(pid)
        return frozenset({pid, *(c.pid for c in root.children(recursive=True))})
    except psutil.Error:
        return frozenset({pid})


def engine_process(pid: int) -> int:
    """The process that holds the engine's device memory: vLLM's engine-core child when it runs
    one (V1 multiprocessing), else the replica itself (engine in-process)."""
    try:
        for child in psutil.Process(pid).children(recursive=True):
            if ENGINE_PROCESS_MARK in " ".join(child.cmdline()) or ENGINE_PROCESS_MARK in child.name():
                return child.pid
    except psutil.Error:
        pass
    return pid


class ReplicaGpus:
    """The GPUs Ray gave one replica, read each push and split engine / others.

    `reserved_fraction`: the engine's gpu_memory_utilization (None: no engine holds these GPUs).
    The engine's PIDs are the replica's process tree, refreshed every PIDS_REFRESH_S."""

    def __init__(
        self,
        reader: GpuReader,
        gpu_ids: Sequence[int],
        reserved_fraction: float | None,
        *,
        pid: int | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._reader = reader
        self._gpu_ids = list(gpu_ids)
        self._fraction = reserved_fraction
        self._pid = pid if pid is not None else os.getpid()
        self._clock = clock
        self._pids: frozenset[int] = frozenset({self._pid})
        self._pids_at = -PIDS_REFRESH_S

    def engine_started(self, environ: Mapping[str, str]) -> None:
        """Call once the engine holds its memory. On simulated GPUs (SPILLOVER_FAKE_NVML) this makes
        the reservation appear as the engine process's, as vLLM's pre-allocation does on a real GPU."""
        if self._fraction is not None:
            announce_engine(environ, engine_process(self._pid), self._gpu_ids, self._fraction)

    def read(self) -> tuple[tuple[GpuMemory, ...], str | None]:
        if not self._gpu_ids:
            return (), None  # a CPU replica: NVML is not read
        now = self._clock()
        if now - self._pids_at >= PIDS_REFRESH_S:
            self._pids, self._pids_at = process_tree(self._pid), now
        return replica_gpus(self._reader.read(), self._gpu_ids, self._pids, self._fraction)


async def push_forever(read: Callable[[], ReplicaStats], board: ActorHandle, period_s: float = PUSH_PERIOD_S) -> None:
    """Push `read()` every `period_s` until cancelled; a failed push is logged and retried."""
    while True:
        try:
            await board.push.remote(read().to_dict())
        except Exception:
            log.exception("pushing engine stats failed; retrying")
            await asyncio.sleep(1.0)
        await asyncio.sleep(period_s)
