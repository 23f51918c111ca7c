"""`bench calibrate --fit-shapes`: fit the compute model (cluster/capacity/compute_model.py) and check it on
held-out workloads.

    1. design: each fit shape (`PROMPTxOUTPUT`: fixed prompt words × fixed max_tokens, e.g. 600x8) is
       swept closed-loop over `--fit-concurrency` (every level runs; nothing stops at the SLO)
    2. points: every level of those sweeps and of the main sweep becomes a `FitPoint` (measured mean
       prompt tokens, cached share, output tokens; mean TTFT, TPOT, E2E and the p95s)
    3. fit: cluster/capacity/compute_fit.py (linear least squares, then the parameters whose engine simulations
       of each level's own closed loop match the measured means; tails), with the engine's scheduler
       limits (cluster/capacity/engine_sim.py) of the model in the config
    4. held out (`--holdout-shapes`, never in the fit): bench/calibrate/holdout.py predicts each shape's knee for
       the run's SLO and measures it; the report tables predicted vs measured with the error
       (predicted − measured) / measured, and the knee the model gives for the tokens measured

Everything here is measured on one URL (the gateway): the fitted request overhead includes it.
"""

from __future__ import annotations

import math
import random
import re
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from bench.calibrate.sweep import LevelResult, StageResult, SweepPlan, run_stage
from bench.load.loadgen import LoadGenerator
from bench.load.workload import LengthDist, RequestFactory, WorkloadError, WorkloadSpec
from cluster.capacity.compute_fit import FitPoint, FitResult, fit
from cluster.capacity.compute_knee import compute_knee
from cluster.capacity.compute_model import Workload
from cluster.capacity.engine_sim import EngineLimits, Protocol

_SHAPE = re.compile(r"^\s*(\d+)\s*x\s*(\d+)\s*$")


def parse_shapes(text: str) -> tuple[str, ...]:
    """ "600x8,50x32" → ("600x8", "50x32"); each PROMPTxOUTPUT with both >= 1."""
    shapes = tuple(part.strip() for part in text.split(",") if part.strip())
    if not shapes:
        raise WorkloadError(f"no shapes in {text!r}: write PROMPTxOUTPUT[,...], e.g. 600x8,50x32")
    for shape in shapes:
        match = _SHAPE.match(shape)
        if match is None or int(match.group(1)) < 1 or int(match.group(2)) < 1:
            raise WorkloadError(f"not a shape: {shape!r}; write PROMPTxOUTPUT (words x max_tokens), e.g. 600x8")
    if len(set(shapes)) != len(shapes):
        raise WorkloadError(f"shapes repeat: {text!r}")
    return shapes


def shape_workload(shape: str) -> WorkloadSpec:
    prompt, output = shape.lower().split("x")
    return WorkloadSpec(LengthDist.parse(f"fixed:{int(prompt)}"), LengthDist.parse(f"fixed:{int(output)}"))


def fit_point(level: LevelResult, label: str) -> FitPoint | None:
    """A level's measured means (successful, measured requests only); None without one."""
    good = [r for r in level.results if r.ok and not r.warmup and r.ttft_s is not None]
    if not good:
        return None
    prompts = [r.prompt_tokens for r in good if r.prompt_tokens is not None]
    cached = [r.cached_tokens or 0 for r in good if r.prompt_tokens]
    tpots = [t for t in (r.tpot_s for r in good) if t is not None]
    s = level.summary
    return FitPoint(
        concurrency=level.concurrency,
        prompt_tokens=statistics.fmean(prompts) if prompts else 0.0,
        output_tokens=max(1.0, statistics.fmean(r.output_tokens for r in good)),
        ttft_s=statistics.fmean(r.ttft_s or 0.0 for r in good),
        tpot_s=statistics.fmean(tpots) if tpots else None,
        e2e_s=statistics.fmean(r.e2e_s for r in good),
        cached_share=min(0.99, sum(cached) / sum(prompts)) if prompts and sum(prompts) else 0.0,
        ttft_p95_s=s.ttft_p95_s,
        e2e_p95_s=s.e2e_p95_s,
        label=label,
        requests=len(good),
    )


def stage_points(stage: StageResult) -> list[FitPoint]:
    return [p for p in (fit_point(level, stage.name) for level in stage.levels) if p is not None]


def template_tokens(stages: Sequence[tuple[StageResult, WorkloadSpec]]) -> float:
    """Mean measured prompt tokens − requested prompt words over the runs (the chat template's share)."""
    gaps = [p.prompt_tokens - w.mean_prompt_words() for stage, w in stages for p in stage_points(stage)]
    return statistics.fmean(gaps) if gaps else 0.0


