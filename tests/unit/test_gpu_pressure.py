"""GPU memory pressure under vLLM's pre-allocation: attribution by PID, the term, the config check.

What the fakes reproduce of a real GPU: a vLLM engine reserves `gpu_memory_utilization × total` of
each of its devices when it starts (before any request) and NVML lists that memory under the engine
process in `nvmlDeviceGetComputeRunningProcesses`; NVML's used memory is the processes' memory plus a
little the driver holds that no process owns. The readings below go through the real `PynvmlReader`.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from cluster.config.deployment import load_config, parse_config
from cluster.hardware.gpu_memory import attribute_device, replica_gpus
from cluster.hardware.nvml import PynvmlReader
from cluster.hardware.nvml_fake import GIB, NVML_ERROR_GPU_IS_LOST, FakeGpu, FakeNvml, FakeProcess
from router.errors import ConfigError
from router.routing.saturation import Saturation, gpu_memory_pressure, replica_saturation
from router.routing.snapshot import ClusterSnapshot, GpuMemory, ReplicaStats
from router.routing.watermarks import Watermarks

ENGINE, OTHER, NOW = 4100, 7700, 1000.0
REPO = Path(__file__).resolve().parents[2]
WM = Watermarks(gpu_memory=0.95)


def device(*processes: FakeProcess, total_gib: int = 80, driver_gib: float = 0.0) -> FakeGpu:
    return FakeGpu("GPU-0", "NVIDIA H100 80GB HBM3", total_gib * GIB, None, 0, list(processes), int(driver_gib * GIB))


def read(*gpus: FakeGpu) -> tuple[GpuMemory, ...]:
    inventory = PynvmlReader(nvml_module=FakeNvml(list(gpus)), clock=lambda: NOW).read()
    found, error = replica_gpus(inventory, list(range(len(gpus))), {ENGINE}, 0.9)
    assert error is None, error
    return found


def stats(gpus: tuple[GpuMemory, ...] = (), gpu_error: str | None = None) -> ReplicaStats:
    return ReplicaStats("m", "r1", "n", NOW, 0.1, 0, 0, 0, 0, 100, 16, gpus=gpus, gpu_error=gpu_error)


def saturation(gpus: tuple[GpuMemory, ...], gpu_error: str | None = None) -> Saturation:
    s = stats(gpus, gpu_error)
    return replica_saturation(s, WM, snapshot=ClusterSnapshot(NOW, (s,)), now=NOW)


def reserved(total_gib: int = 80) -> FakeProcess:
    return FakeProcess(ENGINE, int(0.9 * total_gib * GIB))


@pytest.mark.parametrize(
    ("processes", "driver_gib", "pressure"),
    [
        ((reserved(),), 0.0, 0.0),  # idle engine: NVML says 90% used, all of it the engine's own
        ((reserved(),), 0.4, 0.1),  # the driver's 0.4 GiB of the 4 GiB room above the 5% floor
        ((reserved(), FakeProcess(OTHER, 2 * GIB)), 0.0, 0.5),  # a co-tenant takes half the room
        ((reserved(), FakeProcess(OTHER, 4 * GIB)), 0.0, 1.0),  # free memory down to the floor
        ((reserved(), FakeProcess(OTHER, 6 * GIB)), 0.0, 1.5),  # past it: the engine may OOM
        ((FakeProcess(ENGINE, 30 * GIB),), 0.0, 0.0),  # engine still loading: its reservation is counted
        ((FakeProcess(ENGINE, 30 * GIB), FakeProcess(OTHER, 2 * GIB)), 0.0, 0.5),
    ],
)
def test_pressure_table(processes: tuple[FakeProcess, ...], driver_gib: float, pressure: float) -> None:
    (gpu,) = read(device(*processes, driver_gib=driver_gib))
    assert gpu.attribution == "pid"
    assert gpu_memory_pressure(gpu, WM.gpu_memory) == pytest.approx(pressure, abs=1e-6)


def test_idle_engine_reads_90_percent_used_yet_no_pressure() -> None:
    (gpu,) = read(device(reserved()))
    assert gpu.used_bytes / gpu.total_bytes == pytest.approx(0.9)
    assert gpu.engine_bytes == gpu.reserved_bytes == int(72 * GIB)
    sat = saturation((gpu,))
    assert sat.term != "gpu_memory" or sat.value == 0.0
    assert not sat.saturated


def test_cotenant_growth_saturates_and_names_gpu_memory() -> None:
    values = []
    for gib in (0, 1, 2, 3, 4, 5):
        (gpu,) = read(device(reserved(), FakeProcess(OTHER, gib * GIB)))
        values.append(saturation((gpu,)))
    assert [round(s.value, 2) for s in values[1:]] == [0.25, 0.5, 0.75, 1.0, 1.25]  # 4 GiB of room above the floor
    assert values[-1].saturated and values[-1].term == "gpu_memory"
    assert "gpu0 others 5.0 of 4.0 GiB room" in values[-1].detail
    assert "engine's own 72.0 GiB (90%, by pid)" in values[-1].detail


def test_tensor_parallel_replica_is_as_pressed_as_its_worst_gpu() -> None:
    gpus = read(device(reserved()), device(reserved(), FakeProcess(OTHER, 3 * GIB)))
    assert [gpu_memory_pressure(g, 0.95) for g in gpus] == [0.0, pytest.approx(0.75)]
    sat = saturation(gpus)
    assert sat.term == "gpu_memory" and sat.value == pytest.approx(0.75) and "gpu1" in sat.detail


def test_pids_from_another_namespace_fall_back_to_the_reservation() -> None:
    """In a container NVML may report host PIDs: none matches the engine's, so the engine is assumed to
    hold its reservation and only the rest counts against the room."""
    gpu = attribute_device(
        PynvmlReader(nvml_module=FakeNvml([device(FakeProcess(91234, int(72 * GIB)))])).read().gpus[0],
        engine_pids={ENGINE},
        reserved_fraction=0.9,
    )
    assert (gpu.attribution, gpu.engine_bytes, gpu.other_bytes) == ("reservation", int(72 * GIB), 0)


def test_process_listing_not_supported_falls_back_to_the_reservation() -> None:
    gpu = FakeGpu("GPU-0", "vGPU", 80 * GIB, memory_used=int(73 * GIB), processes=None)
    (info,) = read(gpu)
    assert info.processes == () and info.attribution == "reservation"
    assert info.other_bytes == 1 * GIB


def test_nvml_error_makes_the_reading_stale() -> None:
    fake = FakeNvml([device(reserved())], fail={"nvmlDeviceGetMemoryInfo": NVML_ERROR_GPU_IS_LOST})
    gpus, error = replica_gpus(PynvmlReader(nvml_module=fake).read(), [0], {ENGINE}, 0.9)
    assert gpus == () and error and "GPU is lost" in error
    sat = saturation(gpus, gpu_error=error)
    assert (sat.value, sat.term) == (math.inf, "stale") and "GPU is lost" in sat.detail


def test_a_gpu_ray_gave_but_nvml_lacks_is_an_error() -> None:
    inventory = PynvmlReader(nvml_module=FakeNvml([device(reserved())])).read()
    gpus, error = replica_gpus(inventory, [0, 3], {ENGINE}, 0.9)
    assert gpus == () and error and "[3]" in error


def test_cpu_replica_reads_no_gpu() -> None:
    assert replica_gpus(PynvmlReader(nvml_module=FakeNvml([])).read(), [], {ENGINE}, None) == ((), None)


def test_device_without_engine_keeps_the_whole_device_fraction() -> None:
    gpu = GpuMemory(0, "GPU-0", 76 * GIB, 80 * GIB)
    assert gpu_memory_pressure(gpu, 0.95) == pytest.approx(1.0)


def test_reservation_past_the_watermark_is_infinite_pressure() -> None:
    (gpu,) = read(device(reserved()))
    assert gpu_memory_pressure(gpu, 0.85) == math.inf


def gpu_model(**extra: object) -> dict[str, object]:
    return {"alias": "q", "source": "Qwen/Qwen2.5-7B-Instruct", "family": "qwen", "accelerator": "gpu", **extra}


def test_config_refuses_a_watermark_an_idle_engine_exceeds() -> None:
    with pytest.raises(ConfigError) as err:
        parse_config({"watermarks": {"gpu_memory": 0.85}, "models": [gpu_model()]}, "gpu.yaml")
    text = str(err.value)
    assert "models[0].engine_args.gpu_memory_utilization 0.9 >= watermarks.gpu_memory 0.85" in text
    assert "set watermarks.gpu_memory above it" in text


def test_config_refusal_names_the_models_own_watermark() -> None:
    model = gpu_model(engine_args={"gpu_memory_utilization": 0.96}, watermarks={"gpu_memory": 0.95})
    with pytest.raises(ConfigError, match=r"models\[0\]\.watermarks\.gpu_memory 0\.95"):
        parse_config({"models": [model]}, "x.yaml")


def test_config_accepts_room_above_the_reservation_and_ignores_cpu_models() -> None:
    parse_config({"models": [gpu_model()]}, "default watermark 0.95 > 0.9")
    cpu = {"alias": "c", "source": "prepared:x", "family": "llama"}
    parse_config({"watermarks": {"gpu_memory": 0.5, "low": 0.4}, "models": [cpu]}, "cpu only")


@pytest.mark.parametrize("value", [0, 1.5, "0.9", True])
def test_config_refuses_a_gpu_memory_utilization_out_of_range(value: object) -> None:
    with pytest.raises(ConfigError, match="gpu_memory_utilization must be a number in"):
        parse_config({"models": [gpu_model(engine_args={"gpu_memory_utilization": value})]}, "x.yaml")


def test_shipped_gpu_configs_pass() -> None:
    for name in ("gpu.yaml", "gpu-sim.yaml"):
        config = load_config(REPO / "configs" / name)
        assert all(
            m.gpu_reserved_fraction is None or m.gpu_reserved_fraction < config.watermarks_for(m.alias).gpu_memory
            for m in config.models
        )
