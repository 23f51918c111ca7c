"""What the router sees of the cluster: per-replica engine stats and the immutable snapshot.

The direct path (Ray's metrics export lags seconds, too late for a watermark):

    vLLM engine step ──record()──▶ StatsTap (in the LLMServer replica process)
    replica push loop (every push_period_s) ──▶ TelemetryBoard (a named Ray actor)
    gateway watch (answered on a push) ──▶ ClusterSnapshot (immutable) ──▶ router

Each `ReplicaStats` carries `read_at`: on the gateway's own clock, when the reading reached the board
(the board's `AGE_KEY` age of the row, measured on the board's clock, taken from the reader's time: no
two machines' clocks are ever compared, so a replica whose clock is skewed is not stale for it); the
snapshot's `taken_at` is when the gateway fetched the board. A replica whose stats are older
than `max_age_s` is stale, and the router treats a stale replica as saturated. The gateway's
reader also attaches each replica's saturation (router/routing/saturation.py `assess`), computed once per
snapshot for every reader.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

AGE_KEY = "board_age_s"  # a board row's age on the board's clock (serve_apps/telemetry/board.py)

if TYPE_CHECKING:  # router/routing/saturation.py builds on this module; only the annotation is needed here
    from router.routing.saturation import Saturation


@dataclass(frozen=True)
class GpuProcessMemory:
    """One process on a replica's GPU: `engine` when it is the replica's own engine."""

    pid: int
    used_bytes: int | None
    engine: bool


@dataclass(frozen=True)
class GpuMemory:
    """One of a replica's GPUs, its memory split by owner (cluster/hardware/gpu_memory.py does the split).

    `engine_bytes`: what the replica's own engine holds; `reserved_bytes`: what it reserves at start
    (`gpu_memory_utilization × total`); `attribution` says how `engine_bytes` was found: "pid" (NVML
    listed the engine's processes), "reservation" (NVML listed none of them, e.g. PIDs of another PID
    namespace: the engine is assumed to hold its reservation) or "none" (no engine on this device).
    """

    index: int
    uuid: str
    used_bytes: int
    total_bytes: int
    engine_bytes: int = 0
    reserved_bytes: int = 0
    attribution: str = "none"
    utilization_gpu: int | None = None  # SM utilisation, percent
    processes: tuple[GpuProcessMemory, ...] = ()

    @property
    def other_bytes(self) -> int:
        """Memory held by anything but the replica's engine (other processes, the driver)."""
        return max(0, self.used_bytes - self.engine_bytes)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GpuMemory:
        processes = tuple(GpuProcessMemory(**p) for p in data.get("processes", ()))
        return cls(**{**data, "processes": processes})


@dataclass(frozen=True)
class ReplicaStats:
    """One replica's engine state as read at `read_at` (seconds since the epoch)."""

    model: str
    replica_id: str
    node_id: str
    read_at: float
    kv_cache_usage: float  # 0..1 of the engine's KV blocks in use by requests
    num_running: int
    num_waiting: int
    prefix_cache_queries: int  # cumulative tokens queried against the prefix cache
    prefix_cache_hits: int  # cumulative tokens found in it
    num_gpu_blocks: int | None  # KV blocks the engine allocated (CPU engines too)
    block_size: int | None
    last_step_at: float | None = None  # when the engine last reported a scheduler step
    gpus: tuple[GpuMemory, ...] = ()
    gpu_error: str | None = None  # the replica has GPUs but NVML failed: the reading counts as stale
    # what the replica says of its own engine (serve_apps/engine/llm_server.py): the precision it runs in, the
    # CPU class under a vLLM-CPU engine, the numerics check's state, and a fault that keeps it out of
    # routing however fresh the reading (numerics failed, engine stalled); notes are for people
    precision: str | None = None
    cpu_class: str | None = None
    numerics: str | None = None
    fault: str | None = None
    notes: tuple[str, ...] = ()

    @property
    def prefix_cache_hit_rate(self) -> float:
        return self.prefix_cache_hits / self.prefix_cache_queries if self.prefix_cache_queries else 0.0

    @property
    def kv_budget_tokens(self) -> int | None:
        if self.num_gpu_blocks is None or self.block_size is None:
            return None
        return self.num_gpu_blocks * self.block_size

    def age(self, now: float) -> float:
        return max(0.0, now - self.read_at)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["gpus"] = [g.to_dict() for g in self.gpus]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ReplicaStats:
        gpus = tuple(GpuMemory.from_dict(g) for g in data.get("gpus", ()))
        return cls(**{**data, "gpus": gpus, "notes": tuple(data.get("notes", ()))})


@dataclass(frozen=True)
class ClusterSnapshot:
    """Immutable view handed to the router: every known replica, as of `taken_at`."""

    taken_at: float
    replicas: tuple[ReplicaStats, ...] = ()
    max_age_s: float = 1.0
    errors: tuple[str, ...] = field(default=())
    # replica id -> its reading's saturation regardless of age (router/routing/saturation.py `assess`)
    saturations: Mapping[str, Saturation] = field(default_factory=dict, compare=False)

    def for_model(self, model: str) -> tuple[ReplicaStats, ...]:
        return tuple(r for r in self.replicas if r.model == model)

    def is_stale(self, replica: ReplicaStats, now: float) -> bool:
        return replica.age(now) > self.max_age_s

    def unusable(self, replica: ReplicaStats, now: float) -> str | None:
        """Why the replica must not take traffic at `now` (stale stats, or a fault it reports), or None."""
        if self.is_stale(replica, now):
            return f"stats {replica.age(now):.1f}s old > {self.max_age_s:g}s"
        return replica.fault

    def to_dict(self, now: float) -> dict[str, Any]:
        return {
            "taken_at": self.taken_at,
            "max_age_s": self.max_age_s,
            "errors": list(self.errors),
            "replicas": [
                {**r.to_dict(), "age_s": round(r.age(now), 3), "stale": self.is_stale(r, now)} for r in self.replicas
            ],
        }
