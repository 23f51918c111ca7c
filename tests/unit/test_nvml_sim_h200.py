"""The GPU simulation replays a real GPU's readings: the pressure the router computes from the
simulated NVML equals the one it computed on a real H200 for the same memory layout.

tests/gpu/h200-nvml-facts.json was measured by `python -m tests.gpu.nvml_facts` on an H200 (driver
580): NVML's used memory with no process (the driver's), an engine process holding 90% of the device
(vLLM's start-up reservation), then co-tenant processes of 1, 2, 2 and 1 GiB, each listed by NVML
with its CUDA context on top. The simulation file here describes the same processes; what must match
is how the device's used memory is composed (driver + processes) and split (engine by PID).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cluster.hardware.gpu_memory import replica_gpus
from cluster.hardware.nvml import PynvmlReader
from cluster.hardware.nvml_sim import SimulatedNvml
from router.routing.saturation import gpu_memory_pressure

FACTS = json.loads((Path(__file__).resolve().parents[1] / "gpu" / "h200-nvml-facts.json").read_text())
ENGINE_PID = FACTS["engine"]["pid"]


def simulated_pressure(tmp_path: Path, cotenants_gib: list[float]) -> tuple[float, str]:
    (engine,) = FACTS["engine"]["processes"]
    processes = [engine] + [{"pid": 10_000 + i, "used_gib": gib} for i, gib in enumerate(cotenants_gib)]
    gpu = {"total_gib": FACTS["device"]["total_gib"], "driver_gib": FACTS["driver"]["used_gib"], "processes": processes}
    file = tmp_path / "gpus.json"
    file.write_text(json.dumps({"gpus": [gpu]}))
    with PynvmlReader(nvml_module=SimulatedNvml(file)) as reader:
        (split,), error = replica_gpus(reader.read(), [0], {ENGINE_PID}, FACTS["gpu_memory_utilization"])
    assert error is None
    return gpu_memory_pressure(split, FACTS["watermark"]), split.attribution


def test_idle_engine_reads_what_the_h200_read(tmp_path: Path) -> None:
    pressure, attribution = simulated_pressure(tmp_path, [])
    assert attribution == FACTS["engine"]["attribution"] == "pid"
    assert pressure == pytest.approx(FACTS["engine"]["pressure_idle"], abs=0.005)
    assert 0 < pressure < 0.1  # the driver's memory is in the room's way, a little


def test_cotenant_steps_read_what_the_h200_read(tmp_path: Path) -> None:
    context = FACTS["engine"]["context_gib"]
    held: list[float] = []
    for step in FACTS["cotenants"]["steps"]:
        held.append(step["add_gib"] + context)  # NVML lists a process's tensors and its CUDA context
        pressure, _ = simulated_pressure(tmp_path, held)
        assert pressure == pytest.approx(step["pressure"], abs=0.01), step
    assert FACTS["cotenants"]["steps"][-2]["pressure"] > 1.0  # 5 GiB of co-tenants crossed the floor
