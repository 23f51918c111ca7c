"""Simulated GPUs for machines without one: `SPILLOVER_FAKE_NVML=<file.json>`.

The file describes a node's GPUs and the processes that hold their memory. It is re-read on
every poll, so a test or a person edits it (write a temporary file and rename it over the old one,
so no poll sees half a file) to make "another process" take memory:

    {
      "gpus": [
        {"name": "SIM-H100-80GB", "total_gib": 80, "utilization": 35, "driver_gib": 0.5,
         "processes": [{"pid": 4242, "used_gib": 6.0}]}
      ]
    }

`uuid` defaults to `GPU-sim-<index>`, `utilization` (percent, SM) to 0, `driver_gib` (memory NVML
counts as used that no process owns) to 0, `processes` to none. `used_gib` may be `null`: NVML's
"not available".

What the simulation reproduces of a real GPU under vLLM: when an engine starts, it reserves
`gpu_memory_utilization × total` of each of its devices at once (weights + KV pool), before any
request, and that memory shows as the engine process's in `nvmlDeviceGetComputeRunningProcesses`.
`announce_engine()` makes the simulated devices show the same: it writes the engine's PID, devices
and fraction beside the file (`<file>.engines/<pid>.json`); every poll adds the reservation of each
announced engine whose process is still alive, so a dead engine's memory is freed as a real
driver frees it. The device's used memory is the sum of its processes plus `driver_gib`.

Measured on a real GPU (an H200, driver 580, `python -m tests.gpu.nvml_facts`; the readings are
in tests/gpu/h200-nvml-facts.json): NVML counts about 0.6 GiB as used before any process holds a
CUDA context (the driver's own; `driver_gib`), and each process's entry includes its CUDA context,
about 0.5 GiB with torch, so a co-tenant that allocates 2 GiB shows as about 2.5 GiB. Files that
`spillover serve` writes (`write_default_file`) carry that driver memory; a co-tenant's `used_gib`
is what NVML would list for it, context included.

A file that is missing or malformed makes the poll fail with an NVML error naming the file and
the problem, so the reader reports state "error" (a replica with such GPUs is then stale).
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping, MutableMapping, Sequence
from pathlib import Path
from typing import Any

from cluster.hardware.nvml import FAKE_NVML_ENV
from cluster.hardware.nvml_fake import GIB, NVML_ERROR_UNKNOWN, FakeGpu, FakeNvml, FakeProcess, NVMLError_Unknown

ENGINES_SUFFIX = ".engines"
DRIVER_GIB = 0.6  # NVML's used memory on an idle H200 with no process (see the module docstring)


class SimulatedFileError(NVMLError_Unknown):
    """The simulation file could not be used; `str()` says which file and why."""

    detail: str = ""

    def __str__(self) -> str:
        return self.detail or "Unknown Error"


def _file_error(path: Path, problem: str) -> SimulatedFileError:
    error = SimulatedFileError(NVML_ERROR_UNKNOWN)
    error.detail = f"simulated NVML file {path}: {problem}"
    return error


def _gib(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise ValueError(f"{where} must be a number of GiB >= 0, got {value!r}")
    return int(value * GIB)


def _process(data: Any, where: str) -> FakeProcess:
    if not isinstance(data, Mapping) or not isinstance(data.get("pid"), int):
        raise ValueError(f"{where} must be an object with an integer pid")
    used = data.get("used_gib")
    return FakeProcess(int(data["pid"]), None if used is None else _gib(used, f"{where}.used_gib"))


def parse_gpus(data: Any) -> list[FakeGpu]:
    """The devices a simulation file describes (ValueError naming the field on bad input)."""
    if not isinstance(data, Mapping) or not isinstance(data.get("gpus"), list):
        raise ValueError('the top level must be an object with a "gpus" list')
    gpus = []
    for i, gpu in enumerate(data["gpus"]):
        where = f"gpus[{i}]"
        if not isinstance(gpu, Mapping):
            raise ValueError(f"{where} must be an object")
        total = _gib(gpu.get("total_gib"), f"{where}.total_gib")
        if total <= 0:
            raise ValueError(f"{where}.total_gib must be > 0")
        utilization = gpu.get("utilization", 0)
        if utilization is not None and (not isinstance(utilization, int) or not 0 <= utilization <= 100):
            raise ValueError(f"{where}.utilization must be an integer percent 0..100 or null")
        processes = gpu.get("processes", [])
        if not isinstance(processes, list):
            raise ValueError(f"{where}.processes must be a list")
        gpus.append(
            FakeGpu(
                uuid=str(gpu.get("uuid", f"GPU-sim-{i}")),
                name=str(gpu.get("name", "SIM-GPU")),
                memory_total=total,
                memory_used=None,
                utilization=utilization,
                processes=[_process(p, f"{where}.processes[{j}]") for j, p in enumerate(processes)],
                driver_bytes=_gib(gpu.get("driver_gib", 0), f"{where}.driver_gib"),
            )
        )
    return gpus


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class SimulatedNvml(FakeNvml):
    """A pynvml stand-in whose devices come from `path`, re-read at the start of every poll
    (`nvmlDeviceGetCount`, the reader's first call of a poll), plus announced engines."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        super().__init__([])
        self.path = Path(path)

    def nvmlDeviceGetCount(self) -> int:
        self._check("nvmlDeviceGetCount")
        self.gpus = self._load()
        return len(self.gpus)

    def _load(self) -> list[FakeGpu]:
        try:
            gpus = parse_gpus(json.loads(self.path.read_text()))
        except FileNotFoundError:
            raise _file_error(self.path, "no such file") from None
        except (OSError, ValueError) as exc:  # json.JSONDecodeError is a ValueError
            raise _file_error(self.path, str(exc)) from None
        for engine in _announced(self.path):
            for index in engine["gpus"]:
                if 0 <= index < len(gpus):
                    gpu = gpus[index]
                    reserved = int(engine["fraction"] * gpu.memory_total)
                    assert gpu.processes is not None
                    gpu.processes.append(FakeProcess(engine["pid"], reserved))
        return gpus


def _engines_dir(path: Path) -> Path:
    return path.with_name(path.name + ENGINES_SUFFIX)


def _announced(path: Path) -> list[dict[str, Any]]:
    """Live engines announced beside `path`; announcements of dead processes are removed."""
    folder = _engines_dir(path)
    if not folder.is_dir():
        return []
    engines = []
    for entry in sorted(folder.glob("*.json")):
        try:
            engine = json.loads(entry.read_text())
            pid = int(engine["pid"])
        except (OSError, ValueError, KeyError, TypeError):
            continue  # being written, or not ours
        if _alive(pid):
            engines.append(engine)
        else:
            entry.unlink(missing_ok=True)
    return engines


def announce_engine(
    environ: Mapping[str, str], pid: int, gpu_indices: Sequence[int], gpu_memory_utilization: float
) -> Path | None:
    """Under SPILLOVER_FAKE_NVML, show an engine's start-up reservation on its simulated devices
    (a no-op returning None on real GPUs, where the engine's allocation shows by itself)."""
    file = environ.get(FAKE_NVML_ENV)
    if not file or not gpu_indices:
        return None
    folder = _engines_dir(Path(file))
    folder.mkdir(parents=True, exist_ok=True)
    entry = folder / f"{pid}.json"
    tmp = folder / f".{pid}.json.tmp"
    tmp.write_text(json.dumps({"pid": pid, "gpus": list(gpu_indices), "fraction": gpu_memory_utilization}))
    tmp.replace(entry)
    return entry


def write_default_file(path: str | os.PathLike[str], num_gpus: int, total_gib: float = 80) -> Path:
    """A simulation file with `num_gpus` idle devices (what `spillover serve` writes when the
    file named by SPILLOVER_FAKE_NVML does not exist yet), each with the driver's own memory."""
    file = Path(path)
    file.parent.mkdir(parents=True, exist_ok=True)
    gpu = {
        "name": f"SIM-H100-{total_gib:g}GB",
        "total_gib": total_gib,
        "utilization": 0,
        "driver_gib": DRIVER_GIB,
        "processes": [],
    }
    gpus = [gpu] * num_gpus
    tmp = file.with_name(f".{file.name}.tmp")
    tmp.write_text(json.dumps({"gpus": gpus}, indent=2) + "\n")
    tmp.replace(file)
    return file


def default_sim_path() -> Path:
    return Path(tempfile.gettempdir()) / "spillover-gpus.json"


def prepare_simulated_gpus(environ: MutableMapping[str, str], num_gpus: int) -> tuple[Path, bool]:
    """Before a local Ray starts for a config with gpu-sim models: point SPILLOVER_FAKE_NVML at a
    file (the one already named, else `default_sim_path()`) that Ray's processes inherit, and
    write `num_gpus` idle devices into it when it does not exist. Returns the file and whether
    it was written now."""
    file = Path(environ.get(FAKE_NVML_ENV) or default_sim_path())
    environ[FAKE_NVML_ENV] = str(file)
    if file.exists():
        return file, False
    return write_default_file(file, max(1, num_gpus)), True