@dataclass(frozen=True)
class Holdout:
    shape: str
    predicted: int | None  # from the shape's estimated tokens, before measuring
    measured: int | None
    predicted_for_measured_tokens: int | None
    prompt_tokens: float | None  # measured means
    output_tokens: float | None
    stage: StageResult

    @property
    def error(self) -> float | None:
        """(predicted − measured) / measured."""
        if self.predicted is None or not self.measured:
            return None
        return (self.predicted - self.measured) / self.measured

    def to_dict(self) -> dict[str, Any]:
        return {
            "shape": self.shape,
            "predicted_knee": self.predicted,
            "measured_knee": self.measured,
            "error": self.error,
            "predicted_for_measured_tokens": self.predicted_for_measured_tokens,
            "prompt_tokens": self.prompt_tokens,
            "output_tokens": self.output_tokens,
            "stage": self.stage.to_dict(),
        }


@dataclass(frozen=True)
class ComputeOutcome:
    fit: FitResult
    fit_stages: tuple[StageResult, ...]
    template_tokens: float
    slo_metric: str
    slo_p95_s: float
    highest_level: int = 32  # the highest concurrency the fit measured; held-out sweeps stop at twice it
    holdouts: tuple[Holdout, ...] = ()
    limits: EngineLimits = field(default_factory=EngineLimits)

    def knee_for(
        self, prompt_tokens: float, output_tokens: float, prefix_share: float = 0.0, protocol: Protocol | None = None
    ) -> int | None:
        """The model's knee for a workload, measured by `protocol` (None: cluster/capacity/engine_sim.py's default)."""
        workload = Workload(max(0.0, prompt_tokens), max(1.0, output_tokens), min(prefix_share, 0.99))
        e2e = self.slo_p95_s if self.slo_metric == "e2e" else None
        ttft = self.slo_p95_s if self.slo_metric == "ttft" else None
        knee = compute_knee(
            self.fit.params, workload, slo_e2e_p95_s=e2e, slo_ttft_p95_s=ttft, limits=self.limits, protocol=protocol
        )
        return knee.concurrency

    def to_dict(self) -> dict[str, Any]:
        return {
            "fit": self.fit.to_dict(),
            "template_tokens": self.template_tokens,
            "slo": {"metric": self.slo_metric, "p95_s": self.slo_p95_s},
            "engine_limits": {**self.limits.to_dict(), "source": self.limits.source},
            "fit_stages": [s.to_dict() for s in self.fit_stages],
            "holdouts": [h.to_dict() for h in self.holdouts],
        }


async def run_fit_design(
    generator: LoadGenerator, url: str, model: str, shapes: Sequence[str], plan: SweepPlan, seed: int
) -> list[tuple[StageResult, WorkloadSpec]]:
    """One closed-loop sweep per fit shape, every level run (the SLO stops nothing here)."""
    done = []
    for i, shape in enumerate(shapes):
        workload = shape_workload(shape)
        factory = RequestFactory(workload, random.Random(seed + 1 + i))
        done.append((await run_stage(f"fit {shape}", url, model, generator, factory, plan), workload))
    return done


def fit_outcome(
    stages: Sequence[tuple[StageResult, WorkloadSpec]],
    main: tuple[StageResult, WorkloadSpec],
    plan: SweepPlan,
    limits: EngineLimits | None = None,
) -> ComputeOutcome:
    """Fit the points of the fit sweeps and of the main sweep (cluster/capacity/compute_fit.py)."""
    every = [*stages, main]
    limits = limits or EngineLimits()
    result = fit([p for stage, _ in every for p in stage_points(stage)], limits)
    return ComputeOutcome(
        fit=result,
        fit_stages=tuple(stage for stage, _ in stages),
        template_tokens=template_tokens(every),
        slo_metric=plan.slo_metric,
        slo_p95_s=plan.slo_p95_s,
        highest_level=max(r.point.concurrency for r in result.residuals),
        limits=limits,
    )


def relative(value: float | None) -> str:
    return "–" if value is None or math.isnan(value) else f"{value:+.0%}"


def _sig(value: float) -> float:
    return float(f"{value:.4g}")


def perf_overlay(outcome: ComputeOutcome, main: StageResult, fitted: str) -> dict[str, Any]:
    """The `models[].perf` section: fitted parameters, the run's SLO and the knees measured here."""
    params = {k: _sig(v) for k, v in outcome.fit.params.to_dict().items()}
    slo_key = "slo_e2e_p95_s" if outcome.slo_metric == "e2e" else "slo_ttft_p95_s"
    knees = []
    for stage in (main, *(h.stage for h in outcome.holdouts)):
        points = stage_points(stage)
        if not points:
            continue
        prompt = statistics.fmean(p.prompt_tokens for p in points)
        output = statistics.fmean(p.output_tokens for p in points)
        share = min(0.99, statistics.fmean(p.cached_share for p in points))
        knees.append(
            {
                "prompt_tokens": round(prompt, 1),
                "output_tokens": round(output, 1),
                "prefix_share": round(share, 3),
                "slo_metric": outcome.slo_metric,
                "slo_p95_s": outcome.slo_p95_s,
                "knee": stage.knee.concurrency,
                "predicted": outcome.knee_for(prompt, output, share, stage.plan.protocol),
            }
        )
    return {**params, slo_key: outcome.slo_p95_s, "fitted": fitted, "knees": knees}
