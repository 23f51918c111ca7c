"""The admission limit of one replica: min(memory bound, compute bound), with the binding one named.

    memory bound    cluster/capacity/memory.py: ⌊fraction × KV max concurrent sequences⌋
    compute bound   cluster/capacity/compute_knee.py: the largest concurrency whose predicted p95 meets the SLO,
                    from the model's fitted `models[].perf` run through its engine's scheduler limits
                    (cluster/capacity/engine_sim.py); searched up to the memory bound (no perf: uncalibrated,
                    memory only)
    admission limit min(memory, compute); `bound` = "compute" | "memory" (ties name memory)

The SLO is the one given (`spillover capacity --slo-e2e-p95-s / --slo-ttft-p95-s`), else the one
in `perf`. Used by `spillover capacity`, bench calibrate's report and the gateway (per live mix).
Pure.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from cluster.capacity.compute_knee import compute_knee
from cluster.capacity.compute_model import Bound, ComputeKnee, Workload, bounded_limit
from cluster.capacity.engine_sim import EngineLimits
from cluster.config.perf import PerfSection

Status = Literal["calibrated", "uncalibrated", "no_slo"]


@dataclass(frozen=True)
class AdmissionPlan:
    admission_limit: int
    bound: Bound
    status: Status
    memory_limit: int
    compute: ComputeKnee | None
    notes: tuple[str, ...] = ()

    def steps(self) -> list[tuple[str, int | float, str]]:
        rows = list(self.compute.steps) if self.compute else []
        compute = self.compute.concurrency if self.compute else None
        rows.append(("admission limit", self.admission_limit, bounded_limit(self.memory_limit, compute).line))
        return rows

    def to_dict(self) -> dict[str, Any]:
        return {
            "admission_limit": self.admission_limit,
            "bound": self.bound,
            "status": self.status,
            "memory_limit": self.memory_limit,
            "compute_limit": self.compute.concurrency if self.compute else None,
            "compute_metric": self.compute.metric if self.compute else None,
            "notes": list(self.notes),
            "steps": [list(step) for step in self.steps()],
        }


def plan_admission(
    perf: PerfSection | None,
    memory_limit: int,
    workload: Workload,
    *,
    slo_e2e_p95_s: float | None = None,
    slo_ttft_p95_s: float | None = None,
    limits: EngineLimits | None = None,
    unfitted: str | None = None,
) -> AdmissionPlan:
    """min(memory, compute) for one replica; the SLO arguments override perf's own. `limits`: the
    engine's scheduler limits (cluster/capacity/engine_sim.py `default_limits`; None: vLLM's CPU defaults).
    `unfitted`: why a perf that exists does not apply here (another CPU or precision); pass perf None."""
    if perf is None:
        why = unfitted or "no models[].perf"
        note = f"uncalibrated: {why}, so only the memory bound is known (bench calibrate --fit-shapes)"
        return AdmissionPlan(memory_limit, "memory", "uncalibrated", memory_limit, None, (note,))
    given = slo_e2e_p95_s is not None or slo_ttft_p95_s is not None
    e2e = slo_e2e_p95_s if given else perf.slo_e2e_p95_s
    ttft = slo_ttft_p95_s if given else perf.slo_ttft_p95_s
    if e2e is None and ttft is None:
        note = "no SLO (give --slo-e2e-p95-s or --slo-ttft-p95-s, or set perf.slo_e2e_p95_s): memory bound only"
        return AdmissionPlan(memory_limit, "memory", "no_slo", memory_limit, None, (note,))
    knee = compute_knee(
        perf.params, workload, slo_e2e_p95_s=e2e, slo_ttft_p95_s=ttft, limits=limits, ceiling=memory_limit
    )
    limit = bounded_limit(memory_limit, knee.concurrency)
    notes = []
    if knee.concurrency == 0:
        notes.append("the SLO is not met even by one request at a time: compute bound 0")
    if perf.fitted:
        notes.append(f"perf fitted: {perf.fitted}")
    return AdmissionPlan(limit.admission_limit, limit.bound, "calibrated", memory_limit, knee, tuple(notes))


def calibration_line(alias: str, fits: Sequence[PerfSection], admission_limit: int | None) -> str:
    """What `spillover serve` says about one model's admission limit (`fits`: its models[].perf)."""
    held = [perf for perf in fits if perf.has_slo]
    limit = f"admission_limit {admission_limit}" if admission_limit is not None else "the KV-memory bound"
    if not held:
        why = "no models[].perf" if not fits else "models[].perf is fitted but has no SLO to keep"
        return (
            f"{alias}: uncalibrated ({why}): the admission limit is {limit}, whatever the workload; "
            "`spillover bench calibrate --fit-shapes ...` fits its compute model"
        )
    perf = held[0]
    slos = [f"e2e p95 <= {perf.slo_e2e_p95_s:g} s"] if perf.slo_e2e_p95_s is not None else []
    slos += [f"TTFT p95 <= {perf.slo_ttft_p95_s:g} s"] if perf.slo_ttft_p95_s is not None else []
    line = (
        f"{alias}: calibrated ({perf.fitted or 'models[].perf'}): the admission limit follows the live workload "
        f"as min(memory, compute) for {' and '.join(slos)}"
    )
    machines = [f"{p.cpu} with {p.precision or 'any precision'}" for p in held if p.cpu is not None]
    if machines and len(machines) == len(held):
        line += f" on replicas fitted for ({'; '.join(machines)}); elsewhere {limit}"
    return line
