"""The engine simulation (cluster/capacity/engine_sim.py) and the knee searched on it
(cluster/capacity/compute_knee.py): hand-checked steps of vLLM's scheduler (decodes first, FCFS prompts
chunked to the token budget, max_num_seqs), the closed loop, and the knee against a brute-force scan."""

from __future__ import annotations

import pytest

from cluster.capacity.compute_knee import compute_knee, predicted_p95
from cluster.capacity.compute_model import PerfParams, Workload, latency
from cluster.capacity.engine_sim import EngineLimits, Protocol, default_limits, p95, simulate

P = PerfParams(request_overhead_s=0.5, step_s=0.1, per_sequence_s=0.01, per_prefill_token_s=0.001)
BIG = EngineLimits(100_000, 1024)


def test_one_request_is_the_closed_form() -> None:
    run = simulate(P, Workload(300, 10), BIG, 1, 1)
    assert run.ttft_s == pytest.approx((0.5 + 0.1 + 0.01 + 0.3,))  # c + t(1, 300)
    assert run.e2e_s == pytest.approx((0.91 + 9 * 0.11,))  # + (O − 1) · t(1, 0)
    assert run.steps == 10


def test_a_burst_within_the_budget_is_the_closed_forms_cohort() -> None:
    run = simulate(P, Workload(300, 10, prefix_share=0.5), BIG, 4, 4)
    closed = latency(P, Workload(300, 10, prefix_share=0.5), 4)
    assert run.ttft_s == pytest.approx((closed.ttft_s,) * 4)
    assert run.e2e_s == pytest.approx((closed.e2e_s,) * 4)


def test_prompts_beyond_the_token_budget_are_chunked_in_arrival_order() -> None:
    # three 1000-token prompts, budget 2048: step 1 prefills 1000 + 1000 + 48, step 2 decodes two and
    # prefills the last 952, step 3 decodes the third
    run = simulate(P, Workload(1000, 2), EngineLimits(2048, 128), 3, 3)
    t1 = 0.1 + 3 * 0.01 + 2048 * 0.001
    t2 = 0.1 + 3 * 0.01 + 952 * 0.001
    t3 = 0.1 + 0.01
    assert run.ttft_s == pytest.approx((0.5 + t1, 0.5 + t1, 0.5 + t1 + t2))
    assert run.e2e_s == pytest.approx((0.5 + t1 + t2, 0.5 + t1 + t2, 0.5 + t1 + t2 + t3))


def test_max_num_seqs_makes_the_rest_wait() -> None:
    run = simulate(P, Workload(100, 2), EngineLimits(2048, 1), 2, 2)
    one = 0.1 + 0.01 + 0.1  # prefill step of one sequence
    decode = 0.11
    assert run.e2e_s == pytest.approx((0.5 + one + decode, 0.5 + 2 * (one + decode)))


def test_the_closed_loop_sends_the_next_request_when_one_finishes() -> None:
    # one client, three requests: each starts after the last ends, so all take the same time
    run = simulate(P, Workload(100, 4), BIG, 1, 3)
    assert len(run.e2e_s) == 3 and run.e2e_s[0] == pytest.approx(run.e2e_s[2])
    assert run.e2e_s[0] == pytest.approx(latency(P, Workload(100, 4), 1).e2e_s)


def test_p95_interpolates_like_the_bench() -> None:
    assert p95([1.0]) == 1.0
    assert p95([float(v) for v in range(1, 101)]) == pytest.approx(95.05)


def test_limits_come_from_engine_args_else_vllm_defaults() -> None:
    assert default_limits("cpu", {}).to_dict() == {"max_num_batched_tokens": 2048, "max_num_seqs": 128}
    assert default_limits("gpu", {}, 141).max_num_batched_tokens == 8192
    assert default_limits("gpu", {}, 180).max_num_batched_tokens == 16384
    assert default_limits("gpu", {}).max_num_seqs == 256
    given = default_limits("cpu", {"max_num_batched_tokens": 4096})
    assert (given.max_num_batched_tokens, given.max_num_seqs) == (4096, 128) and "engine_args" in given.source
    with pytest.raises(ValueError, match="max_num_batched_tokens >= max_num_seqs"):
        EngineLimits(64, 128)
    assert Protocol().requests(10) == 40 and Protocol(96, 0).requests(10) == 96


FITTED = PerfParams(0.045, 0.048, 0.0021, 0.00041, tail_e2e=1.05)  # the 2-core machine's order of magnitude


@pytest.mark.parametrize(("prompt", "output"), [(310, 64), (480, 24), (180, 48), (2000, 16)])
def test_the_knee_is_the_last_n_before_the_slo_breaks(prompt: int, output: int) -> None:
    workload = Workload(prompt, output)
    limits, protocol = EngineLimits(), Protocol()
    scan = next(n for n in range(1, 200) if predicted_p95(FITTED, workload, limits, protocol, n)["e2e"] > 10)
    knee = compute_knee(FITTED, workload, slo_e2e_p95_s=10)
    assert knee.concurrency == scan - 1
    rows = {label: (value, how) for label, value, how in knee.steps}
    assert rows[f"e2e p95 at N={scan - 1} (s)"][1].endswith("≤ SLO 10 s")
    assert rows[f"e2e p95 at N={scan} (s)"][1].endswith("> SLO 10 s")
    assert rows["compute bound"][0] == scan - 1


def test_chunked_bursts_lower_the_knee_below_the_closed_form() -> None:
    # 480-token prompts: a burst of 20 is 9600 tokens, five steps of the 2048-token budget
    workload = Workload(480, 24)
    closed = max(n for n in range(1, 200) if latency(FITTED, workload, n).e2e_s * 1.05 <= 10)
    assert compute_knee(FITTED, workload, slo_e2e_p95_s=10).concurrency < closed


def test_both_slos_the_tighter_binds_and_an_slo_no_request_meets_is_zero() -> None:
    knee = compute_knee(FITTED, Workload(310, 64), slo_e2e_p95_s=10, slo_ttft_p95_s=1.0)
    e2e_only = compute_knee(FITTED, Workload(310, 64), slo_e2e_p95_s=10)
    assert knee.metric == "ttft" and knee.concurrency is not None and knee.concurrency < (e2e_only.concurrency or 0)
    assert compute_knee(FITTED, Workload(310, 64), slo_e2e_p95_s=1).concurrency == 0
    with pytest.raises(ValueError, match="needs an SLO"):
        compute_knee(FITTED, Workload(310, 64))
    with pytest.raises(ValueError, match="finite number"):
        compute_knee(FITTED, Workload(310, 64), slo_e2e_p95_s=float("nan"))


def test_a_ceiling_within_the_slo_means_compute_does_not_bind() -> None:
    knee = compute_knee(FITTED, Workload(310, 64), slo_e2e_p95_s=10, ceiling=5)
    assert knee.concurrency is None
    assert "compute does not bind" in knee.steps[-1][2]
