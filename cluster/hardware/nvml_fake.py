"""A FAKE pynvml module, for tests: no GPU, no driver, no NVML library is touched.

`FakeNvml` has the function names `cluster.hardware.nvml.PynvmlReader` calls on the real `pynvml`
(nvmlInit, nvmlShutdown, nvmlDeviceGetCount, nvmlDeviceGetHandleByIndex, nvmlDeviceGetUUID,
nvmlDeviceGetName, nvmlDeviceGetMemoryInfo, nvmlDeviceGetUtilizationRates,
nvmlDeviceGetComputeRunningProcesses) and the same error
hierarchy shape (`NVMLError` with an integer `.value`, and subclasses such as
`NVMLError_LibraryNotFound` with value 12), so a test injects it and runs the real reader:

    fake = FakeNvml([FakeGpu("GPU-0", "NVIDIA H100 80GB HBM3", 80 * GIB, used=2 * GIB, utilization=35)])
    inventory = PynvmlReader(nvml_module=fake, clock=lambda: 1.0).read()

Failures are scripted: `init_error=NVML_ERROR_LIBRARY_NOT_FOUND` makes `nvmlInit` raise like a
GPU-less machine; `fail={"nvmlDeviceGetMemoryInfo": NVML_ERROR_GPU_IS_LOST}` makes that call
raise (for every device, or only for `fail_index`). Devices are mutable through
`set_memory_used` so multi-node tests can move memory between reads. Like real NVML, every
device call before `nvmlInit` raises `NVMLError_Uninitialized`.

Processes behave as on a real device: a device's used memory is what its processes hold plus
`driver_bytes` (memory NVML counts as used that no process owns: the driver's own reservation),
unless `memory_used` is set explicitly, in which case it is taken as is (a device whose process
list NVML does not show). `processes=None` makes the listing raise NotSupported, as on some vGPU
and MIG set-ups.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace

GIB = 1024**3

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_UNKNOWN = 999


class NVMLError(Exception):
    """Base of the fake errors; `NVMLError(code)` builds the matching subclass, as pynvml does."""

    value: int = NVML_ERROR_UNKNOWN

    def __new__(cls, value: int | None = None) -> NVMLError:
        if cls is NVMLError and value is not None:
            cls = _BY_CODE.get(value, NVMLError)
        obj = Exception.__new__(cls)
        obj.value = cls.value if value is None else value
        return obj

    def __init__(self, value: int | None = None) -> None:
        super().__init__(self.value)

    def __str__(self) -> str:
        return _MESSAGES.get(self.value, "Unknown Error")


class NVMLError_Uninitialized(NVMLError):
    value = NVML_ERROR_UNINITIALIZED


class NVMLError_InvalidArgument(NVMLError):
    value = NVML_ERROR_INVALID_ARGUMENT


class NVMLError_NotSupported(NVMLError):
    value = NVML_ERROR_NOT_SUPPORTED


class NVMLError_NoPermission(NVMLError):
    value = NVML_ERROR_NO_PERMISSION


class NVMLError_DriverNotLoaded(NVMLError):
    value = NVML_ERROR_DRIVER_NOT_LOADED


class NVMLError_LibraryNotFound(NVMLError):
    value = NVML_ERROR_LIBRARY_NOT_FOUND


class NVMLError_GpuIsLost(NVMLError):
    value = NVML_ERROR_GPU_IS_LOST


class NVMLError_Unknown(NVMLError):
    value = NVML_ERROR_UNKNOWN


_BY_CODE: dict[int, type[NVMLError]] = {
    cls.value: cls
    for cls in (
        NVMLError_Uninitialized,
        NVMLError_InvalidArgument,
        NVMLError_NotSupported,
        NVMLError_NoPermission,
        NVMLError_DriverNotLoaded,
        NVMLError_LibraryNotFound,
        NVMLError_GpuIsLost,
        NVMLError_Unknown,
    )
}
_MESSAGES: dict[int, str] = {
    NVML_ERROR_UNINITIALIZED: "Uninitialized",
    NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
    NVML_ERROR_NOT_SUPPORTED: "Not Supported",
    NVML_ERROR_NO_PERMISSION: "Insufficient Permissions",
    NVML_ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded",
    NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
    NVML_ERROR_GPU_IS_LOST: "GPU is lost",
    NVML_ERROR_UNKNOWN: "Unknown Error",
}


@dataclass
class FakeProcess:
    """A compute process on a fake device: `used_bytes=None` is NVML's "not available"."""

    pid: int
    used_bytes: int | None


