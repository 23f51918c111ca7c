"""The compute model (cluster/compute_model.py), its fit (cluster/compute_fit.py) and
min(memory, compute) (cluster/capacity_bound.py): hand-checked numbers and synthetic data with
known parameters."""

from __future__ import annotations

import random

import pytest

from cluster.capacity_bound import calibration_line, plan_admission
from cluster.compute_fit import FitError, FitPoint, fit
from cluster.compute_model import PerfParams, Workload, bounded_limit, compute_knee, latency, step_time
from cluster.perf_config import PerfSection

TRUE = PerfParams(
    request_overhead_s=0.3, step_s=0.075, per_sequence_s=0.0085, per_prefill_token_s=0.0021, tail_e2e=1.05
)
SHAPES = ((300, 64), (50, 32), (600, 8))


def test_latency_by_hand() -> None:
    # P = 300, s = 0.5 → P_u = 150; O = 10; N = 2
    params = PerfParams(request_overhead_s=0.5, step_s=0.1, per_sequence_s=0.01, per_prefill_token_s=0.001)
    got = latency(params, Workload(300, 10, 0.5), 2)
    assert step_time(params, 2, 300) == pytest.approx(0.1 + 0.02 + 0.3)
    assert got.ttft_s == pytest.approx(0.5 + 0.1 + 0.02 + 0.001 * 2 * 150)  # 0.92
    assert got.tpot_s == pytest.approx(0.12)
    assert got.e2e_s == pytest.approx(0.92 + 9 * 0.12)  # = c + O·a + N·(O·b + P_u·g) = 0.5 + 1 + 2·0.25
    assert got.e2e_s == pytest.approx(0.5 + 10 * 0.1 + 2 * (10 * 0.01 + 150 * 0.001))
    assert got.throughput_rps == pytest.approx(2 / got.e2e_s)


@pytest.mark.parametrize("slo", [2.0, 6.5, 10.0, 30.0])
@pytest.mark.parametrize(("prompt", "output"), SHAPES)
def test_closed_form_knee_is_the_largest_n_meeting_the_slo(prompt: int, output: int, slo: float) -> None:
    workload = Workload(prompt, output)
    brute = max((n for n in range(1, 500) if latency(TRUE, workload, n).e2e_p95_s <= slo), default=0)
    assert compute_knee(TRUE, workload, slo_e2e_p95_s=slo).concurrency == brute
    brute_ttft = max((n for n in range(1, 500) if latency(TRUE, workload, n).ttft_p95_s <= slo), default=0)
    assert compute_knee(TRUE, workload, slo_ttft_p95_s=slo).concurrency == brute_ttft


def test_knee_steps_show_the_arithmetic_and_the_tighter_slo_binds() -> None:
    knee = compute_knee(TRUE, Workload(300, 64), slo_e2e_p95_s=10, slo_ttft_p95_s=1.5)
    # e2e: ⌊(10 / 1.05 − (0.3 + 64 × 0.075)) / (64 × 0.0085 + 300 × 0.0021)⌋ = ⌊4.4238 / 1.174⌋ = 3
    # ttft: ⌊(1.5 − 0.375) / (0.0085 + 0.63)⌋ = ⌊1.7619⌋ = 1
    assert (knee.concurrency, knee.metric) == (1, "ttft")
    rows = {label: (value, how) for label, value, how in knee.steps}
    assert rows["compute bound, e2e"][0] == 3
    assert rows["e2e per concurrent request (s)"] == (1.174, "O·b + P_u·g = 64 × 0.0085 + 300 × 0.0021")
    assert rows["compute bound, ttft"][0] == 1
    with pytest.raises(ValueError, match="needs an SLO"):
        compute_knee(TRUE, Workload(300, 64))


def test_an_slo_no_request_meets_gives_zero() -> None:
    assert compute_knee(TRUE, Workload(300, 64), slo_e2e_p95_s=1).concurrency == 0


def synthetic_points(params: PerfParams, noise: float, seed: int = 1) -> list[FitPoint]:
    rng = random.Random(seed)

    def jitter(value: float) -> float:
        return value * (1 + rng.gauss(0, noise))

    points = []
    for prompt, output in SHAPES:
        for n in (1, 2, 4):
            lat = latency(params, Workload(prompt, output), n)
            points.append(
                FitPoint(
                    n,
                    prompt,
                    output,
                    jitter(lat.ttft_s),
                    jitter(lat.tpot_s),
                    jitter(lat.e2e_s),
                    ttft_p95_s=lat.ttft_p95_s,
                    e2e_p95_s=lat.e2e_p95_s,
                )
            )
    return points


def test_fit_recovers_known_parameters_exactly_without_noise() -> None:
    result = fit(synthetic_points(TRUE, noise=0.0))
    got = result.params
    for name in ("request_overhead_s", "step_s", "per_sequence_s", "per_prefill_token_s", "tail_e2e"):
        assert getattr(got, name) == pytest.approx(getattr(TRUE, name), rel=1e-6), name
    assert result.rms_relative_error < 1e-9


