"""The compute model's closed forms (cluster/capacity/compute_model.py), min(memory, compute)
(cluster/capacity/bound.py) and the perf section: hand-checked numbers. The simulation, the knee and
the fit: tests/unit/test_engine_sim.py and test_compute_fit.py."""

from __future__ import annotations

import pytest

from cluster.capacity.bound import calibration_line, plan_admission
from cluster.capacity.compute_knee import compute_knee
from cluster.capacity.compute_model import PerfParams, Workload, bounded_limit, latency, step_time
from cluster.capacity.engine_sim import EngineLimits
from cluster.config.perf import PerfSection

TRUE = PerfParams(
    request_overhead_s=0.3, step_s=0.075, per_sequence_s=0.0085, per_prefill_token_s=0.0021, tail_e2e=1.05
)


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
    knee = compute_knee(TRUE, workload, slo_e2e_p95_s=10).concurrency
    # e2e p95 = (5.1 + 1.174·N) × 1.05, the closed form while a burst's prompts fit one step's budget:
    # 9.05 s at N = 3, 10.29 s at N = 4
    assert knee == 3
    calibrated = plan_admission(perf(slo_e2e_p95_s=10), 173, workload)
    assert (calibrated.admission_limit, calibrated.bound, calibrated.status) == (3, "compute", "calibrated")
    assert calibrated.steps()[-1] == ("admission limit", 3, "min(memory 173, compute 3) = 3 (compute binds)")
    memory = plan_admission(perf(slo_e2e_p95_s=10), 2, workload)
    assert (memory.admission_limit, memory.bound) == (2, "memory")
    assert memory.compute is not None and memory.compute.concurrency is None  # the search stops at the memory bound
    override = plan_admission(perf(slo_e2e_p95_s=10), 173, workload, slo_e2e_p95_s=20)
    assert override.admission_limit == compute_knee(TRUE, workload, slo_e2e_p95_s=20).concurrency > 3
    small = plan_admission(perf(slo_e2e_p95_s=10), 173, workload, limits=EngineLimits(256, 1))
    assert small.admission_limit < 3  # one sequence at a time and 256-token chunks: queueing
    uncalibrated = plan_admission(None, 173, workload, slo_e2e_p95_s=10)
    assert (uncalibrated.admission_limit, uncalibrated.bound, uncalibrated.status) == (173, "memory", "uncalibrated")
    assert plan_admission(perf(), 173, workload).status == "no_slo"


def test_calibration_line_says_uncalibrated() -> None:
    assert "uncalibrated (no models[].perf)" in calibration_line("m", [], None)
    assert "admission_limit 4" in calibration_line("m", [], 4)
    assert "calibrated" in calibration_line("m", [perf(slo_e2e_p95_s=10, fitted="here")], None)
    assert "uncalibrated (models[].perf is fitted but has no SLO to keep)" in calibration_line("m", [perf()], None)


def test_calibration_line_names_the_machines_its_fits_hold_for() -> None:
    fits = [perf(slo_e2e_p95_s=10, cpu="avx2", precision="float32 eager"), perf(slo_e2e_p95_s=10, cpu="amx-bf16")]
    line = calibration_line("m", fits, None)
    assert "on replicas fitted for (avx2 with float32 eager; amx-bf16 with any precision)" in line, line
    assert line.endswith("elsewhere the KV-memory bound"), line


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
