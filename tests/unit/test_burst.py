"""Saturation, hysteresis and the burst decision: table-driven, fake clock, pure."""

from __future__ import annotations

import math

import pytest

from router.routing.burst import BurstInputs, decide, release_ratio
from router.routing.saturation import replica_saturation
from router.routing.snapshot import ClusterSnapshot, GpuMemory, ReplicaStats
from router.routing.watermarks import Watermarks

WM = Watermarks()  # kv 0.85, gpu 0.95, queue 8, low 0.75
NOW = 1000.0


def replica(rid: str = "r1", *, kv: float = 0.1, waiting: int = 0, age: float = 0.1, gpu: float = 0.0) -> ReplicaStats:
    gpus = (GpuMemory(0, "GPU-0", int(gpu * 100), 100),) if gpu else ()
    return ReplicaStats(
        model="m",
        replica_id=rid,
        node_id="n",
        read_at=NOW - age,
        kv_cache_usage=kv,
        num_running=1,
        num_waiting=waiting,
        prefix_cache_queries=0,
        prefix_cache_hits=0,
        num_gpu_blocks=100,
        block_size=16,
        gpus=gpus,
    )


def snap(*replicas: ReplicaStats) -> ClusterSnapshot:
    return ClusterSnapshot(taken_at=NOW, replicas=replicas, max_age_s=1.0)


@pytest.mark.parametrize(
    ("stats", "value", "term"),
    [
        (replica(kv=0.425), 0.5, "kv_cache"),
        (replica(kv=0.935), 1.1, "kv_cache"),
        (replica(kv=0.1, waiting=12), 1.5, "queue"),
        (replica(kv=0.1, gpu=0.99), 0.99 / 0.95, "gpu_memory"),  # no engine on it: used / (wm x total)
        (replica(kv=0.1, age=3.0), math.inf, "stale"),
    ],
)
def test_saturation_terms(stats: ReplicaStats, value: float, term: str) -> None:
    sat = replica_saturation(stats, WM, snapshot=snap(stats), now=NOW)
    assert sat.term == term
    assert sat.value == pytest.approx(value)
    assert sat.saturated == (value >= 1.0)


def test_saturation_detail_text() -> None:
    sat = replica_saturation(replica(kv=0.91), WM, snapshot=snap(replica(kv=0.91)), now=NOW)
    assert sat.detail == "kv_usage 0.91 >= 0.85"


def inputs(**kw: object) -> BurstInputs:
    base: dict[str, object] = dict(
        model="m", watermarks=WM, inflight=0, admission_limit=None, local_only=False, providers=("cloud-sim",)
    )
    return BurstInputs(**{**base, **kw})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("replicas", "kw", "route", "reason_part"),
    [
        ((replica("a", kv=0.2),), {}, "local", "local capacity (1/1 replicas)"),
        ((replica("a", kv=0.9), replica("b", kv=0.2)), {}, "local", "(1/2 replicas)"),
        ((replica("a", kv=0.91),), {}, "cloud", "kv_usage 0.91 >= 0.85 on all 1 replicas"),
        ((replica("a", kv=0.9), replica("b", kv=0.95)), {}, "cloud", "on all 2 replicas"),
        ((replica("a", kv=0.91),), {"local_only": True}, "wait", "local_only"),
        ((replica("a", kv=0.91),), {"providers": ()}, "wait", "no cloud provider serves m"),
        ((replica("a", kv=0.2),), {"inflight": 4, "admission_limit": 4}, "cloud", "inflight 4 >= admission limit 4"),
        ((replica("a", kv=0.2),), {"inflight": 3, "admission_limit": 4}, "local", "local capacity"),
        ((replica("a", kv=0.2, age=2.0),), {}, "cloud", "stats 2.0s old > 1s"),
        ((), {}, "cloud", "no replica of m has reported engine stats"),
    ],
)
def test_decide(replicas: tuple[ReplicaStats, ...], kw: dict, route: str, reason_part: str) -> None:
    decision = decide(inputs(**kw), snap(*replicas), NOW, frozenset())
    assert decision.route == route
    assert reason_part in decision.reason
    assert decision.target == {"local": "local:m", "cloud": "cloud:cloud-sim", "wait": ""}[route]


def test_hysteresis_holds_until_below_low_mark() -> None:
    latched: frozenset[str] = frozenset()
    timeline = [(0.80, "local"), (0.86, "cloud"), (0.80, "cloud"), (0.76, "cloud"), (0.74, "local"), (0.80, "local")]
    routes = []
    for kv, _ in timeline:
        decision = decide(inputs(), snap(replica("a", kv=kv)), NOW, latched)
        latched = decision.latched
        routes.append(decision.route)
    assert routes == [expected for _, expected in timeline]
    assert release_ratio(WM) == pytest.approx(0.75 / 0.85)


def test_hysteresis_reason_mentions_latch() -> None:
    decision = decide(inputs(), snap(replica("a", kv=0.80)), NOW, frozenset({"a"}))
    assert decision.route == "cloud" and "hysteresis" in decision.reason
