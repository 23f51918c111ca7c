"""GPU memory pressure on a real NVIDIA GPU: `scripts/test tests/gpu`.

An "engine" process reserves `FRACTION × total` of cuda:0 up front with torch, as vLLM's engine
does with `gpu_memory_utilization` at start; the replica side (`ReplicaGpus`, the code a Serve
replica runs) must attribute that memory to the engine by PID through the real NVML, read pressure
~0 while idle, and read it rising when another process allocates with torch.

Skipped (the whole module) unless NVML finds a GPU and torch has CUDA.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator

import pytest

from cluster.hardware.nvml import PynvmlReader
from router.routing.saturation import gpu_memory_pressure
from router.routing.snapshot import GpuMemory
from serve_apps.engine.gpus import ReplicaGpus, own_processes
from tests.gpu import cuda_torch_or_skip

GIB = 1024**3
FRACTION = 0.3  # small enough to share the device with whatever else runs there
WATERMARK = 0.95


torch = cuda_torch_or_skip()

pytestmark = pytest.mark.gpu

# A child process that holds `bytes` on cuda:0 until its stdin closes; prints "ready" once it does.
HOLDER = """
import sys, torch
block = torch.empty(int(sys.argv[1]), dtype=torch.uint8, device="cuda:0")
torch.cuda.synchronize()
print("ready", flush=True)
sys.stdin.read()
"""


Hold = Callable[[int], "subprocess.Popen[str]"]


@pytest.fixture
def hold() -> Iterator[Hold]:
    children: list[subprocess.Popen[str]] = []

    def start(nbytes: int) -> subprocess.Popen[str]:
        child = subprocess.Popen(
            [sys.executable, "-c", HOLDER, str(nbytes)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        children.append(child)
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        return child

    yield start
    for child in children:
        if child.stdin:
            child.stdin.close()
        child.wait(timeout=60)


def physical_index() -> int:
    """NVML's index of the device torch calls cuda:0 (CUDA_VISIBLE_DEVICES may remap)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    return int(visible) if visible.isdigit() else 0


def settled(gpus: ReplicaGpus, check: Callable[[GpuMemory], bool]) -> GpuMemory:
    last = None
    for _ in range(40):  # NVML's per-process counters can trail an allocation slightly
        found, error = gpus.read()
        assert error is None, error
        last = found[0]
        if check(last):
            return last
        time.sleep(0.1)
    raise AssertionError(f"NVML never showed it: {last}")


def test_engine_reservation_is_its_own_and_a_cotenant_raises_pressure(hold: Hold) -> None:
    with PynvmlReader() as reader:
        total = next(g for g in reader.read().gpus if g.index == physical_index()).memory_total
        engine = hold(int(FRACTION * total) - 512 * 1024**2)  # minus room for its own CUDA context
        gpus = ReplicaGpus(reader, FRACTION, own_processes(engine.pid, [physical_index()]))

        idle = settled(gpus, lambda g: g.attribution == "pid" and g.engine_bytes >= 0.9 * FRACTION * total)
        baseline = gpu_memory_pressure(idle, WATERMARK)
        print(f"\nidle: used {idle.used_bytes / GIB:.1f} GiB, engine {idle.engine_bytes / GIB:.1f} GiB, "
              f"others {idle.other_bytes / GIB:.2f} GiB, pressure {baseline:.3f}")  # fmt: skip
        assert [p.engine for p in idle.processes if p.pid == engine.pid] == [True]
        assert baseline < 0.1, "an idle engine on its reservation should read ~0 pressure"

        hold(2 * GIB)  # another process allocates
        crowded = settled(gpus, lambda g: g.other_bytes >= idle.other_bytes + 1.8 * GIB)
        rise = gpu_memory_pressure(crowded, WATERMARK) - baseline
        room = WATERMARK * total - max(crowded.engine_bytes, crowded.reserved_bytes)
        added = crowded.other_bytes - idle.other_bytes  # the 2 GiB and the co-tenant's own CUDA context
        print(f"co-tenant 2 GiB: others +{added / GIB:.2f} GiB, pressure +{rise:.3f} (room {room / GIB:.1f} GiB)")
        assert 2 * GIB <= added <= 3 * GIB, "NVML lists a process's tensors plus its context (~0.5 GiB on an H200)"
        assert rise == pytest.approx(added / room, rel=1e-6)
