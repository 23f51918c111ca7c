"""Where a replica's engine is (serve_apps/engine/gpus.py), without Ray: the footprint logic.

The Ray half (actors of the replica's placement group, as vLLM's GPU workers are on real GPUs) runs
in tests/gpu_sim, where stand-in workers hold the simulated GPUs in the placement group.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading

from cluster.hardware.nvml import GpuInventory, PynvmlReader
from cluster.hardware.nvml_fake import GIB, FakeGpu, FakeNvml, FakeProcess
from router.routing.snapshot import GpuMemory
from serve_apps.engine.gpus import EngineFootprint, ReplicaGpus, own_processes, process_tree


class NoReads:
    def read(self) -> GpuInventory:
        raise AssertionError("a CPU replica must not read NVML")


def test_cpu_replica_reads_no_nvml() -> None:
    gpus = ReplicaGpus(NoReads(), 0.9, lambda: EngineFootprint(frozenset({1}), ()))
    assert gpus.read() == ((), None)


def test_footprint_is_refreshed_every_five_seconds() -> None:
    now = {"t": 100.0}
    calls = []

    def locate() -> EngineFootprint:
        calls.append(now["t"])
        return EngineFootprint(frozenset({42}), (0,) if len(calls) > 1 else ())

    fake = FakeNvml([FakeGpu("GPU-0", "H100", 80 * GIB, None, 0, [FakeProcess(42, int(72 * GIB))])])
    gpus = ReplicaGpus(PynvmlReader(nvml_module=fake), 0.9, locate, clock=lambda: now["t"])
    assert gpus.read() == ((), None)  # the GPU workers have not started yet
    now["t"] = 104.9
    assert gpus.read() == ((), None) and calls == [100.0]
    now["t"] = 105.5
    (gpu,), error = gpus.read()
    assert error is None and calls == [100.0, 105.5]
    assert (gpu.attribution, gpu.engine_bytes) == ("pid", int(72 * GIB))


def test_refresh_locates_the_engine_off_the_event_loop() -> None:
    """A Serve replica's `locate` reads the GCS actor table, a blocking call: `refresh` runs it in a
    worker thread when due, and `read` (on the loop) then uses that footprint without locating."""
    now = {"t": 100.0}
    threads: list[int] = []

    def locate() -> EngineFootprint:
        threads.append(threading.get_ident())
        return EngineFootprint(frozenset({42}), (0,))

    fake = FakeNvml([FakeGpu("GPU-0", "H100", 80 * GIB, None, 0, [FakeProcess(42, int(72 * GIB))])])
    gpus = ReplicaGpus(PynvmlReader(nvml_module=fake), 0.9, locate, clock=lambda: now["t"])

    async def push() -> tuple[tuple[GpuMemory, ...], str | None]:
        await gpus.refresh()
        await gpus.refresh()  # not due again within FOOTPRINT_REFRESH_S
        return gpus.read()

    (gpu,), error = asyncio.run(push())
    assert error is None and gpu.attribution == "pid"
    assert len(threads) == 1 and threads[0] != threading.get_ident()


def test_process_tree_holds_children() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert {os.getpid(), child.pid} <= process_tree(os.getpid())
        assert own_processes(os.getpid(), [1])().gpu_ids == (1,)
    finally:
        child.kill()
        child.wait()


def test_footprints_merge() -> None:
    merged = EngineFootprint(frozenset({1}), (1,)) | EngineFootprint(frozenset({2}), (0, 1))
    assert merged == EngineFootprint(frozenset({1, 2}), (0, 1))
