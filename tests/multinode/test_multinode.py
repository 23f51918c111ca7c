"""Several Ray nodes on one machine (`ray.cluster_utils.Cluster`): placement, per-node NVML, node loss.

Two nodes, each declaring one GPU (`num_gpus=1`, no real device) and started with its own
SPILLOVER_FAKE_NVML file (the simulated GPUs of that "host"): a model with two replicas that need a
GPU each lands one replica per node. Each replica's engine reservation (90% of its GPU, as vLLM
pre-allocates) shows as its own process, so idle replicas read only the driver's share of GPU memory
pressure (0.6 GiB of 4 GiB room) although NVML says 90% used; a co-tenant written into one node's
file raises only that replica's pressure. Both readings reach the gateway's `ClusterSnapshot` through
the real TelemetryBoard and poller.
Removing a node mid-run is handled like a failed replica: its stats go stale, it counts as
saturated, the admission limit shrinks to the replicas left, and the model is not marked down
while one replica still reports.

A session of its own (not tests/integration's): one process can hold one Ray.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import ray
from ray import serve
from ray.cluster_utils import Cluster

from cluster.config.deployment import SpilloverConfig, parse_config
from cluster.hardware.nvml import FAKE_NVML_ENV
from cluster.hardware.nvml_fake import GIB
from cluster.hardware.nvml_sim import DRIVER_GIB, write_default_file
from router.resilience.health import Health
from router.routing.saturation import gpu_memory_pressure, replica_saturation
from router.routing.snapshot import ClusterSnapshot
from serve_apps.dispatch.dispatcher import Dispatcher
from serve_apps.resilience.state import Resilience
from serve_apps.telemetry.board import get_or_create_board, kill_board
from serve_apps.telemetry.board_reader import BoardReader
from tests.multinode.stats_replica import StatsReplica

pytestmark = pytest.mark.integration
MODEL = "mn-model"
MAX_AGE_S = 1.0
UTILIZATION = 0.9
DRIVER = int(DRIVER_GIB * GIB)  # NVML counts the driver's own memory as used (cluster/hardware/nvml_sim.py)


@pytest.fixture(scope="module")
def gpu_files(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    folder = tmp_path_factory.mktemp("gpus")
    return [write_default_file(folder / f"node-{i}.json", num_gpus=1, total_gib=80) for i in range(2)]


@pytest.fixture(scope="module")
def cluster(gpu_files: list[Path]) -> Iterator[Cluster]:
    head_args = {"num_cpus": 2, "num_gpus": 1, "env_vars": {FAKE_NVML_ENV: str(gpu_files[0])}}
    c = Cluster(initialize_head=True, head_node_args=head_args)
    c.add_node(num_cpus=1, num_gpus=1, env_vars={FAKE_NVML_ENV: str(gpu_files[1])})
    c.wait_for_nodes()
    ray.init(address=c.address)
    try:
        yield c
    finally:
        serve.shutdown()
        kill_board()
        ray.shutdown()
        c.shutdown()


def config() -> SpilloverConfig:
    model = {
        "alias": MODEL,
        "source": "prepared:x",
        "family": "qwen",
        "accelerator": "gpu-sim",
        "replicas": 2,
        "admission_limit": 4,
        "engine_args": {"gpu_memory_utilization": UTILIZATION},
    }
    return parse_config({"watermarks": {"gpu_memory": 0.95}, "models": [model]}, "multinode")


def add_cotenant(file: Path, gib: float) -> None:
    """Another process takes `gib` on the node's GPU (the file is replaced atomically, as a person should)."""
    data = json.loads(file.read_text())
    data["gpus"][0]["processes"] = [{"pid": 999_999, "used_gib": gib}] if gib else []
    tmp = file.with_name(file.name + ".tmp")
    tmp.write_text(json.dumps(data))
    tmp.replace(file)


async def wait_for(
    poller: BoardReader, check: Callable[[ClusterSnapshot], bool], timeout_s: float = 30.0
) -> ClusterSnapshot:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        snapshot = await poller.refresh()
        if check(snapshot):
            return snapshot
        await asyncio.sleep(0.2)
    raise AssertionError(f"timed out; last snapshot: {poller.latest().to_dict(time.time())}")


