"""`models[].perf`: a model's fitted compute models (cluster/capacity/compute_model.py) and the SLO each is held to.
The engine's scheduler limits the predictions also need come from the model's `engine_args`
(cluster/capacity/engine_sim.py `default_limits`), not from here.

A fit holds for the CPU class and the precision it was measured with (`cpu`, `precision`); a model may carry
one fit per class and precision, and its replicas are admitted by the first that describes all of them
(`fit_for`) — never by a fit from another machine.

`bench calibrate --fit-shapes ...` writes this section into its overlay; with it (and an SLO), the
gateway's admission limit follows the live workload through min(memory, compute), and
`spillover capacity` shows the compute bound beside the KV-memory bound.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from pydantic import Field, ValidationError, model_validator

from cluster.capacity.compute_model import PerfParams
from cluster.config.base import StrictModel
from cluster.hardware.cpu_caps import CpuClass


class MeasuredKnee(StrictModel):
    """A knee `bench calibrate` measured directly, kept beside the fit for reference."""

    prompt_tokens: float = Field(ge=0, description="mean prompt tokens of the measured workload")
    output_tokens: float = Field(ge=1, description="mean output tokens of the measured workload")
    prefix_share: float = Field(0.0, ge=0, lt=1, description="share of prompt tokens the prefix cache held")
    slo_metric: str = Field("e2e", pattern="^(e2e|ttft)$", description="the latency the SLO applied to: e2e or ttft")
    slo_p95_s: float = Field(gt=0, description="the p95 SLO of the measurement, seconds")
    knee: int | None = Field(ge=0, description="measured knee (largest concurrency within the SLO); null: none")
    predicted: int | None = Field(None, ge=0, description="the fitted model's knee for the same workload and SLO")


class PerfSection(StrictModel):
    """Fitted compute model of one replica on its machine, and the SLO the admission limit keeps."""

    request_overhead_s: float = Field(ge=0, description="c: seconds per request outside engine steps")
    step_s: float = Field(ge=0, description="a: fixed seconds of one engine step")
    per_sequence_s: float = Field(ge=0, description="b: seconds added per sequence in an engine step")
    per_prefill_token_s: float = Field(ge=0, description="g: seconds added per prompt token prefilled in a step")
    tail_e2e: float = Field(1.0, ge=1, description="measured / simulated p95 of end-to-end latency over the fit's runs")
    tail_ttft: float = Field(
        1.0, ge=1, description="measured / simulated p95 of time to first token over the fit's runs"
    )
    slo_e2e_p95_s: float | None = Field(
        None, gt=0, description="end-to-end p95 SLO (s) the compute bound keeps; null: none"
    )
    slo_ttft_p95_s: float | None = Field(
        None, gt=0, description="time-to-first-token p95 SLO (s) the compute bound keeps; null: none"
    )
    min_admission_limit: int = Field(1, ge=1, description="the gateway's live limit never goes below this")
    max_admission_limit: int | None = Field(
        None, ge=1, description="the gateway's live limit never goes above this; null: only the memory bound"
    )
    fitted: str = Field("", description="where the numbers come from (machine, date, report); for people")
    cpu: CpuClass | None = Field(
        None,
        description="the CPU class the fit was measured on (cluster/hardware/cpu_caps.py: amx-bf16, avx512-bf16, "
        "avx512, avx2, other); a replica on another class is not admitted by this fit (memory bound only, said in the "
        "reason); null: not checked",
    )
    precision: str | None = Field(
        None,
        description="the engine precision the fit was measured with, as replicas report it (e.g. 'float32 eager', "
        "'bfloat16 compiled'); a replica running another is not admitted by this fit; null: not checked",
    )
    knees: list[MeasuredKnee] = Field(default_factory=list, description="knees measured when this was fitted")

    @model_validator(mode="after")
    def _consistent(self) -> PerfSection:
        if self.per_sequence_s + self.per_prefill_token_s <= 0:
            raise ValueError("per_sequence_s or per_prefill_token_s must be > 0 (latency must grow with load)")
        if self.max_admission_limit is not None and self.max_admission_limit < self.min_admission_limit:
            raise ValueError("max_admission_limit must be >= min_admission_limit")
        return self

    @property
    def params(self) -> PerfParams:
        return PerfParams(
            self.request_overhead_s,
            self.step_s,
            self.per_sequence_s,
            self.per_prefill_token_s,
            self.tail_e2e,
            self.tail_ttft,
        )

    def mismatch(self, cpu_class: str | None, precision: str | None) -> str | None:
        """Why this fit does not describe a replica on `cpu_class` running `precision` (None: it does)."""
        if self.cpu is not None and cpu_class is not None and cpu_class != self.cpu:
            return f"perf was fitted on an {self.cpu} CPU, the replica runs on {cpu_class}"
        if self.precision is not None and precision is not None and precision != self.precision:
            return f"perf was fitted with {self.precision}, the replica runs {precision}"
        return None

    @property
    def has_slo(self) -> bool:
        return self.slo_e2e_p95_s is not None or self.slo_ttft_p95_s is not None


def fit_for(
    fits: Sequence[PerfSection], machines: Iterable[tuple[str | None, str | None]]
) -> tuple[PerfSection | None, str | None]:
    """The first of `fits` that describes every replica in `machines` (its CPU class and precision), and None;
    else None and why none does."""
    machines = list(machines)
    for fit in fits:
        if all(fit.mismatch(cpu, precision) is None for cpu, precision in machines):
            return fit, None
    if not fits:
        return None, "no models[].perf"
    if len(fits) == 1:
        return None, next(m for cpu, precision in machines if (m := fits[0].mismatch(cpu, precision)))
    runs = sorted({f"{cpu or '?'} with {precision or '?'}" for cpu, precision in machines})
    fitted = ", ".join(f"{f.cpu or 'any CPU'} with {f.precision or 'any precision'}" for f in fits)
    return None, f"no perf fit for replicas on {' and '.join(runs)} (fitted: {fitted})"


def one_or_many(value: Any, validate: Callable[[Any], Any]) -> Any:
    """`models[].perf` as written: one fit (a mapping: its errors named `perf.<field>`), a list of them
    (`perf[i].<field>`), or null (none), validated as a list by `validate`."""
    if not isinstance(value, dict):
        return validate([] if value is None else value)
    try:
        return validate([value])
    except ValidationError as exc:
        errors: list[Any] = [
            {"type": e["type"], "loc": e["loc"][1:], "input": e["input"], **({"ctx": e["ctx"]} if "ctx" in e else {})}
            for e in exc.errors()
        ]
        raise ValidationError.from_exception_data(exc.title, errors) from None


def distinct_machines(fits: Sequence[PerfSection]) -> None:
    """Two fits for the same CPU class and precision would leave which one admits to their order: refused."""
    seen: set[tuple[str | None, str | None]] = set()
    for fit in fits:
        key = (fit.cpu, fit.precision)
        if key in seen:
            raise ValueError(f"two perf fits for cpu {fit.cpu} with precision {fit.precision}: keep one")
        seen.add(key)
