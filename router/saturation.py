"""Saturation: one number per local replica from its fresh stats (DESIGN.md §3).

    saturation = max(kv_usage / kv_watermark,
                     gpu_mem_used / mem_watermark,
                     waiting / queue_threshold,
                     inflight / admission_limit)

`>= 1.0` means saturated. Stale stats count as saturated (`math.inf`). Pure: the caller
passes `now`; nothing here reads a clock or does I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from cluster.config import Watermarks
from cluster.telemetry import ClusterSnapshot, ReplicaStats


@dataclass(frozen=True)
class Saturation:
    value: float
    term: str  # which term binds: kv_cache | gpu_memory | queue | inflight | stale
    detail: str  # e.g. "kv_usage 0.91 >= 0.85"

    @property
    def saturated(self) -> bool:
        return self.value >= 1.0


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
    terms = [
        (
            stats.kv_cache_usage / watermarks.kv_cache,
            "kv_cache",
            f"kv_usage {stats.kv_cache_usage:.2f}",
            watermarks.kv_cache,
        ),
        (
            stats.gpu_memory_fraction / watermarks.gpu_memory,
            "gpu_memory",
            f"gpu_mem {stats.gpu_memory_fraction:.2f}",
            watermarks.gpu_memory,
        ),
        (stats.num_waiting / watermarks.queue, "queue", f"waiting {stats.num_waiting}", watermarks.queue),
    ]
    if admission_limit:
        terms.append((inflight / admission_limit, "inflight", f"inflight {inflight}", admission_limit))
    value, term, what, limit = max(terms, key=lambda t: t[0])
    relation = ">=" if value >= 1.0 else "<"
    return Saturation(value, term, f"{what} {relation} {limit:g}")
