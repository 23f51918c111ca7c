"""bench/calibrate/holdout.py: levels around a prediction, and a measured knee resolved by bisection (the load
itself is replaced by a stage whose p95 is a known function of the concurrency)."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

import pytest

import bench.calibrate.holdout as holdout
from bench.calibrate.holdout import holdout_levels, resolve_knee
from bench.calibrate.knee import find_knee
from bench.calibrate.sweep import LevelResult, StageResult, SweepPlan
from bench.load.request_result import RequestResult
from bench.load.stats import summarize

SLO = 10.0


def level(n: int, knee: int) -> LevelResult:
    """A level whose requests take 5 s at or below `knee` and 12 s above it."""
    e2e = 5.0 if n <= knee else 12.0
    results = tuple(RequestResult(i, 0.0, e2e, 0.5, 8, 100, 0) for i in range(4))
    return LevelResult(n, summarize(results), results)


def stage(levels: tuple[int, ...], knee: int) -> StageResult:
    done = tuple(level(n, knee) for n in levels)
    plan = SweepPlan(levels, 4, warmup=0, slo_p95_s=SLO)
    return StageResult("holdout 1x1", "http://g/v1", "m", plan, done, find_knee([lv.point("e2e") for lv in done], SLO))


def test_holdout_levels_surround_the_prediction() -> None:
    assert holdout_levels(10) == (5, 8, 9, 10, 11, 12, 13, 15, 18)
    assert holdout_levels(1) == (1, 2, 3, 4)
    assert holdout_levels(None) == (1, 2, 4, 8)
    assert max(holdout_levels(1000, highest=16)) == 16


@pytest.mark.parametrize(("true_knee", "added"), [(9, [8, 10, 9]), (4, [8, 6, 5]), (11, [8, 10, 11])])
def test_the_measured_knee_is_bisected_to_the_level(
    monkeypatch: pytest.MonkeyPatch, true_knee: int, added: list[int]
) -> None:
    ran: list[int] = []

    async def run_stage(name: str, url: str, model: str, generator: Any, factory: Any, plan: SweepPlan) -> StageResult:
        (n,) = plan.concurrency
        ran.append(n)
        return stage((n,), true_knee)

    monkeypatch.setattr(holdout, "run_stage", run_stage)
    coarse = stage((4, 12), true_knee)  # 4 meets the SLO, 12 breaks it
    resolved = asyncio.run(resolve_knee(coarse, generator=None, factory=None))  # type: ignore[arg-type]
    assert ran == added
    assert resolved.knee.concurrency == true_knee
    assert [lv.concurrency for lv in resolved.levels] == sorted([4, 12, *added])
    assert "added between the knee" in resolved.notes[-1]


def test_nothing_to_bisect_leaves_the_stage_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    async def never(*args: Any) -> StageResult:
        raise AssertionError("no level should run")

    monkeypatch.setattr(holdout, "run_stage", never)
    adjacent = stage((4, 5), 4)
    assert asyncio.run(resolve_knee(adjacent, generator=None, factory=None)) is adjacent  # type: ignore[arg-type]
    sweep_end = stage((4, 8), 20)  # never broke: the knee is the sweep's end, not latency
    assert asyncio.run(resolve_knee(sweep_end, generator=None, factory=None)) is sweep_end  # type: ignore[arg-type]
    limited = replace(stage((4, 12), 9), levels=stage((4, 12), 9).levels)
    assert asyncio.run(resolve_knee(limited, None, None, max_extra=0)) is limited  # type: ignore[arg-type]
