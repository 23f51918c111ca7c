"""What the CPU under a vLLM-CPU engine can do, read from /proc/cpuinfo.

Machines of one kind come with different CPUs: Intel Xeons with AMX-BF16 and AVX512-BF16, and AMD
EPYCs with AVX2 only. bfloat16 is native on the first (AMX tiles, AVX512-BF16 dot products) and
emulated on the second, where vLLM-CPU 0.32 also takes other kernels (its `_C_AVX2` build, the `vec`
attention path): measured there, bf16 compiled answered wrong and ran ~4x slower than its fit. So the
precision a CPU engine runs in (cluster/precision/choice.py) and the compute model it is admitted by
(`models[].perf.cpu`) both depend on the class read here:

    amx-bf16      AMX tiles with bf16 (amx_bf16): vLLM's AMX attention and oneDNN's AMX GEMMs
    avx512-bf16   AVX-512 with native bf16 dot products (avx512_bf16), no AMX
    avx512        AVX-512 without bf16
    avx2          AVX2 only (no AVX-512)
    other         none of these (or not x86)
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

CpuClass = Literal["amx-bf16", "avx512-bf16", "avx512", "avx2", "other"]
CPU_CLASSES: tuple[CpuClass, ...] = ("amx-bf16", "avx512-bf16", "avx512", "avx2", "other")
CPUINFO = Path("/proc/cpuinfo")
_SHOWN_FLAGS = ("amx_bf16", "amx_tile", "avx512_bf16", "avx512f", "avx2")


@dataclass(frozen=True)
class CpuCaps:
    vendor: str
    model_name: str
    flags: frozenset[str]

    @property
    def cpu_class(self) -> CpuClass:
        if "amx_bf16" in self.flags and "amx_tile" in self.flags:
            return "amx-bf16"
        if "avx512_bf16" in self.flags:
            return "avx512-bf16"
        if "avx512f" in self.flags:
            return "avx512"
        if "avx2" in self.flags:
            return "avx2"
        return "other"

    @property
    def native_bf16(self) -> bool:
        return self.cpu_class in ("amx-bf16", "avx512-bf16")

    @property
    def signature(self) -> str:
        """Short and stable for one CPU model and flag set: keys what was learnt about this CPU."""
        text = f"{self.vendor}|{self.model_name}|{' '.join(sorted(self.flags))}"
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def describe(self) -> str:
        shown = [f for f in _SHOWN_FLAGS if f in self.flags]
        name = self.model_name or self.vendor or "unknown CPU"
        return f"{name} ({self.cpu_class}: {' '.join(shown) or 'no SIMD flags'})"

    def to_dict(self) -> dict[str, object]:
        return {
            "vendor": self.vendor,
            "model_name": self.model_name,
            "class": self.cpu_class,
            "flags": [f for f in _SHOWN_FLAGS if f in self.flags],
        }


def parse_cpuinfo(text: str) -> CpuCaps:
    """The first processor's vendor, model name and flags (every core of a machine has the same)."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            if fields:
                break
            continue
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip(), value.strip())
    return CpuCaps(
        vendor=fields.get("vendor_id", ""),
        model_name=fields.get("model name", ""),
        flags=frozenset(fields.get("flags", "").split()),
    )


def read_cpu_caps(path: Path = CPUINFO) -> CpuCaps:
    try:
        return parse_cpuinfo(path.read_text(errors="replace"))
    except OSError:
        return CpuCaps("", "", frozenset())
