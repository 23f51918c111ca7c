"""Gateway metrics: their own registry, the names a scrape shows, and the Grafana dashboard."""

from __future__ import annotations

import json
import re
from pathlib import Path

from router.learning.decision import Attempt, DecisionRecord
from router.routing.saturation import assess
from router.routing.snapshot import ClusterSnapshot, GpuMemory, ReplicaStats
from router.routing.watermarks import Watermarks
from serve_apps.telemetry.metrics import PREFIX, GatewayMetrics

REPO = Path(__file__).resolve().parents[2]
METRIC = re.compile(r"\b(spillover_[a-z_]+)\b")


def metric_names() -> set[str]:
    """The names a scrape shows for every metric of GatewayMetrics (counters get `_total`, histograms
    `_bucket`/`_sum`/`_count`) — what the Grafana dashboard may reference."""
    names = set()
    for metric in GatewayMetrics().registry.collect():
        for sample in metric.samples:
            names.add(sample.name)
        if metric.type == "counter":
            names.add(metric.name + "_total")
        elif metric.type == "histogram":
            names |= {metric.name + "_bucket", metric.name + "_sum", metric.name + "_count"}
        else:
            names.add(metric.name)
    return {n for n in names if n.startswith(PREFIX)}


def test_every_dashboard_query_names_an_exported_metric() -> None:
    dashboard = json.loads((REPO / "cluster/grafana-dashboard.json").read_text())
    exported = metric_names()
    queried = {m for panel in dashboard["panels"] for t in panel["targets"] for m in METRIC.findall(t["expr"])}
    assert queried, "the dashboard has no spillover queries"
    assert queried <= exported, f"not exported: {sorted(queried - exported)}"


def test_observations_show_up_in_a_scrape() -> None:
    metrics = GatewayMetrics()
    metrics.answered("m", "cloud", "cloud:sim", "ok")
    metrics.waiting("m", 2)
    metrics.waited("m", 0.3, "local")
    metrics.decided(0.0004)
    gib = 1024**3
    gpu = GpuMemory(0, "GPU-0", 74 * gib, 80 * gib, 72 * gib, 72 * gib, "pid", utilization_gpu=35)
    replica = ReplicaStats("m", "r1", "n", 10.0, 0.42, 1, 0, 0, 0, 10, 16, gpus=(gpu,))
    snapshot = assess(ClusterSnapshot(10.0, (replica,)), lambda model: Watermarks(kv_cache=0.84, gpu_memory=0.95))
    metrics.replicas(snapshot, now=10.5)
    record = DecisionRecord("x", "1", {}, (), ((), ()), started_at=0.0)
    metrics.recorded(record.with_attempt(Attempt("cloud:sim/m", "ok", 0.1, 10, 5, 0.002)))
    text = metrics.render().decode()
    assert 'spillover_requests_total{model="m",outcome="ok",route="cloud",target="cloud:sim"} 1.0' in text
    assert 'spillover_admission_queue_length{model="m"} 2.0' in text
    assert 'spillover_replica_kv_cache_usage{model="m",replica="r1"} 0.42' in text
    assert 'spillover_replica_saturation{model="m",replica="r1"} 0.5' in text
    assert 'spillover_replica_gpu_memory_pressure{gpu="0",model="m",replica="r1"} 0.5' in text  # 2 of 4 GiB room
    assert 'spillover_replica_gpu_memory_bytes{gpu="0",model="m",owner="engine",replica="r1"} 7.7309411328e+10' in text
    assert 'spillover_replica_gpu_utilization{gpu="0",model="m",replica="r1"} 35.0' in text
    assert 'spillover_tokens_total{kind="completion",target="cloud:sim/m"} 5.0' in text
    assert 'spillover_cost_usd_total{target="cloud:sim/m"} 0.002' in text
    assert "spillover_routing_decision_seconds_count 1.0" in text


def test_gateways_do_not_share_counters() -> None:
    a, b = GatewayMetrics(), GatewayMetrics()
    a.answered("m", "local", "local:m", "ok")
    assert "spillover_requests_total{" not in b.render().decode()


def test_every_dashboard_query_aggregates_across_gateway_replicas() -> None:
    """Each gateway replica is its own series (serve_apps/telemetry/replica_metrics.py): a panel that showed
    one series per replica would show each replica's share, so every query sums (or takes the max of) them."""
    dashboard = json.loads((REPO / "cluster/grafana-dashboard.json").read_text())
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    aggregated = (
        "sum(",
        "sum by",
        "max by",
        "max(",
        "histogram_quantile(0.99, sum by",
        "histogram_quantile(0.95, sum by",
    )
    assert all(e.startswith(aggregated) for e in exprs), [e for e in exprs if not e.startswith(aggregated)]
    titles = " ".join(panel["title"].lower() for panel in dashboard["panels"])
    for topic in ("breakers", "health transitions", "session migrations", "session", "stream continuations"):
        assert topic in titles, topic
