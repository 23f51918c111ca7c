"""Which processes and GPUs hold a replica's engine, and its GPUs' memory split engine / others.

Where vLLM's GPU memory lives under ray.serve.llm (ray 2.60): on GPUs the engine runs with Ray's
executor, so its GPU workers are Ray actors (vLLM's RayWorkerWrapper) created in the replica's
placement group — not children of the replica process — and the replica actor itself holds no
GPU (`ray.get_gpu_ids()` is empty there). So a replica's engine footprint on this node is:

    PIDs     the replica's process tree (an in-process or multiprocessing engine: vLLM-CPU, tests)
             + the PIDs of the live actors of its placement group on this node (the GPU workers)
    GPU ids  the GPUs Ray gave the replica itself + those it gave those actors

Ray has no public call for "the actors of a placement group" without the dashboard, so this reads
the GCS actor table through ray 2.60's GlobalState accessor (pinned like the rest of the
ray.serve.llm coupling). The replica's own placement group, node and GPUs are asked once; the
actor table is read again every FOOTPRINT_REFRESH_S, in a worker thread (`ReplicaGpus.refresh`): it
is a blocking call to the GCS, which the replica's event loop (serving requests) must not wait on.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import psutil

from cluster.hardware.gpu_memory import replica_gpus
from cluster.hardware.nvml import GpuReader
from router.routing.snapshot import GpuMemory

FOOTPRINT_REFRESH_S = 5.0


@dataclass(frozen=True)
class EngineFootprint:
    pids: frozenset[int]
    gpu_ids: tuple[int, ...]

    def __or__(self, other: EngineFootprint) -> EngineFootprint:
        return EngineFootprint(self.pids | other.pids, tuple(sorted({*self.gpu_ids, *other.gpu_ids})))


Locate = Callable[[], EngineFootprint]


def process_tree(pid: int) -> frozenset[int]:
    """`pid` and all its descendants (vLLM's engine core runs as a child with V1 multiprocessing)."""
    try:
        root = psutil.Process(pid)
        return frozenset({pid, *(c.pid for c in root.children(recursive=True))})
    except psutil.Error:
        return frozenset({pid})


def own_processes(pid: int, gpu_ids: Sequence[int]) -> Locate:
    """An engine inside the replica's own process tree, on the GPUs Ray gave the replica."""
    return lambda: EngineFootprint(process_tree(pid), tuple(gpu_ids))


def placement_group_actors(group_id: bytes, node_id: str) -> EngineFootprint:
    """PIDs and GPU ids of the live actors of placement group `group_id` on node `node_id` (blocking:
    it reads the GCS actor table)."""
    from ray._private.state import state  # here, not at the top: the NVML side runs without Ray
    from ray.core.generated import gcs_pb2

    pids: set[int] = set()
    gpus: set[int] = set()
    for raw in state._connect_and_get_accessor().get_actor_table(None, "ALIVE"):
        actor = gcs_pb2.ActorTableData.FromString(raw)  # type: ignore[attr-defined]  # generated, no stubs
        if actor.placement_group_id != group_id or actor.address.node_id.hex() != node_id:
            continue
        pids.add(int(actor.pid))
        for mapping in actor.resource_mapping:  # in a placement group: "GPU_group_<bundle>_<pg id>"
            if mapping.name == "GPU" or mapping.name.startswith("GPU_group_"):
                gpus.update(int(r.index) for r in mapping.resource_ids)
    return EngineFootprint(frozenset(pids), tuple(sorted(gpus)))


def replica_engine(pid: int) -> Locate:
    """What a SpilloverLLMServer replica's engine occupies (see the module docstring). Call it in the
    replica: its placement group, node and own GPUs are read here, once (they stay the replica's for
    its life); `locate` then reads only processes and the actor table, from any thread."""
    import ray

    group = ray.util.get_current_placement_group()
    node_id = ray.get_runtime_context().get_node_id()
    own_gpus = tuple(int(i) for i in ray.get_gpu_ids())

    def locate() -> EngineFootprint:
        own = EngineFootprint(process_tree(pid), own_gpus)
        if group is None:
            return own
        return own | placement_group_actors(group.id.binary(), node_id)

    return locate


class ReplicaGpus:
    """A replica's GPUs, read at each push and split between its engine and everything else.

    `reserved_fraction`: the engine's gpu_memory_utilization. `locate` says where the engine is;
    it is asked again every FOOTPRINT_REFRESH_S (GPU workers start after the replica): by `refresh`
    in a worker thread on an event loop, else by `read` itself."""

    def __init__(
        self,
        reader: GpuReader,
        reserved_fraction: float,
        locate: Locate,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._reader = reader
        self._fraction = reserved_fraction
        self._locate = locate
        self._clock = clock
        self._footprint = EngineFootprint(frozenset(), ())
        self._located_at = -FOOTPRINT_REFRESH_S

    @property
    def footprint(self) -> EngineFootprint:
        return self._footprint

    def _due(self, now: float) -> bool:
        return now - self._located_at >= FOOTPRINT_REFRESH_S

    async def refresh(self) -> None:
        """Locate the engine again when FOOTPRINT_REFRESH_S has passed, off the event loop."""
        now = self._clock()
        if self._due(now):
            self._footprint, self._located_at = await asyncio.to_thread(self._locate), now

    def read(self) -> tuple[tuple[GpuMemory, ...], str | None]:
        now = self._clock()
        if self._due(now):
            self._footprint, self._located_at = self._locate(), now
        if not self._footprint.gpu_ids:
            return (), None  # a CPU replica: NVML is not read
        footprint = self._footprint
        return replica_gpus(self._reader.read(), footprint.gpu_ids, footprint.pids, self._fraction)
