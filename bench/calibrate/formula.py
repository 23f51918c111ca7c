"""The capacity formula's prediction for the model under test, on the same path as `spillover capacity`.

`predict` finds the model's `ModelSpec` in the config and calls `cluster.capacity.plan.plan_model`
(which resolves the shape with `resolve_shape` and runs `cluster.capacity.memory.plan_capacity`), with
the workload's mean prompt / output lengths and its formula prefix share. For CPU models the
KV budget is `kv_cache_space_gib`; GPU models need the GPU memory (`--gpu-mem`, else the smallest
GPU NVML reports here; without either there is no prediction, as in `spillover capacity`).

The formula is per replica; the load test measures the whole deployment behind a URL, so the
comparison uses the per-replica numbers × `replicas`, and the overlay divides the knee back.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bench.load.workload import WorkloadSpec
from cluster.capacity.memory import CapacityReport, admission_limit, parse_bytes
from cluster.capacity.plan import DEFAULT_GPU_OVERHEAD, PlanWorkload, plan_model
from cluster.config.deployment import SpilloverConfig
from cluster.hardware.nvml import GpuReader, PynvmlReader

GpuReaderFactory = Callable[[], GpuReader]


@dataclass(frozen=True)
class FormulaPrediction:
    alias: str
    status: str  # "ok", "not_in_config", "unknown_shape", "no_gpu", "invalid"
    notes: tuple[str, ...]
    report: CapacityReport | None = None
    replicas: int = 1
    admission_limit: int | None = None  # per replica, with the config's admission.fraction
    configured_limit: int | None = None  # models[].admission_limit as the config sets it now

    @property
    def ok(self) -> bool:
        return self.report is not None

    @property
    def admission_limit_total(self) -> int | None:
        return None if self.admission_limit is None else self.admission_limit * self.replicas

    @property
    def kv_limit_total(self) -> int | None:
        return None if self.report is None else self.report.predicted_max_concurrency * self.replicas

    def to_dict(self) -> dict[str, Any]:
        return {
            "alias": self.alias,
            "status": self.status,
            "notes": list(self.notes),
            "replicas": self.replicas,
            "admission_limit_per_replica": self.admission_limit,
            "admission_limit_total": self.admission_limit_total,
            "kv_limit_total": self.kv_limit_total,
            "configured_admission_limit": self.configured_limit,
            "report": self.report.to_dict() if self.report else None,
            "steps": [list(step) for step in self.report.steps()] if self.report else [],
        }


def predict(
    config: SpilloverConfig,
    alias: str,
    workload: WorkloadSpec,
    *,
    gpu_mem: int | None = None,
    overhead: int | str = DEFAULT_GPU_OVERHEAD,
    gpu_reader: GpuReaderFactory = PynvmlReader,
) -> FormulaPrediction:
    spec = config.model(alias)
    if spec is None:
        known = ", ".join(m.alias for m in config.models)
        return FormulaPrediction(alias, "not_in_config", (f"{alias!r} is not a model of the config ({known})",))
    notes: list[str] = []
    if spec.accelerator == "gpu" and gpu_mem is None:
        gpu_mem, note = _gpu_memory(gpu_reader)
        notes.append(note)
    planned = PlanWorkload(
        prompt_tokens=max(1, round(workload.mean_prompt_words())),
        output_tokens=max(1, round(workload.output.mean)),
        prefix_share=workload.formula_prefix_share(),
        overhead_bytes=parse_bytes(overhead),
    )
    status, plan_notes, report = plan_model(spec, planned, gpu_mem)
    notes += plan_notes
    limit = None
    if report is not None:
        limit = report.admission_limit
        fraction = config.admission.fraction
        if not math.isclose(fraction, report.admission_fraction):
            limit = admission_limit(report.predicted_max_concurrency, fraction)
            notes.append(f"admission limit with the config's admission.fraction {fraction:g}: {limit}")
    return FormulaPrediction(alias, status, tuple(notes), report, spec.replicas, limit, spec.admission_limit)


def _gpu_memory(make_reader: GpuReaderFactory) -> tuple[int | None, str]:
    reader = make_reader()
    try:
        inventory = reader.read()
    finally:
        close = getattr(reader, "close", None)
        if callable(close):
            close()
    smallest = inventory.smallest()
    if smallest is None:
        return None, f"no GPU memory known ({inventory.reason}): pass --gpu-mem for a prediction"
    return smallest.memory_total, f"GPU memory from NVML: GPU {smallest.index} {smallest.name}"
