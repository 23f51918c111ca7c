"""SpilloverLLMServer: ray.serve.llm's LLMServer plus a direct engine-stats path and engine checks.

Before the engine starts, serve_apps/engine/startup.py chooses a vLLM-CPU engine's precision on the CPU
it runs on and binds its threads; after it started, the replica checks the engine's numerics against
the model's float32 reference before Serve sees it ready (a bf16 engine that fails, where `auto`
chose bf16, is recorded and the replica restarts in float32), then appends a `StatsTap` to vLLM's stat
loggers and pushes its `ReplicaStats` to the TelemetryBoard every `push_period_s` (see
router/routing/snapshot.py for the whole path). While it serves it re-checks numerics every
`models[].numerics.interval_s` and watches for a wedged engine (serve_apps/engine/watchdog.py); either
fault is in every pushed reading (the gateways stop routing to it) and fails Serve's `check_health`
(Serve replaces it). A start-up numerics failure keeps the replica out of routing without a restart
loop: a new replica would compute the same wrong numbers. A streamed answer's first chunk leaves at once, the
rest in Ray's batches (serve_apps/engine/first_chunk.py).

Coupling, on purpose and pinned (ray 2.60.x / vLLM V1): the AsyncLLM is reached as
`self.engine._engine_client`, its stat loggers as `logger_manager.stat_loggers`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import AsyncGenerator
from typing import Any

import ray
from pydantic import ValidationError
from ray import serve
from ray.serve.llm import LLMServer
from ray.serve.llm.openai_api_models import ChatCompletionRequest, CompletionRequest

from cluster.config.model_spec import DEFAULT_GPU_MEMORY_UTILIZATION
from cluster.engine_settings import ENGINE_KEY, EngineSettings
from cluster.hardware.nvml import reader_from_env
from cluster.models import compile_cache_dir
from cluster.precision.numerics_check import NumericsVerdict
from cluster.stats_tap import StatsTap
from router.routing.snapshot import ReplicaStats
from serve_apps.engine.first_chunk import first_then_batched
from serve_apps.engine.gpu_sim_workers import GPU_SIM_ENV, start_workers
from serve_apps.engine.gpus import ReplicaGpus, replica_engine
from serve_apps.engine.llm import watermarks_of
from serve_apps.engine.reaper import start_reaper
from serve_apps.engine.replica_router import routing_stats
from serve_apps.engine.replies import engine_failed, invalid_body, plain
from serve_apps.engine.startup import BF16Rejected, EngineSetup
from serve_apps.engine.watchdog import StallWatch, engine_processes, kill_engine
from serve_apps.telemetry.board import get_or_create_board
from serve_apps.telemetry.stats_pusher import push_forever

log = logging.getLogger("spillover.replica")
VLLM_CACHE_ROOT_ENV = "VLLM_CACHE_ROOT"


class SpilloverLLMServer(LLMServer):
    async def start(self) -> None:
        # a compiled engine (no enforce_eager) keeps its torch.compile / Inductor cache between starts
        # under the project's cache, on the node the replica runs on; an operator's own setting wins
        os.environ.setdefault(VLLM_CACHE_ROOT_ENV, str(compile_cache_dir()))
        config = self._llm_config
        settings = EngineSettings.from_dict(config.experimental_configs.get(ENGINE_KEY))
        loading = config.model_loading_config  # a ModelLoadingConfig once validated (a dict only before)
        source = loading.get("model_source") if isinstance(loading, dict) else loading.model_source
        self._setup = EngineSetup(dict(config.engine_kwargs or {}), str(source), settings)
        # LLMConfig caches its engine config (built while the deployment was): update both, as its API does,
        # with only the keys the choice sets (its engine config keeps vLLM's frontend arguments apart)
        config.update_engine_kwargs(**self._setup.prepare())
        await super().start()
        self._client = getattr(self.engine, "_engine_client", None)
        self._reaper = start_reaper(engine_processes())
        try:
            self._numerics = await self._setup.verify(self._client)
        except BF16Rejected as exc:
            log.error("%s", exc)
            self._shutdown_engine()
            raise
        self._health_fault: str | None = None  # set mid-life: Serve replaces the replica
        self._watch = StallWatch(settings.stall_s, time.monotonic)
        self._tap = StatsTap()
        self._watermarks = watermarks_of(config.experimental_configs)
        engine_kwargs = config.engine_kwargs or {}
        fraction = float(engine_kwargs.get("gpu_memory_utilization", DEFAULT_GPU_MEMORY_UTILIZATION))
        if os.environ.get(GPU_SIM_ENV):  # vLLM-CPU on simulated GPUs: stand-ins hold them as vLLM's workers do
            self._sim_workers = await asyncio.to_thread(start_workers, fraction)
        self._gpus = ReplicaGpus(reader_from_env(os.environ), fraction, replica_engine(os.getpid()))
        self._node_id = ray.get_runtime_context().get_node_id()
        context = serve.get_replica_context()
        self._replica_id = context.replica_id.unique_id if context else "local"
        manager = getattr(self._client, "logger_manager", None)
        if manager is not None:
            manager.stat_loggers.append(self._tap)
        else:
            log.warning("engine stats logging is off: KV usage will not reach the router")
        self._board = get_or_create_board()
        loop = asyncio.get_running_loop()
        self._pusher = loop.create_task(push_forever(self._read, self._board))
        self._rechecks = loop.create_task(self._recheck_forever())

    def _shutdown_engine(self) -> None:
        with contextlib.suppress(Exception):
            if self._client is not None:
                self._client.shutdown()

    async def _recheck_forever(self) -> None:
        numerics = self._setup.settings.numerics_settings
        if numerics is None or self._setup.reference is None:
            return
        while self._health_fault is None:
            await asyncio.sleep(numerics.interval_s)
            verdict = await self._setup.recheck(self._client)
            if verdict is None:
                return
            self._apply(verdict)

    def _apply(self, verdict: NumericsVerdict) -> None:
        """A numerics check's verdict; one that fails after the start-up check passed is a health fault."""
        was_routable = self._numerics.routable
        self._numerics = verdict
        if was_routable and not verdict.routable and self._health_fault is None:  # the first fault is the cause
            self._health_fault = verdict.reason
            log.error("replica leaves routing and asks Serve to replace it: %s", verdict.reason)

    def _engine_fault(self, busy: bool, steps: int) -> str | None:
        """A fault that keeps this replica out of routing (None: it may serve)."""
        stalled = self._watch.stalled(busy, steps)
        if stalled is not None and self._health_fault is None:
            self._health_fault = (
                f"engine stalled: it held requests and took no step for {stalled:.0f}s "
                f"(stall_s {self._watch.stall_s:g}); its processes were killed"
            )
            kill_engine(self._health_fault)
        if self._health_fault is not None:
            return self._health_fault
        return None if self._numerics.routable else self._numerics.reason

    async def _read(self) -> ReplicaStats:
        await self._gpus.refresh()  # where the engine is: a GCS read, in a worker thread when due
        processor = getattr(self._client, "output_processor", None)
        idle = processor is not None and not processor.has_unfinished_requests()
        reading = self._tap.reading(engine_idle=idle)
        cache = getattr(getattr(self._client, "vllm_config", None), "cache_config", None)
        gpus, gpu_error = self._gpus.read()
        setup = self._setup
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
            precision=setup.choice.label if setup.choice else setup.dtype,
            cpu_class=setup.caps.cpu_class if setup.caps else None,
            numerics=self._numerics.state,
            fault=self._engine_fault(busy=not idle, steps=reading.steps),
            notes=(*setup.notes, self._numerics.reason),
        )
        self._last = stats
        return stats

    def _batch_output_stream(self, generator: AsyncGenerator[Any, None]) -> AsyncGenerator[list[Any], None]:
        # the first chunk at once, the rest batched as Ray does (serve_apps/engine/first_chunk.py)
        return first_then_batched(generator, self._get_batch_interval_ms())

    async def serve_body(self, kind: str, body: dict[str, Any]) -> AsyncGenerator[Any, None]:
        """The gateway's call (serve_apps/engine/local_backend.py): a request body as JSON, validated here into
        vLLM's request class and answered in plain values (serve_apps/engine/replies.py), so that the gateway
        imports neither vLLM nor torch."""
        try:
            request = (ChatCompletionRequest if kind == "chat" else CompletionRequest).model_validate(body)
        except ValidationError as exc:
            yield invalid_body(exc)
            return
        run = self.chat if kind == "chat" else self.completions
        try:
            stream = await run(request, None)  # type: ignore[arg-type]  # the class matches the kind
            async for item in stream:
                yield plain(item)
        except Exception as exc:  # noqa: BLE001 - vLLM's exception would import vLLM into the gateway
            raise engine_failed(exc) from None

    async def check_health(self) -> None:
        """Serve replaces the replica when its engine died, stalled, or its numerics went wrong mid-life."""
        fault = getattr(self, "_health_fault", None)
        if fault is not None:
            raise RuntimeError(fault)
        try:
            await super().check_health()
        except Exception as exc:  # noqa: BLE001 - the gateway's readiness calls this too: plain, as serve_body
            raise engine_failed(exc) from None

    async def record_routing_stats(self) -> dict[str, Any]:
        """Serve's hook for request routers (serve_apps/engine/replica_router.py): the saturation of this
        replica's latest reading (the one the TelemetryBoard has) against its model's watermarks."""
        last = getattr(self, "_last", None)
        return {} if last is None else routing_stats(last, self._watermarks)

    async def engine_stats(self) -> dict[str, Any]:
        return (await self._read()).to_dict()
