"""cluster.hardware.nvml.PynvmlReader against the fake pynvml module (and, where safe, the real one)."""

from __future__ import annotations

from collections.abc import Callable

import pynvml
import pytest

from cluster.hardware.nvml import GpuInventory, PynvmlReader
from cluster.hardware.nvml_fake import (
    GIB,
    NVML_ERROR_DRIVER_NOT_LOADED,
    NVML_ERROR_GPU_IS_LOST,
    NVML_ERROR_LIBRARY_NOT_FOUND,
    NVML_ERROR_NO_PERMISSION,
    FakeGpu,
    FakeNvml,
    NVMLError,
    NVMLError_LibraryNotFound,
)


def ticking_clock(start: float = 1000.0) -> Callable[[], float]:
    """Each call returns the next whole second: reads are ordered and their times known."""
    state = {"now": start - 1}

    def clock() -> float:
        state["now"] += 1
        return state["now"]

    return clock


def two_gpus() -> list[FakeGpu]:
    return [
        FakeGpu("GPU-aaaa", "NVIDIA H100 80GB HBM3", 80 * GIB, memory_used=2 * GIB, utilization=35),
        FakeGpu("GPU-bbbb", "NVIDIA A100-SXM4-40GB", 40 * GIB, memory_used=30 * GIB, utilization=90),
    ]


def test_two_gpus_inventory() -> None:
    fake = FakeNvml(two_gpus())
    inventory = PynvmlReader(clock=ticking_clock(), nvml_module=fake).read()
    assert inventory.state == "ok"
    assert inventory.ok
    assert len(inventory.gpus) == 2
    first, second = inventory.gpus
    assert (first.index, first.uuid, first.name) == (0, "GPU-aaaa", "NVIDIA H100 80GB HBM3")
    assert (first.memory_total, first.memory_used, first.memory_free) == (80 * GIB, 2 * GIB, 78 * GIB)
    assert first.utilization_gpu == 35
    assert (second.index, second.memory_total, second.memory_free, second.utilization_gpu) == (
        1,
        40 * GIB,
        10 * GIB,
        90,
    )
    assert second.memory_used / second.memory_total == 0.75
    assert (first.read_at, second.read_at, inventory.read_at) == (1000.0, 1001.0, 1002.0)  # the injected clock
    assert inventory.smallest() == second


def test_bytes_names_from_older_bindings_are_decoded() -> None:
    inventory = PynvmlReader(nvml_module=FakeNvml(two_gpus(), legacy_bytes=True)).read()
    assert [g.uuid for g in inventory.gpus] == ["GPU-aaaa", "GPU-bbbb"]
    assert inventory.gpus[0].name == "NVIDIA H100 80GB HBM3"


@pytest.mark.parametrize(
    ("code", "words"),
    [(NVML_ERROR_LIBRARY_NOT_FOUND, "Library Not Found"), (NVML_ERROR_DRIVER_NOT_LOADED, "Driver Not Loaded")],
)
def test_no_library_or_driver_means_no_gpus(code: int, words: str) -> None:
    inventory = PynvmlReader(clock=lambda: 5.0, nvml_module=FakeNvml(init_error=code)).read()
    assert inventory == GpuInventory(state="no_gpus", reason=inventory.reason, gpus=(), read_at=5.0)
    assert words in inventory.reason
    assert f"NVML error {code}" in inventory.reason
    assert inventory.smallest() is None


def test_zero_devices_means_no_gpus() -> None:
    inventory = PynvmlReader(nvml_module=FakeNvml([])).read()
    assert inventory.state == "no_gpus"
    assert "no GPU devices" in inventory.reason


def test_error_mid_read_is_reported_not_raised() -> None:
    fake = FakeNvml(two_gpus(), fail={"nvmlDeviceGetMemoryInfo": NVML_ERROR_GPU_IS_LOST}, fail_index=1)
    inventory = PynvmlReader(clock=lambda: 7.0, nvml_module=fake).read()
    assert inventory.state == "error"
    assert "GPU is lost" in inventory.reason
    assert "NVML error 15" in inventory.reason
    assert inventory.gpus == ()
    assert inventory.read_at == 7.0


def test_init_error_other_than_no_gpu_is_an_error() -> None:
    inventory = PynvmlReader(nvml_module=FakeNvml(init_error=NVML_ERROR_NO_PERMISSION)).read()
    assert inventory.state == "error"
    assert "Insufficient Permissions" in inventory.reason


def test_utilization_not_supported_reads_as_none() -> None:
    gpus = [FakeGpu("MIG-1", "NVIDIA A100 MIG 1g.10gb", 10 * GIB, utilization=None)]
    inventory = PynvmlReader(nvml_module=FakeNvml(gpus)).read()
    assert inventory.state == "ok"
    assert inventory.gpus[0].utilization_gpu is None


def test_init_once_and_rereads_see_new_values() -> None:
    fake = FakeNvml(two_gpus())
    reader = PynvmlReader(nvml_module=fake)
    assert reader.read().gpus[0].memory_used == 2 * GIB
    fake.set_memory_used(0, 50 * GIB)
    assert reader.read().gpus[0].memory_used == 50 * GIB
    assert fake.init_calls == 1
    reader.close()
    reader.close()
    assert fake.shutdown_calls == 1


def test_failed_init_is_retried_on_next_read() -> None:
    fake = FakeNvml(two_gpus(), init_error=NVML_ERROR_DRIVER_NOT_LOADED)
    reader = PynvmlReader(nvml_module=fake)
    assert reader.read().state == "no_gpus"
    fake.init_error = None  # the driver got loaded
    with reader:
        assert reader.read().state == "ok"
    assert fake.init_calls == 2
    assert fake.shutdown_calls == 1


def test_fake_refuses_calls_before_init() -> None:
    with pytest.raises(NVMLError) as info:
        FakeNvml(two_gpus()).nvmlDeviceGetCount()
    assert info.value.value == 1


def test_inventory_to_dict() -> None:
    data = PynvmlReader(clock=lambda: 3.0, nvml_module=FakeNvml(two_gpus())).read().to_dict()
    assert data["state"] == "ok"
    assert data["gpus"][1]["memory_total"] == 40 * GIB
    assert data["gpus"][1]["read_at"] == 3.0


def test_fake_matches_the_real_pynvml_shape() -> None:
    """The fake must stay a stand-in for nvidia-ml-py: same names, same error mapping."""
    for name in [n for n in dir(FakeNvml) if n.startswith("nvml")]:
        assert callable(getattr(pynvml, name)), name
    for name in [n for n in dir(FakeNvml) if n.startswith("NVMLError")]:
        real = getattr(pynvml, name)
        fake = getattr(FakeNvml, name)
        if name != "NVMLError":
            assert real(fake.value).value == fake.value
            assert isinstance(pynvml.NVMLError(fake.value), real)
    assert isinstance(NVMLError(NVML_ERROR_LIBRARY_NOT_FOUND), NVMLError_LibraryNotFound)
    assert pynvml.NVML_ERROR_LIBRARY_NOT_FOUND == NVML_ERROR_LIBRARY_NOT_FOUND == 12


def test_real_reader_never_raises_here() -> None:
    """On any machine: the real pynvml path returns an inventory (no GPU here: "no_gpus")."""
    with PynvmlReader() as reader:
        inventory = reader.read()
    assert inventory.state in ("ok", "no_gpus", "error")
    if inventory.state != "ok":
        assert inventory.reason
