"""What GPUs a node has and how full they are, read through NVML.

    GpuReader (Protocol)  .read() -> GpuInventory
    ├── PynvmlReader      the real one: `import pynvml` (nvidia-ml-py), or an injected module
    └── (tests inject cluster.hardware.nvml_fake.FakeNvml as the module, so they run PynvmlReader's own code)

A read never raises for the usual GPU-less cases. `GpuInventory.state` says what happened:

    "ok"       NVML answered; `gpus` holds one `GpuInfo` per device (at least one)
    "no_gpus"  no NVML library, no driver loaded, or NVML counts zero devices; `reason` says which
    "error"    NVML failed some other way (a lost GPU, no permission, ...); `reason` quotes it

Each device also lists its compute processes (`nvmlDeviceGetComputeRunningProcesses`: pid and bytes),
which is how memory is attributed to an engine (cluster/hardware/gpu_memory.py). `processes` is None where
NVML cannot list them (no permission, some vGPU/MIG setups); a process's bytes are None where NVML
reports them as not available.

`SPILLOVER_FAKE_NVML=<file.json>` swaps the real library for a simulated one
(cluster/hardware/nvml_sim.py); `reader_from_env()` is the one place that reads that variable.

Times come from an injected clock (`time.time` by default), never read directly.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

InventoryState = Literal["ok", "no_gpus", "error"]

# NVML return codes that mean "this machine has no usable NVIDIA GPU" rather than a fault.
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_NOT_SUPPORTED = 3
_NO_GPU_CODES = frozenset({NVML_ERROR_DRIVER_NOT_LOADED, NVML_ERROR_LIBRARY_NOT_FOUND})
FAKE_NVML_ENV = "SPILLOVER_FAKE_NVML"


@dataclass(frozen=True)
class GpuProcess:
    """One compute process on a device: its host PID and the device memory it holds."""

    pid: int
    used_bytes: int | None


@dataclass(frozen=True)
class GpuInfo:
    """One device as NVML saw it at `read_at`. Memory is in bytes, utilisation in percent
    (None where the device does not report it, e.g. a MIG slice)."""

    index: int
    uuid: str
    name: str
    memory_total: int
    memory_used: int
    memory_free: int
    utilization_gpu: int | None
    read_at: float
    processes: tuple[GpuProcess, ...] | None = ()


@dataclass(frozen=True)
class GpuInventory:
    """The result of one read of every device on this node."""

    state: InventoryState
    reason: str
    gpus: tuple[GpuInfo, ...]
    read_at: float

    @property
    def ok(self) -> bool:
        return self.state == "ok"

    def smallest(self) -> GpuInfo | None:
        """The device with the least total memory (what one replica can count on), or None."""
        return min(self.gpus, key=lambda g: (g.memory_total, g.index)) if self.gpus else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "reason": self.reason,
            "read_at": self.read_at,
            "gpus": [
                {
                    "index": g.index,
                    "uuid": g.uuid,
                    "name": g.name,
                    "memory_total": g.memory_total,
                    "memory_used": g.memory_used,
                    "memory_free": g.memory_free,
                    "utilization_gpu": g.utilization_gpu,
                    "read_at": g.read_at,
                    "processes": None
                    if g.processes is None
                    else [{"pid": p.pid, "used_bytes": p.used_bytes} for p in g.processes],
                }
                for g in self.gpus
            ],
        }


class GpuReader(Protocol):
    """Anything that can take a snapshot of this node's GPUs."""

    def read(self) -> GpuInventory: ...


def _text(value: str | bytes) -> str:
    """Older pynvml bindings return names and UUIDs as bytes."""
    return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else str(value)


def _describe(err: BaseException) -> str:
    code = getattr(err, "value", None)
    try:
        text = str(err)
    except Exception:  # noqa: BLE001 - pynvml's __str__ may itself call into a missing library
        text = ""
    text = text or type(err).__name__
    return f"{text} (NVML error {code})" if code is not None else text


_NOT_AVAILABLE = 2**64 - 1  # NVML_VALUE_NOT_AVAILABLE for unsigned long long


