"""The fit of the compute model (cluster/capacity/compute_fit.py, cluster/capacity/compute_refine.py) on synthetic
measurements made by the engine simulation with known parameters: recovered within tolerance, and
the knee it predicts for a workload it was not fitted on."""

from __future__ import annotations

import random

import pytest

from cluster.capacity.compute_fit import FitError, FitPoint, fit
from cluster.capacity.compute_knee import compute_knee
from cluster.capacity.compute_model import PerfParams, Workload
from cluster.capacity.compute_refine import nelder_mead
from cluster.capacity.engine_sim import EngineLimits, p95, simulate

TRUE = PerfParams(0.05, 0.048, 0.002, 0.0004)
SHAPES = ((600, 8), (50, 32), (310, 64))
LEVELS = (1, 4, 8, 16)


def points(params: PerfParams, noise: float, seed: int = 1, limits: EngineLimits | None = None) -> list[FitPoint]:
    """Each level measured as the bench does (a closed loop of 2 × N requests), jittered by `noise`."""
    rng = random.Random(seed)
    found = []
    for prompt, output in SHAPES:
        for n in LEVELS:
            run = simulate(params, Workload(prompt, output), limits or EngineLimits(), n, 2 * n)
            e2e = [v * (1 + rng.gauss(0, noise)) for v in run.e2e_s]
            ttft = [v * (1 + rng.gauss(0, noise)) for v in run.ttft_s]
            mean_e2e, mean_ttft = sum(e2e) / len(e2e), sum(ttft) / len(ttft)
            tpot = (mean_e2e - mean_ttft) / (output - 1)
            found.append(
                FitPoint(
                    n, prompt, output, mean_ttft, tpot, mean_e2e, 0.0, p95(ttft), p95(e2e), f"{prompt}x{output}", 2 * n
                )
            )
    return found


def test_fit_recovers_known_parameters_without_noise() -> None:
    result = fit(points(TRUE, noise=0.0))
    got = result.params
    for name in ("step_s", "per_sequence_s", "per_prefill_token_s"):
        assert getattr(got, name) == pytest.approx(getattr(TRUE, name), rel=0.03), name
    assert got.request_overhead_s == pytest.approx(TRUE.request_overhead_s, abs=0.01)
    assert result.rms_relative_error < 0.01
    assert got.tail_e2e == pytest.approx(1.0, abs=0.02)


def test_fit_with_noise_predicts_a_held_out_knee() -> None:
    got = fit(points(TRUE, noise=0.03)).params
    assert got.per_prefill_token_s == pytest.approx(TRUE.per_prefill_token_s, rel=0.1)
    for workload in (Workload(150, 48), Workload(450, 24)):
        expected = compute_knee(TRUE, workload, slo_e2e_p95_s=10).concurrency
        knee = compute_knee(got, workload, slo_e2e_p95_s=10).concurrency
        assert expected is not None and knee is not None and abs(knee - expected) <= max(1, 0.1 * expected)


def test_the_fit_uses_the_engines_token_budget() -> None:
    # measured on an engine with a 512-token budget: fitted with it, the parameters come back
    small = EngineLimits(512, 128)
    got = fit(points(TRUE, noise=0.0, limits=small), small).params
    assert got.per_prefill_token_s == pytest.approx(TRUE.per_prefill_token_s, rel=0.05)


def test_fit_keeps_parameters_non_negative() -> None:
    no_overhead = PerfParams(0.0, 0.05, 0.01, 0.001)
    got = fit(points(no_overhead, noise=0.03, seed=7)).params
    assert min(got.request_overhead_s, got.step_s, got.per_sequence_s, got.per_prefill_token_s) >= 0


def test_fit_needs_two_concurrency_levels_and_latency_that_grows() -> None:
    one_level = [p for p in points(TRUE, 0.0) if p.concurrency == 1]
    with pytest.raises(FitError, match="two or more concurrencies"):
        fit(one_level)
    flat = [FitPoint(n, 100, 8, 0.2, 0.05, 0.55) for n in (1, 2, 4)]
    with pytest.raises(FitError, match="do not grow with concurrency"):
        fit(flat)


def test_nelder_mead_finds_a_quadratic_minimum() -> None:
    best, value = nelder_mead(lambda x: (x[0] - 3) ** 2 + (x[1] + 1) ** 2, [0.0, 0.0], step=1.0, iterations=200)
    assert best == pytest.approx([3, -1], abs=1e-3) and value < 1e-6