@dataclass
class FakeGpu:
    """One fake device. `utilization=None` makes nvmlDeviceGetUtilizationRates raise NotSupported.

    `memory_used=None`: the sum of the processes' bytes plus `driver_bytes` (see the module doc)."""

    uuid: str
    name: str
    memory_total: int
    memory_used: int | None = 0
    utilization: int | None = 0
    processes: list[FakeProcess] | None = field(default_factory=list)
    driver_bytes: int = 0

    def used(self) -> int:
        if self.memory_used is not None:
            return self.memory_used
        held = sum(p.used_bytes or 0 for p in self.processes or ())
        return min(self.memory_total, held + self.driver_bytes)


@dataclass(frozen=True)
class FakeHandle:
    index: int


class FakeNvml:
    """A stand-in for the `pynvml` module (see the module docstring). Not thread-safe."""

    NVMLError = NVMLError
    NVMLError_Uninitialized = NVMLError_Uninitialized
    NVMLError_InvalidArgument = NVMLError_InvalidArgument
    NVMLError_NotSupported = NVMLError_NotSupported
    NVMLError_NoPermission = NVMLError_NoPermission
    NVMLError_DriverNotLoaded = NVMLError_DriverNotLoaded
    NVMLError_LibraryNotFound = NVMLError_LibraryNotFound
    NVMLError_GpuIsLost = NVMLError_GpuIsLost
    NVMLError_Unknown = NVMLError_Unknown

    def __init__(
        self,
        gpus: Sequence[FakeGpu] = (),
        *,
        init_error: int | None = None,
        fail: dict[str, int] | None = None,
        fail_index: int | None = None,
        legacy_bytes: bool = False,
    ) -> None:
        self.gpus = list(gpus)
        self.init_error = init_error
        self.fail = dict(fail or {})
        self.fail_index = fail_index
        self.legacy_bytes = legacy_bytes
        self.initialized = False
        self.init_calls = 0
        self.shutdown_calls = 0

    # -- scripting helpers (not part of pynvml) --------------------------------------------------
    def set_memory_used(self, index: int, used: int) -> None:
        self.gpus[index].memory_used = used

    def _check(self, function: str, index: int | None = None) -> None:
        if not self.initialized:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)
        code = self.fail.get(function)
        if code is not None and (self.fail_index is None or index == self.fail_index):
            raise NVMLError(code)

    def _gpu(self, handle: FakeHandle, function: str) -> FakeGpu:
        self._check(function, handle.index)
        return self.gpus[handle.index]

    def _str(self, text: str) -> str | bytes:
        return text.encode() if self.legacy_bytes else text

    # -- the pynvml API ----------------------------------------------------------------------------
    def nvmlInit(self) -> None:  # the methods below keep pynvml's camelCase names
        self.init_calls += 1
        if self.init_error is not None:
            raise NVMLError(self.init_error)
        self.initialized = True

    def nvmlShutdown(self) -> None:
        self._check("nvmlShutdown")
        self.shutdown_calls += 1
        self.initialized = False

    def nvmlDeviceGetCount(self) -> int:
        self._check("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeHandle:
        self._check("nvmlDeviceGetHandleByIndex", index)
        if not 0 <= index < len(self.gpus):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return FakeHandle(index)

    def nvmlDeviceGetUUID(self, handle: FakeHandle) -> str | bytes:
        return self._str(self._gpu(handle, "nvmlDeviceGetUUID").uuid)

    def nvmlDeviceGetName(self, handle: FakeHandle) -> str | bytes:
        return self._str(self._gpu(handle, "nvmlDeviceGetName").name)

    def nvmlDeviceGetMemoryInfo(self, handle: FakeHandle) -> SimpleNamespace:
        gpu = self._gpu(handle, "nvmlDeviceGetMemoryInfo")
        used = gpu.used()
        return SimpleNamespace(total=gpu.memory_total, used=used, free=gpu.memory_total - used)

    def nvmlDeviceGetUtilizationRates(self, handle: FakeHandle) -> SimpleNamespace:
        gpu = self._gpu(handle, "nvmlDeviceGetUtilizationRates")
        if gpu.utilization is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return SimpleNamespace(gpu=gpu.utilization, memory=0)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: FakeHandle) -> list[SimpleNamespace]:
        gpu = self._gpu(handle, "nvmlDeviceGetComputeRunningProcesses")
        if gpu.processes is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return [SimpleNamespace(pid=p.pid, usedGpuMemory=p.used_bytes) for p in gpu.processes]