def _processes(nvml: Any, handle: Any, error_class: type[BaseException]) -> tuple[GpuProcess, ...] | None:
    """The device's compute processes, or None where NVML cannot list them (a listing that
    fails must not make the whole read fail: memory and utilisation are still worth having)."""
    try:
        infos = nvml.nvmlDeviceGetComputeRunningProcesses(handle)
    except (error_class, AttributeError):
        return None
    processes = []
    for info in infos:
        used = getattr(info, "usedGpuMemory", None)
        # pynvml maps NVML_VALUE_NOT_AVAILABLE to None; older bindings pass the raw sentinel through.
        processes.append(GpuProcess(int(info.pid), None if used is None or used >= _NOT_AVAILABLE else int(used)))
    return tuple(processes)


class PynvmlReader:
    """Reads GPUs through the pynvml API.

    `nvml_module` is the module to call (default: `import pynvml` on first read); tests pass
    `cluster.hardware.nvml_fake.FakeNvml(...)`. NVML is initialised once, on the first read that
    succeeds in doing so, and shut down by `close()`.
    """

    def __init__(self, clock: Callable[[], float] = time.time, nvml_module: Any | None = None) -> None:
        self._clock = clock
        self._nvml: Any | None = nvml_module
        self._initialized = False

    def _module(self) -> Any:
        if self._nvml is None:
            import pynvml

            self._nvml = pynvml
        return self._nvml

    def read(self) -> GpuInventory:
        try:
            nvml = self._module()
        except ImportError as exc:
            return self._empty("no_gpus", f"pynvml is not installed (pip install nvidia-ml-py): {exc}")
        error_class: type[BaseException] = getattr(nvml, "NVMLError", Exception)
        try:
            if not self._initialized:
                nvml.nvmlInit()
                self._initialized = True
            count = int(nvml.nvmlDeviceGetCount())
            if count == 0:
                return self._empty("no_gpus", "NVML is loaded but counts no GPU devices")
            gpus = tuple(self._read_device(nvml, index, error_class) for index in range(count))
        except error_class as exc:
            if getattr(exc, "value", None) in _NO_GPU_CODES:
                return self._empty("no_gpus", f"no NVIDIA GPU usable: {_describe(exc)}")
            return self._empty("error", f"NVML failed: {_describe(exc)}")
        return GpuInventory(state="ok", reason=f"{len(gpus)} GPU(s)", gpus=gpus, read_at=self._clock())

    def _read_device(self, nvml: Any, index: int, error_class: type[BaseException]) -> GpuInfo:
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        uuid = _text(nvml.nvmlDeviceGetUUID(handle))
        name = _text(nvml.nvmlDeviceGetName(handle))
        memory = nvml.nvmlDeviceGetMemoryInfo(handle)
        try:
            utilization: int | None = int(nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
        except error_class as exc:
            if getattr(exc, "value", None) != NVML_ERROR_NOT_SUPPORTED:
                raise
            utilization = None
        return GpuInfo(
            index=index,
            uuid=uuid,
            name=name,
            memory_total=int(memory.total),
            memory_used=int(memory.used),
            memory_free=int(memory.free),
            utilization_gpu=utilization,
            read_at=self._clock(),
            processes=_processes(nvml, handle, error_class),
        )

    def _empty(self, state: InventoryState, reason: str) -> GpuInventory:
        return GpuInventory(state=state, reason=reason, gpus=(), read_at=self._clock())

    def close(self) -> None:
        """Shut NVML down if this reader initialised it. Safe to call twice."""
        if self._initialized and self._nvml is not None:
            self._initialized = False
            error_class = getattr(self._nvml, "NVMLError", Exception)
            try:
                self._nvml.nvmlShutdown()
            except error_class:
                pass

    def __enter__(self) -> PynvmlReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def reader_from_env(environ: Mapping[str, str], clock: Callable[[], float] = time.time) -> PynvmlReader:
    """The node's GPU reader: the real NVML, or the simulated one named by SPILLOVER_FAKE_NVML."""
    path = environ.get(FAKE_NVML_ENV)
    if not path:
        return PynvmlReader(clock=clock)
    from cluster.hardware.nvml_sim import SimulatedNvml

    return PynvmlReader(clock=clock, nvml_module=SimulatedNvml(path))


__all__ = [
    "FAKE_NVML_ENV",
    "GpuInfo",
    "GpuInventory",
    "GpuProcess",
    "GpuReader",
    "InventoryState",
    "PynvmlReader",
    "reader_from_env",
]
