"""NVML on a real GPU: allocating 1 GiB with torch shows up in NVML's used memory.

Skipped (the whole module) unless `PynvmlReader` finds at least one GPU and torch has CUDA.
"""

from __future__ import annotations

import time

import pytest

from cluster.hardware.nvml import GpuInfo, PynvmlReader
from tests.gpu import cuda_torch_or_skip

GIB = 1024**3


torch = cuda_torch_or_skip()

pytestmark = pytest.mark.gpu


def _cuda0(reader: PynvmlReader) -> GpuInfo:
    """NVML's view of the device torch calls cuda:0 (matched by UUID; CUDA_VISIBLE_DEVICES may remap)."""
    inventory = reader.read()
    assert inventory.state == "ok", inventory.reason
    uuid = str(getattr(torch.cuda.get_device_properties(0), "uuid", "") or "")
    for gpu in inventory.gpus:
        if uuid and gpu.uuid.removeprefix("GPU-").lower() == uuid.removeprefix("GPU-").lower():
            return gpu
    return inventory.gpus[0]


def test_inventory_has_sane_values() -> None:
    with PynvmlReader(clock=lambda: 42.0) as reader:
        inventory = reader.read()
    for gpu in inventory.gpus:
        assert gpu.memory_total > 0
        assert gpu.memory_used + gpu.memory_free <= gpu.memory_total + 1024**2  # some drivers reserve memory
        assert gpu.uuid.startswith(("GPU-", "MIG-"))
        assert gpu.name
        assert gpu.read_at == 42.0
        assert gpu.utilization_gpu is None or 0 <= gpu.utilization_gpu <= 100


def test_one_gib_allocation_is_seen_by_nvml() -> None:
    torch.zeros(1, device="cuda:0")  # create the CUDA context first: it costs memory of its own
    torch.cuda.synchronize(0)
    with PynvmlReader() as reader:
        before = _cuda0(reader).memory_used
        block = torch.ones(GIB, dtype=torch.uint8, device="cuda:0")
        torch.cuda.synchronize(0)
        rose = 0
        for _ in range(20):  # NVML's counters can trail an allocation slightly
            rose = _cuda0(reader).memory_used - before
            if rose >= 0.9 * GIB:
                break
            time.sleep(0.05)
        del block
        torch.cuda.empty_cache()
    assert rose >= 0.9 * GIB, f"NVML used memory rose by {rose / GIB:.2f} GiB only"