def test_fit_recovers_known_parameters_within_tolerance_with_noise() -> None:
    got = fit(synthetic_points(TRUE, noise=0.02)).params
    assert got.step_s == pytest.approx(TRUE.step_s, rel=0.05)
    assert got.per_sequence_s == pytest.approx(TRUE.per_sequence_s, rel=0.15)
    assert got.per_prefill_token_s == pytest.approx(TRUE.per_prefill_token_s, rel=0.1)
    assert got.request_overhead_s == pytest.approx(TRUE.request_overhead_s, abs=0.1)
    # what matters downstream: the knee it predicts for a workload it was not fitted on
    workload = Workload(150, 48)
    expected = compute_knee(TRUE, workload, slo_e2e_p95_s=10).concurrency
    assert compute_knee(got, workload, slo_e2e_p95_s=10).concurrency == expected


def test_fit_keeps_parameters_non_negative() -> None:
    no_overhead = PerfParams(0.0, 0.05, 0.01, 0.001)
    got = fit(synthetic_points(no_overhead, noise=0.03, seed=7)).params
    assert min(got.request_overhead_s, got.step_s, got.per_sequence_s, got.per_prefill_token_s) >= 0


def test_fit_needs_two_concurrency_levels_and_latency_that_grows() -> None:
    one_level = [p for p in synthetic_points(TRUE, 0.0) if p.concurrency == 1]
    with pytest.raises(FitError, match="two or more concurrencies"):
        fit(one_level)
    flat = [FitPoint(n, 100, 8, 0.2, 0.05, 0.55) for n in (1, 2, 4)]
    with pytest.raises(FitError, match="do not grow with concurrency"):
        fit(flat)


def test_min_of_memory_and_compute_names_the_binding_bound() -> None:
    assert bounded_limit(173, 4).bound == "compute" and bounded_limit(173, 4).admission_limit == 4
    assert bounded_limit(3, 40).bound == "memory" and bounded_limit(3, 40).admission_limit == 3
    assert bounded_limit(5, 5).bound == "memory"  # ties name memory
    assert bounded_limit(7, None).bound == "memory"  # no per-N cost: unbounded compute side
    assert bounded_limit(173, 4).line == "min(memory 173, compute 4) = 4 (compute binds)"


def perf(**kw: object) -> PerfSection:
    base = {
        "request_overhead_s": 0.3,
        "step_s": 0.075,
        "per_sequence_s": 0.0085,
        "per_prefill_token_s": 0.0021,
        "tail_e2e": 1.05,
    }
    return PerfSection.model_validate({**base, **kw})


def test_plan_admission_calibrated_uncalibrated_and_without_slo() -> None:
    workload = Workload(300, 64)
    calibrated = plan_admission(perf(slo_e2e_p95_s=10), 173, workload)
    assert (calibrated.admission_limit, calibrated.bound, calibrated.status) == (3, "compute", "calibrated")
    assert calibrated.steps()[-1] == ("admission limit", 3, "min(memory 173, compute 3) = 3 (compute binds)")
    memory = plan_admission(perf(slo_e2e_p95_s=10), 2, workload)
    assert (memory.admission_limit, memory.bound) == (2, "memory")
    override = plan_admission(perf(slo_e2e_p95_s=10), 173, workload, slo_e2e_p95_s=20)
    assert override.admission_limit == 11  # ⌊(20 / 1.05 − 5.1) / 1.174⌋ = ⌊11.88⌋
    uncalibrated = plan_admission(None, 173, workload, slo_e2e_p95_s=10)
    assert (uncalibrated.admission_limit, uncalibrated.bound, uncalibrated.status) == (173, "memory", "uncalibrated")
    assert plan_admission(perf(), 173, workload).status == "no_slo"


def test_calibration_line_says_uncalibrated() -> None:
    assert "uncalibrated (no models[].perf)" in calibration_line("m", None, None)
    assert "admission_limit 4" in calibration_line("m", None, 4)
    assert "calibrated" in calibration_line("m", perf(slo_e2e_p95_s=10, fitted="here"), None)
    assert "uncalibrated (models[].perf is fitted but has no SLO to keep)" in calibration_line("m", perf(), None)


@pytest.mark.parametrize(
    ("kw", "says"),
    [
        ({"step_s": -1}, "greater than or equal to 0"),
        ({"per_sequence_s": 0, "per_prefill_token_s": 0}, "must be > 0"),
        ({"tail_e2e": 0.5}, "greater than or equal to 1"),
        ({"slo_e2e_p95_s": 0}, "greater than 0"),
        ({"min_admission_limit": 4, "max_admission_limit": 2}, "max_admission_limit"),
        ({"speed": 1}, "Extra inputs"),
    ],
)
def test_bad_perf_sections_are_refused(kw: dict[str, object], says: str) -> None:
    with pytest.raises(ValueError, match=says):
        perf(**kw)