@ray.remote(num_cpus=0.1)
class ReplicaInGroup:
    """Where a ray.serve.llm replica sits on real GPUs: in its placement group, holding no GPU itself."""

    def footprint(self, fraction: float) -> tuple[list[int], list[int], list[int], str]:
        import os

        from cluster.hardware.nvml import reader_from_env
        from serve_apps.engine.gpu_sim_workers import start_workers
        from serve_apps.engine.gpus import ReplicaGpus, replica_engine

        workers = start_workers(fraction)  # stand-ins for vLLM's GPU workers (Ray actors in the group)
        gpus = ReplicaGpus(reader_from_env(os.environ), fraction, replica_engine(os.getpid()))
        (gpu,), error = gpus.read()
        assert error is None, error
        engine = [p.pid for p in gpu.processes if p.engine]
        del workers
        return list(gpus.footprint.gpu_ids), sorted(gpus.footprint.pids), engine, gpu.attribution


def test_engine_gpus_are_found_through_the_placement_group(cluster: Cluster) -> None:
    """On GPUs the engine's workers are Ray actors in the replica's placement group and the replica holds no
    GPU (ray.get_gpu_ids() is empty in it): the replica must still find its GPU and the workers' PIDs."""
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    group = placement_group([{"CPU": 0.1, "GPU": 1}])
    ray.get(group.ready(), timeout=60)
    try:
        strategy = PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=0)
        replica = ReplicaInGroup.options(scheduling_strategy=strategy).remote()
        gpu_ids, pids, engine, attribution = ray.get(replica.footprint.remote(UTILIZATION), timeout=120)
        print(f"\nplacement-group footprint: GPUs {gpu_ids}, PIDs {pids}, engine PIDs on the GPU {engine}")
        assert len(gpu_ids) == 1 and attribution == "pid"
        assert engine and set(engine) <= set(pids)  # the worker's reservation is attributed to the engine
        ray.kill(replica)
    finally:
        remove_placement_group(group)


