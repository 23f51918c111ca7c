"""The calibrated admission plans a gateway reads, computed off the request path.

A calibrated model's compute bound simulates its engine (cluster/capacity/bound.py `plan_admission`:
milliseconds for a CPU replica, ~0.1 s for a large GPU one). The gateway's event loop serves every request
of its replica, so it never runs that simulation: `plan()` answers from the plans already made, and a
plan it lacks is queued on `submit` (a thread of its own in the gateway) and used once it is done.

Until then the request is admitted on the model's last plan (the previous mix's, which moves slowly), or,
before any, on `perf.min_admission_limit`: too few requests for a moment, never too many. The gateway asks
for each calibrated model's plan whenever a fresh snapshot arrives (`warm`), so the first request after a
start finds its plan made.

The engine simulated is the replica's own: vLLM's scheduler limits for a GPU of the size the replica
reports (its first GPU's total memory), as `spillover capacity` simulates for the GPU NVML shows it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from cluster.capacity.bound import AdmissionPlan, plan_admission
from cluster.capacity.compute_model import Workload
from cluster.capacity.engine_sim import default_limits
from cluster.config.model_spec import ModelSpec
from router.routing.snapshot import ReplicaStats

log = logging.getLogger("spillover.admission")

Submit = Callable[[Callable[[], AdmissionPlan]], "Future[AdmissionPlan]"]
MAX_PLANS = 512


@dataclass(frozen=True)
class PlanKey:
    alias: str
    memory_limit: int
    prompt_tokens: float
    output_tokens: float
    prefix_share: float
    gpu_memory_gib: float | None  # the replica's first GPU (None: a CPU replica, or no GPU reported)
    fit: int  # which of the model's fits (models[].perf) describes the replica's machine


@dataclass(frozen=True)
class Planned:
    """The plan to admit by and the inputs it was made for (`key`); `pending`: it is an earlier one (or none:
    `plan` None) while the one asked for is made."""

    plan: AdmissionPlan | None
    key: PlanKey | None
    pending: bool


def replica_gpu_gib(spec: ModelSpec, replica: ReplicaStats) -> float | None:
    """The memory of the GPU a replica reports, in GiB (None for a CPU model or a replica with no GPU)."""
    if spec.accelerator == "cpu" or not replica.gpus:
        return None
    return replica.gpus[0].total_bytes / 2**30


def inline(job: Callable[[], AdmissionPlan]) -> Future[AdmissionPlan]:
    """Run the job now: a plan is ready when asked (tools and tests that want the final plan at once)."""
    future: Future[AdmissionPlan] = Future()
    try:
        future.set_result(job())
    except Exception as exc:  # noqa: BLE001 - like an executor: the failure is the future's
        future.set_exception(exc)
    return future


def thread_submit() -> Submit:
    """One worker thread: plans are made one at a time, never on the event loop."""
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="admission-plans").submit


class AdmissionPlans:
    def __init__(self, submit: Submit = inline) -> None:
        self._submit = submit
        self._lock = threading.Lock()  # the worker's callback and the loop both touch the plans
        self._made: dict[PlanKey, AdmissionPlan] = {}
        self._pending: set[PlanKey] = set()
        self._last: dict[str, Planned] = {}  # per model, the plan made last

    def plan(self, spec: ModelSpec, key: PlanKey) -> Planned:
        """The plan for `key`, or the last one of the model while it is being made."""
        with self._lock:
            made = self._made.get(key)
            if made is not None:
                return Planned(made, key, pending=False)
            queue = key not in self._pending
            if queue:
                self._pending.add(key)
        if queue:
            self._queue(spec, key)
        with self._lock:  # an inline submit has made it already
            made = self._made.get(key)
            if made is not None:
                return Planned(made, key, pending=False)
            last = self._last.get(key.alias)
            return Planned(last.plan, last.key, pending=True) if last is not None else Planned(None, None, True)

    def _queue(self, spec: ModelSpec, key: PlanKey) -> None:
        perf = spec.perf[key.fit]
        workload = Workload(key.prompt_tokens, key.output_tokens, key.prefix_share)
        limits = default_limits(spec.accelerator, spec.engine_args, key.gpu_memory_gib)

        def job() -> AdmissionPlan:
            return plan_admission(perf, key.memory_limit, workload, limits=limits)

        try:
            future = self._submit(job)
        except RuntimeError:  # an executor shut down: the key is asked for again next time
            log.exception("admission plan for %s not queued", key.alias)
            with self._lock:
                self._pending.discard(key)
            return
        future.add_done_callback(lambda done: self._done(key, done))

    def _done(self, key: PlanKey, future: Future[AdmissionPlan]) -> None:
        with self._lock:
            self._pending.discard(key)
            if future.cancelled() or future.exception() is not None:
                log.error("admission plan for %s failed: %r", key.alias, future.exception())
                return
            if len(self._made) >= MAX_PLANS:
                self._made.clear()
            plan = future.result()
            self._made[key] = plan
            self._last[key.alias] = Planned(plan, key, pending=False)
