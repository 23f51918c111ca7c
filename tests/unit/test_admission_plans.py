"""Calibrated admission plans are made off the request path (serve_apps/dispatch/admission_plans.py): a
request never waits for the engine simulation; until a plan is made the model's previous one (or the
perf floor) admits; and the engine simulated is the one of the GPU the replica reports, as
`spillover capacity` simulates for the GPU it reads."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace

from cluster.capacity.bound import AdmissionPlan, plan_admission
from cluster.capacity.compute_model import Workload
from cluster.capacity.engine_sim import default_limits
from cluster.capacity.memory import admission_limit, max_concurrent_sequences
from router.routing.snapshot import ClusterSnapshot, GpuMemory
from serve_apps.dispatch.admission import Admission
from serve_apps.dispatch.admission_plans import AdmissionPlans, PlanKey, Planned
from serve_apps.dispatch.interfaces import NoObserver
from tests.unit.test_admission_live import PERF, T0, config, snapshot


class Held:
    """An executor whose jobs run only when the test says: the worker thread has not got to them yet."""

    def __init__(self) -> None:
        self.jobs: list[tuple[Callable[[], AdmissionPlan], Future[AdmissionPlan]]] = []

    def submit(self, job: Callable[[], AdmissionPlan]) -> Future[AdmissionPlan]:
        future: Future[AdmissionPlan] = Future()
        self.jobs.append((job, future))
        return future

    def run_all(self) -> None:
        jobs, self.jobs = self.jobs, []
        for job, future in jobs:
            future.set_result(job())


def test_a_missing_plan_never_runs_on_the_request_path_and_the_floor_admits_meanwhile() -> None:
    held = Held()
    adm = Admission(config(perf={**PERF, "min_admission_limit": 2}), NoObserver(), clock=lambda: T0,
                    plans=AdmissionPlans(held.submit))  # fmt: skip
    for _ in range(3):
        adm.observe("m", 300, 64)
    first = adm.limit_with_reason("m", snapshot(), T0)
    assert len(held.jobs) == 1  # queued, not run
    assert (first.value, first.detail) == (2, "compute plan pending: perf.min_admission_limit x 1 replica(s)")
    assert adm.limit("m", snapshot(), T0) == 2 and len(held.jobs) == 1  # asked again: queued once
    held.run_all()
    assert adm.limit("m", snapshot(), T0) == 3  # the compute bound of test_admission_live's mix
    for _ in range(64):  # the mix moves on to short requests: a new plan is queued, the previous one admits
        adm.observe("m", 50, 16)
    moved = adm.limit_with_reason("m", snapshot(), T0)
    assert moved.value == 3 and moved.detail.endswith(
        "at prompt 300, output 64, prefix 0.00 from an earlier mix (prompt 50, output 16, prefix 0.00 from the last "
        "64 requests: its plan is being computed)"
    )
    held.run_all()
    assert adm.limit("m", snapshot(), T0) == 33


def test_a_fresh_snapshot_warms_the_plan_before_any_request() -> None:
    held = Held()
    adm = Admission(config(perf=PERF), NoObserver(), clock=lambda: T0, plans=AdmissionPlans(held.submit))
    adm.warm(snapshot(), T0)
    assert len(held.jobs) == 1
    held.run_all()
    limit = adm.limit_with_reason("m", snapshot(), T0)
    assert "pending" not in limit.detail and not held.jobs
    uncalibrated = Admission(config(), NoObserver(), clock=lambda: T0, plans=AdmissionPlans(held.submit))
    uncalibrated.warm(snapshot(), T0)
    assert not held.jobs  # nothing to simulate


def test_plans_made_on_a_worker_thread_reach_the_loop() -> None:
    """The real executor: the job runs on its thread, its callback stores the plan from there."""
    gate = threading.Event()
    pool = ThreadPoolExecutor(max_workers=1)
    futures: list[Future[AdmissionPlan]] = []

    def submit(job: Callable[[], AdmissionPlan]) -> Future[AdmissionPlan]:
        futures.append(pool.submit(lambda: (gate.wait(10), job())[1]))
        return futures[-1]

    try:
        adm = Admission(config(perf=PERF), NoObserver(), clock=lambda: T0, plans=AdmissionPlans(submit))
        adm.observe("m", 300, 64)
        assert "pending" in adm.limit_with_reason("m", snapshot(), T0).detail  # the worker is held at the gate
        gate.set()
        futures[0].result(timeout=10)
        assert adm.limit("m", snapshot(), T0) == 3
    finally:
        gate.set()
        pool.shutdown(wait=True)


def _gpu_snapshot(total_gib: int) -> ClusterSnapshot:
    gpu = GpuMemory(0, "GPU-0", used_bytes=0, total_bytes=total_gib * 2**30)
    base = snapshot()
    return replace(base, replicas=tuple(replace(r, gpus=(gpu,)) for r in base.replicas))


def test_the_engine_simulated_is_the_one_of_the_gpu_the_replica_reports() -> None:
    held = Held()
    plans = AdmissionPlans(held.submit)
    cfg = config(accelerator="gpu", perf=PERF)
    spec = cfg.models[0]
    adm = Admission(cfg, NoObserver(), clock=lambda: T0, plans=plans)
    adm.observe("m", 300, 64)
    for size in (24, 141):
        adm.limit("m", _gpu_snapshot(size), T0)
    assert len(held.jobs) == 2  # one plan per GPU size: each its own engine
    held.run_all()
    memory = admission_limit(max_concurrent_sequences(364 * 128, 300, 64), cfg.admission.fraction)
    for gib in (24.0, 141.0):
        # the same plan `spillover capacity` makes for that GPU (spillover/capacity.py passes NVML's total)
        limits = default_limits("gpu", spec.engine_args, gib)
        expected = plan_admission(spec.perf[0], memory, Workload(300, 64, 0.0), limits=limits)
        assert plans.plan(spec, PlanKey("m", memory, 300, 64, 0.0, gib, 0)) == Planned(
            expected, PlanKey("m", memory, 300, 64, 0.0, gib, 0), pending=False
        )
    assert default_limits("gpu", spec.engine_args, 141.0) != default_limits("gpu", spec.engine_args, 24.0)
