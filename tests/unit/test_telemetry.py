"""The engine-stats path's pure parts: the vLLM stat-logger tap, snapshots, the board poller."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from cluster.stats_tap import StatsTap
from router.routing.snapshot import ClusterSnapshot, GpuMemory, ReplicaStats
from router.routing.watermarks import Watermarks
from serve_apps.telemetry.board_reader import BoardReader
from tests.fakes import FakeClock as Clock


@dataclass
class PrefixCacheStats:  # the attributes vLLM's PrefixCacheStats has
    queries: int = 0
    hits: int = 0


@dataclass
class SchedulerStats:  # the attributes vLLM's SchedulerStats has
    num_running_reqs: int = 0
    num_waiting_reqs: int = 0
    kv_cache_usage: float = 0.0
    prefix_cache_stats: PrefixCacheStats = field(default_factory=PrefixCacheStats)


def test_tap_keeps_latest_and_accumulates_prefix_counters() -> None:
    clock = Clock()
    tap = StatsTap(clock=clock)
    tap.record(SchedulerStats(2, 1, 0.4, PrefixCacheStats(100, 0)), None, engine_idx=0)
    clock.now = 1001.0
    tap.record(SchedulerStats(3, 0, 0.6, PrefixCacheStats(100, 64)), None, mm_cache_stats=None, engine_idx=0)
    tap.record(None, None)  # vLLM passes None when a step carried no scheduler stats
    reading = tap.reading(engine_idle=False)
    assert (reading.num_running, reading.num_waiting, reading.kv_cache_usage) == (3, 0, 0.6)
    assert (reading.prefix_cache_queries, reading.prefix_cache_hits) == (200, 64)
    assert reading.last_step_at == 1001.0


def test_idle_engine_reads_empty_but_keeps_counters() -> None:
    tap = StatsTap(clock=Clock())
    tap.record(SchedulerStats(1, 0, 0.3, PrefixCacheStats(10, 5)))
    idle = tap.reading(engine_idle=True)
    assert (idle.num_running, idle.num_waiting, idle.kv_cache_usage) == (0, 0, 0.0)
    assert idle.prefix_cache_hits == 5


def _stats(model: str, replica: str, read_at: float, **kw: Any) -> ReplicaStats:
    base = dict(
        model=model,
        replica_id=replica,
        node_id="n1",
        read_at=read_at,
        kv_cache_usage=0.5,
        num_running=1,
        num_waiting=0,
        prefix_cache_queries=10,
        prefix_cache_hits=4,
        num_gpu_blocks=364,
        block_size=128,
    )
    return ReplicaStats(**{**base, **kw})


def test_replica_stats_round_trip_and_derived_values() -> None:
    stats = _stats("m", "r1", 10.0, gpus=(GpuMemory(0, "GPU-a", 60, 80),))
    assert ReplicaStats.from_dict(stats.to_dict()) == stats
    assert stats.kv_budget_tokens == 364 * 128 == 46_592
    assert stats.prefix_cache_hit_rate == 0.4
    assert (
        stats.gpus[0].used_bytes / stats.gpus[0].total_bytes == 0.75 and stats.gpus[0].other_bytes == 60
    )  # no engine: all "other"


def test_snapshot_staleness_and_model_filter() -> None:
    snapshot = ClusterSnapshot(
        taken_at=100.0, replicas=(_stats("a", "r1", 99.5), _stats("b", "r2", 97.0)), max_age_s=1.0
    )
    assert [r.replica_id for r in snapshot.for_model("a")] == ["r1"]
    assert not snapshot.is_stale(snapshot.replicas[0], now=100.0)
    assert snapshot.is_stale(snapshot.replicas[1], now=100.0)
    rendered = snapshot.to_dict(now=100.0)["replicas"]
    assert [(r["age_s"], r["stale"]) for r in rendered] == [(0.5, False), (3.0, True)]


class FakeRemote:
    def __init__(self, fn: Any) -> None:
        self._fn = fn

    def remote(self, *args: Any) -> Any:
        async def call() -> Any:
            return self._fn(*args)

        return call()


class HungRemote:
    """An actor method whose call never answers (the actor's process stopped: SIGSTOP, a wedged loop)."""

    def remote(self, *args: Any) -> Any:
        return asyncio.Event().wait()


class FakeBoard:
    """Same call shape as the TelemetryBoard actor handle: board.snapshot.remote(now)."""

    def __init__(self, rows: list[dict[str, Any]]) -> None:
        self.rows = rows
        self.fail = False
        self.snapshot: FakeRemote | HungRemote = FakeRemote(self._snapshot)

    def _snapshot(self, now: float) -> list[dict[str, Any]]:
        if self.fail:
            raise ConnectionError("actor died")
        return self.rows


def test_poller_builds_snapshots_and_survives_board_loss() -> None:
    clock = Clock(50.0)
    board = FakeBoard([_stats("b", "r2", 49.9).to_dict(), _stats("a", "r1", 49.8).to_dict()])
    marks = {"a": Watermarks(kv_cache=0.5, low=0.25), "b": Watermarks()}
    poller = BoardReader(board, min_interval_s=0.2, max_age_s=1.0, watermarks_for=marks.__getitem__, clock=clock)
    assert poller.latest().replicas == () and poller.latest().errors
    snapshot = asyncio.run(poller.refresh())
    assert [r.model for r in snapshot.replicas] == ["a", "b"] and snapshot.taken_at == 50.0
    # assessed once, each replica against its own model's watermarks (kv usage 0.5 for both)
    assert snapshot.saturations["r1"].value == 1.0 and snapshot.saturations["r2"].value == 0.5 / 0.85
    board.fail = True
    clock.now = 60.0
    after = asyncio.run(poller.refresh())
    assert after.replicas == snapshot.replicas  # kept, and now stale by age
    assert after.saturations == snapshot.saturations
    assert after.errors and all(after.is_stale(r, clock.now) for r in after.replicas)


def test_a_hung_board_is_a_lost_board_after_the_call_timeout() -> None:
    """A head actor that stopped answering (its process stopped, its node overloaded) never answers the call:
    the poll gives up after its timeout, keeps the old replicas to age into stale, and goes on."""
    clock = Clock(50.0)
    board = FakeBoard([_stats("a", "r1", 49.9).to_dict()])
    refreshed: list[ClusterSnapshot] = []
    poller = BoardReader(
        board,
        min_interval_s=0.2,
        max_age_s=1.0,
        watermarks_for=lambda _: Watermarks(),
        clock=clock,
        on_refresh=lambda snapshot, _: refreshed.append(snapshot),
        call_timeout_s=0.01,
    )
    first = asyncio.run(poller.refresh())
    board.snapshot = HungRemote()
    clock.now = 60.0
    after = asyncio.run(poller.refresh())
    assert after.replicas == first.replicas and after.errors and "TimeoutError" in after.errors[0]
    assert after.is_stale(after.replicas[0], clock.now) and len(refreshed) == 2
