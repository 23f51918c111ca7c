"""Saturation: one number per local replica from its fresh stats.

    saturation = max(kv_usage / kv_watermark,
                     gpu_memory_pressure,              (max over the replica's GPUs)
                     waiting / queue_threshold,
                     inflight / admission_limit)

`>= 1.0` means saturated. Stale stats count as saturated (`math.inf`), and so does a replica
whose GPUs could not be read (NVML failed).

GPU memory pressure, per device (the split comes from cluster/gpu_memory.py):

    room     = gpu_memory_watermark × total − max(engine_bytes, reserved_bytes)
    pressure = other_bytes / room            (math.inf when room <= 0)

vLLM reserves `gpu_memory_utilization × total` (`reserved_bytes`) when its engine starts, so
whole-device used/total of an idle replica is already ~0.9. The pressure instead measures what
the engine cannot control: other processes (a co-tenant, a leak, the driver) eating the headroom
the engine needs. It is ~0 on an idle replica, and reaches 1.0 exactly when the device's free
memory falls to the floor `(1 − gpu_memory_watermark) × total` with the engine holding (at least)
its reservation. `room <= 0` means the engine's own reservation already passes the watermark: the
config check refuses such settings. A device without an engine (`reserved_bytes` 0) reads
used / (watermark × total), the plain whole-device fraction against the watermark.

Pure: the caller passes `now`; nothing here reads a clock or does I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from router.snapshot import ClusterSnapshot, GpuMemory, ReplicaStats
from router.watermarks import Watermarks

GIB = 1024**3


@dataclass(frozen=True)
class Saturation:
    value: float
    term: str  # which term binds: kv_cache | gpu_memory | queue | inflight | stale
    detail: str  # e.g. "kv_usage 0.91 >= 0.85"
    gpu_detail: str = ""  # the GPU memory term's line, also when another term binds ("" without GPUs)

    @property
    def saturated(self) -> bool:
        return self.value >= 1.0


def _room(gpu: GpuMemory, watermark: float) -> float:
    return watermark * gpu.total_bytes - max(gpu.engine_bytes, gpu.reserved_bytes)


def gpu_memory_pressure(gpu: GpuMemory, watermark: float) -> float:
    """The pressure term of one device (see the module docstring)."""
    room = _room(gpu, watermark)
    return gpu.other_bytes / room if room > 0 else math.inf


def gpu_term(gpus: tuple[GpuMemory, ...], watermark: float) -> tuple[float, str]:
    """The most pressed device's pressure and a line saying why (0.0 and "" without GPUs)."""
    if not gpus:
        return 0.0, ""
    pressure, gpu = max(((gpu_memory_pressure(g, watermark), g) for g in gpus), key=lambda pg: pg[0])
    room = _room(gpu, watermark)
    engine = ""
    if gpu.attribution != "none":
        share = gpu.engine_bytes / gpu.total_bytes if gpu.total_bytes else 0.0
        engine = f"engine's own {gpu.engine_bytes / GIB:.1f} GiB ({share:.0%}, by {gpu.attribution})"
    what = f"gpu{gpu.index} others {gpu.other_bytes / GIB:.1f} of {max(room, 0) / GIB:.1f} GiB room" + (
        f", {engine}" if engine else ""
    )
    return pressure, f"gpu_memory pressure {pressure:.2f} ({what})"


def replica_saturation(
    stats: ReplicaStats,
    watermarks: Watermarks,
    *,
    snapshot: ClusterSnapshot,
    now: float,
    inflight: int = 0,
    admission_limit: int | None = None,
) -> Saturation:
    if snapshot.is_stale(stats, now):
        age = stats.age(now)
        return Saturation(math.inf, "stale", f"stats {age:.1f}s old > {snapshot.max_age_s:g}s")
    if stats.gpu_error:
        return Saturation(math.inf, "stale", f"GPU reading failed: {stats.gpu_error}")
    terms = [
        (stats.kv_cache_usage / watermarks.kv_cache, "kv_cache", f"kv_usage {stats.kv_cache_usage:.2f}"),
        (stats.num_waiting / watermarks.queue, "queue", f"waiting {stats.num_waiting}"),
    ]
    limits = {"kv_cache": f"{watermarks.kv_cache:g}", "queue": f"{watermarks.queue:g}"}
    if admission_limit:
        terms.append((inflight / admission_limit, "inflight", f"inflight {inflight}"))
        limits["inflight"] = f"{admission_limit:g}"
    gpu_detail = ""
    if stats.gpus:
        pressure, gpu_detail = gpu_term(stats.gpus, watermarks.gpu_memory)
        terms.append((pressure, "gpu_memory", gpu_detail))
    value, term, what = max(terms, key=lambda t: t[0])
    relation = ">=" if value >= 1.0 else "<"
    return Saturation(value, term, f"{what} {relation} {limits.get(term, '1')}", gpu_detail)
