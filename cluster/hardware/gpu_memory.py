"""Whose memory is it: split a replica's GPU memory into its engine's and everyone else's.

vLLM reserves `gpu_memory_utilization × total` of each of its devices when the engine starts
(weights + KV pool), before any request. A whole-device used/total therefore reads ~0.9 on an idle
replica; what matters for burst is the memory *other* processes take from the headroom the engine
needs (router/routing/saturation.py turns the split into the pressure term).

Per device, from one NVML read:

    engine_bytes = Σ bytes of the processes whose PID is one of the engine's PIDs   ("pid")
                 = min(used, reserved) when NVML lists none of them                ("reservation")
    other_bytes  = used − engine_bytes   (other processes, the driver's own reservation, leaks)

The "reservation" fallback covers engines whose PIDs NVML reports from another PID namespace
(containers) or cannot list at all: the engine is then assumed to hold what it reserved.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from cluster.hardware.nvml import GpuInfo, GpuInventory
from router.routing.snapshot import GpuMemory, GpuProcessMemory


def attribute_device(gpu: GpuInfo, engine_pids: Collection[int], reserved_fraction: float | None) -> GpuMemory:
    """One device's memory, split between the engine (`engine_pids`) and the rest.

    `reserved_fraction`: the engine's `gpu_memory_utilization`, or None when no engine runs on
    the device (then everything used is "other")."""
    reserved = int(gpu.memory_total * reserved_fraction) if reserved_fraction else 0
    processes = tuple(GpuProcessMemory(p.pid, p.used_bytes, p.pid in engine_pids) for p in (gpu.processes or ()))
    mine = [p for p in processes if p.engine]
    if reserved_fraction is None:
        engine, how = 0, "none"
    elif mine:
        engine, how = sum(p.used_bytes or 0 for p in mine), "pid"
        if any(p.used_bytes is None for p in mine):  # NVML would not say how much: assume the reservation
            engine = max(engine, min(gpu.memory_used, reserved))
    else:
        engine, how = min(gpu.memory_used, reserved), "reservation"
    return GpuMemory(
        index=gpu.index,
        uuid=gpu.uuid,
        used_bytes=gpu.memory_used,
        total_bytes=gpu.memory_total,
        engine_bytes=min(engine, gpu.memory_used),
        reserved_bytes=reserved,
        attribution=how,
        utilization_gpu=gpu.utilization_gpu,
        processes=processes,
    )


def replica_gpus(
    inventory: GpuInventory,
    gpu_ids: Sequence[int],
    engine_pids: Collection[int],
    reserved_fraction: float | None,
) -> tuple[tuple[GpuMemory, ...], str | None]:
    """The replica's devices (Ray's `gpu_ids`) attributed, and an error when they could not be
    read (NVML failed, or a device Ray gave the replica is missing): such a reading is stale."""
    if not gpu_ids:
        return (), None
    if not inventory.ok:
        return (), inventory.reason
    found = {g.index: g for g in inventory.gpus}
    missing = [i for i in gpu_ids if i not in found]
    if missing:
        return (), f"GPU(s) {missing} given to the replica are not among NVML's {sorted(found)}"
    return tuple(attribute_device(found[i], engine_pids, reserved_fraction) for i in gpu_ids), None
