"""The simulated NVML behind SPILLOVER_FAKE_NVML, read through the real `PynvmlReader`.

What it reproduces of a real GPU: a starting vLLM engine's reservation (`gpu_memory_utilization ×
total`) appears at once as that engine process's memory, and disappears when the process dies, as a
driver frees a dead process's memory; the device's used memory is its processes' plus the driver's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cluster.hardware.nvml import FAKE_NVML_ENV, PynvmlReader, reader_from_env
from cluster.hardware.nvml_fake import GIB
from cluster.hardware.nvml_sim import DRIVER_GIB, SimulatedNvml, announce_engine, write_default_file

DRIVER = int(DRIVER_GIB * GIB)


def write(path: Path, data: object) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data))
    tmp.replace(path)


def test_default_file_reads_as_idle_gpus(tmp_path: Path) -> None:
    file = write_default_file(tmp_path / "gpus.json", num_gpus=2)
    inventory = reader_from_env({FAKE_NVML_ENV: str(file)}).read()
    assert inventory.state == "ok"
    assert [(g.index, g.uuid, g.memory_total, g.memory_used, g.processes) for g in inventory.gpus] == [
        (0, "GPU-sim-0", 80 * GIB, DRIVER, ()),
        (1, "GPU-sim-1", 80 * GIB, DRIVER, ()),
    ]  # idle, but NVML counts the driver's own memory as used, as on a real GPU


def test_file_is_reread_on_every_poll(tmp_path: Path) -> None:
    file = write_default_file(tmp_path / "gpus.json", num_gpus=1)
    reader = PynvmlReader(nvml_module=SimulatedNvml(file))
    assert reader.read().gpus[0].memory_used == DRIVER
    write(
        file,
        {"gpus": [{"total_gib": 80, "utilization": 40, "driver_gib": 0.5, "processes": [{"pid": 7, "used_gib": 3}]}]},
    )
    gpu = reader.read().gpus[0]
    assert (gpu.memory_used, gpu.utilization_gpu) == (int(3.5 * GIB), 40)
    assert [(p.pid, p.used_bytes) for p in gpu.processes or ()] == [(7, 3 * GIB)]


def test_an_announced_engine_shows_its_reservation_until_it_dies(tmp_path: Path) -> None:
    file = write_default_file(tmp_path / "gpus.json", num_gpus=2)
    engine = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        entry = announce_engine({FAKE_NVML_ENV: str(file)}, engine.pid, [1], 0.9)
        assert entry is not None and entry.exists()
        reader = PynvmlReader(nvml_module=SimulatedNvml(file))
        idle, mine = reader.read().gpus
        assert idle.memory_used == DRIVER
        assert mine.memory_used == int(0.9 * 80 * GIB) + DRIVER
        assert [(p.pid, p.used_bytes) for p in mine.processes or ()] == [(engine.pid, int(0.9 * 80 * GIB))]
    finally:
        engine.kill()
        engine.wait()
    assert reader.read().gpus[1].memory_used == DRIVER  # the driver freed the dead engine's memory
    assert not entry.exists()


def test_announce_is_a_no_op_on_real_gpus() -> None:
    assert announce_engine({}, os.getpid(), [0], 0.9) is None


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ("{not json", "Expecting property name"),
        ('{"gpus": 3}', '"gpus" list'),
        ('{"gpus": [{"total_gib": -1}]}', "gpus[0].total_gib must be a number of GiB >= 0"),
        ('{"gpus": [{"total_gib": 80, "utilization": 250}]}', "gpus[0].utilization"),
        ('{"gpus": [{"total_gib": 80, "processes": [{"pid": "x"}]}]}', "gpus[0].processes[0]"),
        ("[]", '"gpus" list'),
    ],
)
def test_a_bad_file_is_an_nvml_error_naming_it(tmp_path: Path, content: str, problem: str) -> None:
    file = tmp_path / "gpus.json"
    file.write_text(content)
    inventory = PynvmlReader(nvml_module=SimulatedNvml(file)).read()
    assert inventory.state == "error"
    assert str(file) in inventory.reason and problem in inventory.reason


def test_a_missing_file_is_an_nvml_error(tmp_path: Path) -> None:
    inventory = PynvmlReader(nvml_module=SimulatedNvml(tmp_path / "absent.json")).read()
    assert inventory.state == "error" and "no such file" in inventory.reason