def test_replicas_spread_over_nodes_report_their_own_gpu_and_survive_a_node_loss(
    cluster: Cluster, gpu_files: list[Path]
) -> None:
    nodes = [n["NodeID"] for n in ray.nodes() if n["Alive"]]
    assert len(nodes) == 2
    head_node = cluster.head_node.node_id
    serve.run(StatsReplica.bind(MODEL, UTILIZATION), name="multinode", route_prefix=None)
    cfg = config()
    poller = BoardReader(
        get_or_create_board(), min_interval_s=0.2, max_age_s=MAX_AGE_S, watermarks_for=cfg.watermarks_for
    )
    watermark = cfg.watermarks_for(MODEL).gpu_memory

    async def scenario() -> None:
        snapshot = await wait_for(
            poller, lambda s: len({r.node_id for r in s.for_model(MODEL) if r.gpus and r.gpus[0].engine_bytes}) == 2
        )
        replicas = snapshot.for_model(MODEL)
        print(f"\nplacement: {[(r.replica_id[:8], r.node_id[:8]) for r in replicas]}")
        assert {r.node_id for r in replicas} == set(nodes)  # one replica per node
        for replica in replicas:
            (gpu,) = replica.gpus
            assert gpu.used_bytes / gpu.total_bytes == pytest.approx(UTILIZATION, abs=0.01)  # NVML: 90% used, at idle
            assert gpu.attribution == "pid" and gpu.other_bytes == DRIVER  # ... the engine's, but the driver's
            assert gpu_memory_pressure(gpu, watermark) == pytest.approx(DRIVER_GIB / 4)  # 4 GiB of room
            used = gpu.used_bytes / gpu.total_bytes
            print(f"idle {replica.node_id[:8]}: used {used:.0%}, engine's own, pressure {DRIVER_GIB / 4}")

        # a co-tenant takes 5 GiB on the worker's GPU only (room above the 5% floor is 4 GiB)
        worker_file = gpu_files[1]
        add_cotenant(worker_file, 5.0)

        def cotenant_seen(s: ClusterSnapshot) -> bool:
            return any(r.gpus and r.gpus[0].other_bytes > DRIVER for r in s.for_model(MODEL) if r.node_id != head_node)

        snapshot = await wait_for(poller, cotenant_seen)
        now = time.time()
        for replica in snapshot.for_model(MODEL):
            sat = replica_saturation(replica, cfg.watermarks_for(MODEL), snapshot=snapshot, now=now)
            if replica.node_id == head_node:
                assert sat.value < 1, sat
            else:
                assert (sat.term, replica.gpus[0].other_bytes) == ("gpu_memory", 5 * GIB + DRIVER)
                assert sat.value == pytest.approx((5 + DRIVER_GIB) / 4, rel=0.02), sat
                print(f"co-tenant on {replica.node_id[:8]}: {sat.detail}")
        add_cotenant(worker_file, 0)

        dispatcher = Dispatcher(cfg, local=None, providers={}, snapshot=poller.latest)  # type: ignore[arg-type]
        resilience = Resilience(cfg)
        now = time.time()
        assert dispatcher.admission.limit(MODEL, snapshot, now) == 8  # 4 per fresh replica

        worker = next(n for n in cluster.worker_nodes)
        lost_node = worker.node_id
        cluster.remove_node(worker)
        removed_at = time.monotonic()
        snapshot = await wait_for(
            poller, lambda s: any(s.is_stale(r, time.time()) for r in s.for_model(MODEL) if r.node_id == lost_node)
        )
        print(f"node loss: its replica stale {time.monotonic() - removed_at:.2f}s after the node went away")
        now = time.time()
        lost = next(r for r in snapshot.for_model(MODEL) if r.node_id == lost_node)
        kept = next(r for r in snapshot.for_model(MODEL) if r.node_id != lost_node)
        marks = cfg.watermarks_for(MODEL)
        assert replica_saturation(lost, marks, snapshot=snapshot, now=now).value == float("inf")
        assert replica_saturation(kept, marks, snapshot=snapshot, now=now).value < 1
        assert dispatcher.admission.limit(MODEL, snapshot, now) == 4  # only the replica left counts
        resilience.watch_local(MODEL, snapshot, now)
        assert resilience.health.get(f"local:{MODEL}").state is Health.GREEN  # one replica still reports

    asyncio.run(scenario())


def test_two_gateway_replicas_share_an_open_breaker_through_the_exchange_actor(cluster: Cluster) -> None:
    """What two gateway replicas run (serve_apps/resilience/breaker_exchange.py), over the real named actor."""
    from router.resilience.breaker import Breakers, BreakerSettings
    from serve_apps.resilience.breaker_exchange import BreakerSync, get_or_create_exchange, kill_exchange, ray_swap

    period_s = 0.5
    exchange = get_or_create_exchange()
    settings = BreakerSettings(min_requests=2, open_s=30)
    first, second = Breakers(settings, time.time), Breakers(settings, time.time)
    syncs = [
        BreakerSync(b, ray_swap(exchange), name, period_s=period_s) for b, name in ((first, "gw-1"), (second, "gw-2"))
    ]

    async def scenario() -> float:
        tasks = [asyncio.ensure_future(s.run()) for s in syncs]
        try:
            await asyncio.sleep(2 * period_s)
            first.record("cloud:sim/m", "sim", ok=False)
            first.record("cloud:sim/m", "sim", ok=False)
            opened = time.monotonic()
            while second.allows("cloud:sim/m", "sim")[0]:
                assert time.monotonic() - opened < 10, "the other gateway replica never saw the open breaker"
                await asyncio.sleep(0.05)
            return time.monotonic() - opened
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    try:
        seen_after = asyncio.run(scenario())
    finally:
        kill_exchange()
    print(f"\nbreaker opened on gw-1 honoured by gw-2 after {seen_after:.2f}s (bound {2 * period_s:g}s)")
    assert seen_after <= 2 * period_s + 0.5  # the bound, plus scheduling slack on a loaded 2-core machine
