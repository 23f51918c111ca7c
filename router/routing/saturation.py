"""Saturation: one number per local replica from its fresh stats.

    saturation = max(kv_usage / kv_watermark,
                     gpu_memory_pressure,              (max over the replica's GPUs)
                     waiting / queue_threshold)

`>= 1.0` means saturated. The gateway's in-flight count is not a term: it is per model, not per
replica (Serve picks the replica), and the burst decision compares it with the model's admission
limit on its own (router/routing/burst.py). Stale stats count as saturated (`math.inf`), and so does a replica
whose GPUs could not be read (NVML failed).

GPU memory pressure, per device (the split comes from cluster/hardware/gpu_memory.py):

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

Computed once per snapshot: the gateway's board reader `assess`es each new snapshot, which then carries
every replica's saturation (`ClusterSnapshot.saturations`); the router, `/metrics` and
`GET /v1/spillover/cluster` (hence `spillover status`) read those values, and the model replicas
answer Serve's routing-stats hook with the same `load` of their own latest reading. Only
staleness depends on the moment of reading: `replica_saturation` checks it at `now`.

Pure: the caller passes `now`; nothing here reads a clock or does I/O.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from router.routing.snapshot import ClusterSnapshot, GpuMemory, ReplicaStats
from router.routing.watermarks import Watermarks

GIB = 1024**3


@dataclass(frozen=True)
class Saturation:
    value: float
    term: str  # which term binds: kv_cache | gpu_memory | queue | stale | fault
    detail: str  # e.g. "kv_usage 0.91 >= 0.85"
    gpu_detail: str = ""  # the GPU memory term's line, also when another term binds ("" without GPUs)
    gpu_pressures: tuple[float, ...] = ()  # each GPU's pressure, in the order of the replica's `gpus`

    @property
    def saturated(self) -> bool:
        return self.value >= 1.0


def _room(gpu: GpuMemory, watermark: float) -> float:
    return watermark * gpu.total_bytes - max(gpu.engine_bytes, gpu.reserved_bytes)


def gpu_memory_pressure(gpu: GpuMemory, watermark: float) -> float:
    """The pressure term of one device (see the module docstring)."""
    room = _room(gpu, watermark)
    return gpu.other_bytes / room if room > 0 else math.inf


def _gpu_line(gpu: GpuMemory, pressure: float, watermark: float) -> str:
    """Why a device reads `pressure`: others' bytes against the room, and the engine's own share."""
    room = _room(gpu, watermark)
    engine = ""
    if gpu.attribution != "none":
        share = gpu.engine_bytes / gpu.total_bytes if gpu.total_bytes else 0.0
        engine = f"engine's own {gpu.engine_bytes / GIB:.1f} GiB ({share:.0%}, by {gpu.attribution})"
    what = f"gpu{gpu.index} others {gpu.other_bytes / GIB:.1f} of {max(room, 0) / GIB:.1f} GiB room" + (
        f", {engine}" if engine else ""
    )
    return f"gpu_memory pressure {pressure:.2f} ({what})"


def load(stats: ReplicaStats, watermarks: Watermarks) -> Saturation:
    """The saturation of a reading regardless of its age (a failed GPU reading counts as stale)."""
    pressures = tuple(gpu_memory_pressure(g, watermarks.gpu_memory) for g in stats.gpus)
    if stats.fault:  # the replica says it must not take traffic: numerics failed, engine stalled
        return Saturation(math.inf, "fault", stats.fault, gpu_pressures=pressures)
    if stats.gpu_error:
        return Saturation(math.inf, "stale", f"GPU reading failed: {stats.gpu_error}", gpu_pressures=pressures)
    terms = [
        (stats.kv_cache_usage / watermarks.kv_cache, "kv_cache", f"kv_usage {stats.kv_cache_usage:.2f}"),
        (stats.num_waiting / watermarks.queue, "queue", f"waiting {stats.num_waiting}"),
    ]
    limits = {"kv_cache": f"{watermarks.kv_cache:g}", "queue": f"{watermarks.queue:g}"}
    gpu_detail = ""
    if stats.gpus:  # the most pressed device binds (the first of equals)
        pressure, index = max((p, -i) for i, p in enumerate(pressures))
        gpu_detail = _gpu_line(stats.gpus[-index], pressure, watermarks.gpu_memory)
        terms.append((pressure, "gpu_memory", gpu_detail))
    value, term, what = max(terms, key=lambda t: t[0])
    relation = ">=" if value >= 1.0 else "<"
    return Saturation(value, term, f"{what} {relation} {limits.get(term, '1')}", gpu_detail, pressures)


def assess(snapshot: ClusterSnapshot, watermarks_for: Callable[[str], Watermarks]) -> ClusterSnapshot:
    """`snapshot` carrying every replica's `load` against its model's watermarks."""
    saturations = {r.replica_id: load(r, watermarks_for(r.model)) for r in snapshot.replicas}
    return replace(snapshot, saturations=saturations)


def _stale(stats: ReplicaStats, snapshot: ClusterSnapshot, now: float) -> Saturation:
    return Saturation(math.inf, "stale", f"stats {stats.age(now):.1f}s old > {snapshot.max_age_s:g}s")


def assessed_at(stats: ReplicaStats, snapshot: ClusterSnapshot, now: float) -> Saturation | None:
    """The snapshot's saturation of `stats` at `now` (stale once too old); None where not assessed."""
    assessed = snapshot.saturations.get(stats.replica_id)
    if assessed is None:
        return None
    return _stale(stats, snapshot, now) if snapshot.is_stale(stats, now) else assessed


def replica_saturation(
    stats: ReplicaStats,
    watermarks: Watermarks,
    *,
    snapshot: ClusterSnapshot,
    now: float,
) -> Saturation:
    """Stale at `now` (stats older than the snapshot's `max_age_s`) or the reading's `load`: the
    snapshot's own when it was assessed, else computed here."""
    if (assessed := assessed_at(stats, snapshot, now)) is not None:
        return assessed
    if snapshot.is_stale(stats, now):
        return _stale(stats, snapshot, now)
    return load(stats, watermarks)


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def cluster_view(snapshot: ClusterSnapshot, now: float) -> dict[str, Any]:
    """`snapshot.to_dict(now)` plus, for each assessed replica, its saturation at `now`
    (`saturation`, null when infinite: stale or GPUs unreadable; `saturation_term`,
    `saturation_detail`) and per GPU its `pressure` (null when infinite) and `other_bytes`: what
    `GET /v1/spillover/cluster` answers and `spillover status` shows, the numbers the router uses."""
    view = snapshot.to_dict(now)
    for stats, row in zip(snapshot.replicas, view["replicas"], strict=True):
        sat = assessed_at(stats, snapshot, now)
        if sat is None:
            continue
        row.update(saturation=_finite(sat.value), saturation_term=sat.term, saturation_detail=sat.detail)
        pressures = snapshot.saturations[stats.replica_id].gpu_pressures
        for gpu, gpu_row, pressure in zip(stats.gpus, row["gpus"], pressures, strict=False):
            gpu_row.update(other_bytes=gpu.other_bytes, pressure=_finite(pressure))
    return view
