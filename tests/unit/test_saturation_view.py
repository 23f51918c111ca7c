"""Saturation computed once per snapshot and shown the same everywhere: the router's decision,
`GET /v1/spillover/cluster`, `spillover status` and `/metrics` read the values the gateway's poller
attached to the snapshot (router/routing/saturation.py `assess`); only staleness is judged when read."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from router.routing.burst import BurstInputs, decide
from router.routing.saturation import assess, cluster_view, replica_saturation
from router.routing.snapshot import ClusterSnapshot, GpuMemory, ReplicaStats
from router.routing.watermarks import Watermarks
from serve_apps.telemetry.metrics import GatewayMetrics
from spillover.main import main

GIB = 1024**3
MARKS = {"m": Watermarks(kv_cache=0.5, gpu_memory=0.95, low=0.25)}


def stats(replica: str, read_at: float, kv: float, gpus: tuple[GpuMemory, ...] = ()) -> ReplicaStats:
    return ReplicaStats("m", replica, "n1", read_at, kv, 1, 0, 10, 5, 364, 128, gpus=gpus)


def snapshot() -> ClusterSnapshot:
    crowded = GpuMemory(0, "GPU-0", 74 * GIB, 80 * GIB, 72 * GIB, 72 * GIB, "pid")  # others 2 of 4 GiB room
    replicas = (stats("fresh", 99.8, 0.2, (crowded,)), stats("old", 90.0, 0.1))
    return assess(ClusterSnapshot(taken_at=99.9, replicas=replicas, max_age_s=1.0), MARKS.__getitem__)


def test_the_router_reads_the_snapshots_saturation() -> None:
    snap = snapshot()
    fresh, old = snap.replicas
    assert snap.saturations["fresh"].value == 0.5 and snap.saturations["fresh"].term == "gpu_memory"
    # the values the snapshot carries, not recomputed (other watermarks passed here change nothing)
    assert replica_saturation(fresh, Watermarks(), snapshot=snap, now=100.0) is snap.saturations["fresh"]
    assert replica_saturation(old, Watermarks(), snapshot=snap, now=100.0).term == "stale"  # judged at `now`
    inputs = BurstInputs("m", MARKS["m"], inflight=0, admission_limit=None, local_only=False, providers=())
    decision = decide(inputs, snap, 100.0, frozenset())
    assert decision.route == "local" and snap.saturations["fresh"].gpu_detail in decision.reason


def test_cluster_view_shows_the_same_saturation_and_null_for_infinite() -> None:
    view = json.loads(json.dumps(cluster_view(snapshot(), 100.0), allow_nan=False))  # valid JSON
    fresh, old = view["replicas"]
    assert (fresh["saturation"], fresh["saturation_term"]) == (0.5, "gpu_memory")
    assert fresh["gpus"][0]["pressure"] == 0.5 and fresh["gpus"][0]["other_bytes"] == 2 * GIB
    assert (old["saturation"], old["saturation_term"], old["stale"]) == (None, "stale", True)
    assert old["saturation_detail"] == "stats 10.0s old > 1s"


def test_metrics_export_the_same_values() -> None:
    metrics = GatewayMetrics()
    metrics.replicas(snapshot(), 100.0)
    text = metrics.render().decode()
    assert 'spillover_replica_saturation{model="m",replica="fresh"} 0.5' in text
    assert 'spillover_replica_saturation{model="m",replica="old"} +Inf' in text
    assert 'spillover_replica_gpu_memory_pressure{gpu="0",model="m",replica="fresh"} 0.5' in text


def test_status_shows_what_the_gateway_answered(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    answer = {"now": 100.0, "models": ["m"], **json.loads(json.dumps(cluster_view(snapshot(), 100.0)))}

    def get_json(url: str, path: str, key_env: str) -> dict[str, Any]:
        assert path == "/v1/spillover/cluster"
        return answer

    monkeypatch.setattr("spillover.status.get_json", get_json)
    monkeypatch.setattr("spillover.status.time.time", lambda: 100.0)
    monkeypatch.delenv("SPILLOVER_FAKE_NVML", raising=False)
    assert main(["status", "--url", "http://gw", "--json"]) == 0
    fresh, old = json.loads(capsys.readouterr().out)["replicas"]
    assert (fresh["saturation"], fresh["saturation_term"], fresh["gpus"][0]["pressure"]) == (0.5, "gpu_memory", 0.5)
    assert math.isinf(old["saturation"]) and old["saturation_term"] == "stale"
    assert main(["status", "--url", "http://gw"]) == 0
    table = capsys.readouterr().out
    assert "stale" in table and "pressure 0.50" in table
