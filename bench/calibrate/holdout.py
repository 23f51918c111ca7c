"""Held-out validation of the compute model, and knees measured to the nearest level.

For each held-out shape (never in the fit):

    1. predict: the fitted model's knee for the run's SLO (cluster/capacity/compute_knee.py), with prompt
       tokens estimated as words + the chat template's tokens measured in the fit runs, for the very
       closed loop that will measure it (`max(requests_per_level, waves × N)` requests at N)
    2. measure: a sweep over levels from half to 1.75 times the prediction and ±1..3 around it
       (stopping after the first level that breaks the SLO)
    3. resolve: while the measured knee is latency-bound and the next level measured is more than one
       above it, run the level halfway between (at most `MAX_BISECT` more), so the measured knee is
       not an artefact of the levels chosen around the prediction

`resolve_knee` serves the main sweep of a fitted calibration too.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Sequence
from dataclasses import replace

from bench.calibrate.fit import ComputeOutcome, Holdout, shape_workload, stage_points
from bench.calibrate.knee import find_knee
from bench.calibrate.sweep import StageResult, SweepPlan, run_stage
from bench.load.loadgen import LoadGenerator
from bench.load.workload import RequestFactory
from cluster.capacity.engine_sim import Protocol

HOLDOUT_FACTORS = (0.5, 0.75, 0.9, 1.0, 1.1, 1.25, 1.5, 1.75)
MAX_BISECT = 4


def holdout_levels(predicted: int | None, highest: int = 64) -> tuple[int, ...]:
    """Levels around a predicted knee (0.5× to 1.75×, and ±1..3 near it); 1..8 without a prediction.
    The sweep stops after the first level that breaks the SLO, so the upper levels cost little."""
    if not predicted:
        return (1, 2, 4, 8)
    levels = {min(highest, max(1, round(predicted * f))) for f in HOLDOUT_FACTORS}
    levels |= {min(highest, max(1, predicted + step)) for step in (-1, 1, 2, 3)}
    return tuple(sorted(levels))


async def resolve_knee(
    stage: StageResult, generator: LoadGenerator, factory: RequestFactory, max_extra: int = MAX_BISECT
) -> StageResult:
    """Bisect between a latency-bound knee and the next level measured above it (see the module docstring)."""
    levels = list(stage.levels)
    plan = stage.plan
    added: list[int] = []
    knee = stage.knee
    for _ in range(max_extra):
        low = knee.concurrency
        above = [lv.concurrency for lv in levels if low is not None and lv.concurrency > low]
        if knee.bound != "latency" or low is None or not above or min(above) - low <= 1:
            break
        middle = (low + min(above)) // 2
        one = await run_stage(
            stage.name, stage.url, stage.model, generator, factory, replace(plan, concurrency=(middle,))
        )
        levels = sorted([*levels, *one.levels], key=lambda lv: lv.concurrency)
        added.append(middle)
        knee = find_knee(
            [lv.point(plan.slo_metric) for lv in levels], plan.slo_p95_s, max_error_rate=plan.max_error_rate
        )
    if not added:
        return stage
    note = f"levels {', '.join(map(str, added))} added between the knee and the level that broke the SLO"
    return replace(stage, levels=tuple(levels), knee=knee, notes=(*stage.notes, note))


async def run_holdouts(
    generator: LoadGenerator,
    url: str,
    model: str,
    shapes: Sequence[str],
    base: SweepPlan,
    outcome: ComputeOutcome,
    *,
    requests_per_level: int | None,
    waves: int | None = None,
    seed: int,
) -> tuple[Holdout, ...]:
    """Predict each held-out shape's knee, then measure it over levels around the prediction."""
    held = []
    # held out, by default the closed loop `spillover capacity` and the gateway predict for (Protocol's waves)
    protocol = Protocol(requests_per_level or 8, Protocol().waves if waves is None else waves)
    for i, shape in enumerate(shapes):
        workload = shape_workload(shape)
        predicted = outcome.knee_for(
            workload.mean_prompt_words() + outcome.template_tokens, workload.output.mean, protocol=protocol
        )
        plan = replace(
            base,
            concurrency=holdout_levels(predicted, highest=outcome.highest_level * 2),
            requests_per_level=protocol.requests_per_level,
            waves=protocol.waves,
            stop_after_breach=True,
        )
        factory = RequestFactory(workload, random.Random(seed + 101 + i))
        stage = await run_stage(f"holdout {shape}", url, model, generator, factory, plan)
        stage = await resolve_knee(stage, generator, factory)
        points = stage_points(stage)
        prompt = statistics.fmean(p.prompt_tokens for p in points) if points else None
        output = statistics.fmean(p.output_tokens for p in points) if points else None
        share = statistics.fmean(p.cached_share for p in points) if points else 0.0
        again = outcome.knee_for(prompt, output, share, protocol) if prompt is not None and output is not None else None
        held.append(Holdout(shape, predicted, stage.knee.concurrency, again, prompt, output, stage))
    return tuple(held)
